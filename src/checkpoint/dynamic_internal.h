// Internal: the dynamic rematerialization runtime's pieces shared with the policy and counters.
#pragma once

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

}  // namespace remat::detail
