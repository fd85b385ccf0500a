// Internal: the dynamic rematerialization runtime's pieces shared with the policy, the counters
// and dynamic_feasible_range (src/checkpoint).
#pragma once

#include <cstddef>
#include <memory>

#include "remat/dynamic.h"

namespace remat::detail {

struct Cell;
class DynamicRuntime;

// What the saved-value hooks keep for a packed storage: while one exists, the cell is "saved".
struct SavedHandle {
  explicit SavedHandle(std::shared_ptr<Cell> cell);
  ~SavedHandle();
  SavedHandle(const SavedHandle&) = delete;
  SavedHandle& operator=(const SavedHandle&) = delete;
  std::shared_ptr<Cell> cell;
};

DynamicCounters& dynamic_counters();
// The smallest budget dynamic_feasible_range measured on this thread (0: none yet), which an
// infeasible budget's error names.
size_t& measured_smallest_budget();

}  // namespace remat::detail
