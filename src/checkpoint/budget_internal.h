// Internal: the state a BudgetPlanner keeps between steps, and how a plan is made from it.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "remat/autodiff.h"
#include "remat/budget.h"
#include "remat/offload.h"
#include "remat/policy.h"

namespace remat {

struct BudgetPlanner::State {
  // profiling of `signature` in progress (its backward may not have run yet)
  bool profiling = false;
  int profile_runs = 0;  // profiling steps run for `signature` (the first one warms up caches and JIT kernels)
  std::vector<Shape> signature;
  Device device = kCpu;  // where the profiled values live
  std::vector<std::shared_ptr<RegionProfile>> profiles;  // one per stage (layer call), in order
  std::vector<std::string> stage_labels;
  size_t saved_live_at_entry = 0, saved_peak_at_entry = 0;
  // profiling, per layer call: autodiff::next_sequence_nr() when it began and ended, and its
  // inputs (storages, gradient edges); the last call's outputs (Note [what a sweep keeps] in budget.cpp)
  struct ProfiledCall {
    uint64_t start = 0, end = 0;
    std::vector<std::weak_ptr<Storage>> input_storages;
    std::vector<std::pair<std::weak_ptr<autodiff::Node>, uint32_t>> input_edges;
  };
  std::vector<ProfiledCall> calls;
  std::vector<std::weak_ptr<Storage>> last_outputs;
  void measure_sweep_kept(RegionProfile& profile, const TensorList& inputs) const;
  void profile_call_start(RegionProfile& profile, const TensorList& inputs);
  void profile_call_end(const TensorList& outputs);
  // the plan for report->signature
  std::optional<Report> report;
  std::optional<schedule::ChainCosts> costs;
  // where the backward of report->plan starts reading each offloaded node back (budget.cpp)
  std::shared_ptr<const detail::OffloadReadPlan> read_plan;
  schedule::ChainPlanOptions options;  // how plans are made (BudgetPlanner::set_options)
  bool stale = false;  // the last planned run met a different number of layer calls: profile again

  bool profile_complete() const;
  schedule::ChainCosts measured_costs() const;
  // saved before the chain (live through it) and after it (up to the loss; counted with a_L):
  // Note [saved bytes outside the chain] in budget.cpp
  size_t measured_outside_bytes() const;
  size_t measured_after_chain_bytes() const;
  // per stage, the bytes its record shares with its output a_{i+1} (Note [records that keep their
  // outputs] in budget.cpp)
  std::vector<size_t> measured_saved_output_bytes(const schedule::ChainCosts& c) const;

  // Is the plan in force for these input shapes and this budget?
  bool planned_for(const std::vector<Shape>& shapes, const Policy& budget) const;
  // Is a finished profile of these shapes kept, so that a plan can be made now?
  bool can_plan(const std::vector<Shape>& shapes) const;
  // Makes the plan from the kept profile; a budget below the smallest feasible one is a
  // remat::Error naming that budget. `scope` names the plan scope in messages.
  void make_plan(const Policy& budget, const std::vector<Shape>& shapes, const std::string& scope);
  // budget:auto: fills the report's budget and what it was derived from (remat/budget.h).
  void derive_budget(const Policy& budget, Report& r) const;
  // Starts (or continues) profiling these shapes: the next layer calls are measured stages.
  void start_profiling(const std::vector<Shape>& shapes, Device device);
};

}  // namespace remat
