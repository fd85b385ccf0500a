// Internal: the state a BudgetPlanner keeps between steps.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "remat/budget.h"

namespace remat {

struct BudgetPlanner::State {
  // profiling of `shape` in progress (its backward may not have run yet)
  bool profiling = false;
  int profile_runs = 0;  // profiling steps run for `shape` (the first one warms up caches and JIT kernels)
  Shape shape;
  std::vector<std::shared_ptr<RegionProfile>> profiles;
  size_t saved_live_at_entry = 0, saved_peak_at_entry = 0;
  // the plan for report->input_shape
  std::optional<Report> report;
  std::optional<schedule::ChainCosts> costs;

  bool profile_complete() const;
  schedule::ChainCosts measured_costs() const;
  size_t measured_outside_bytes() const;
};

}  // namespace remat
