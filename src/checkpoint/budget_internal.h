// Internal: the state a BudgetPlanner keeps between steps, and how a plan is made from it.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "remat/autodiff.h"
#include "remat/budget.h"
#include "remat/counters.h"
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
  // Note [what a plan is for]: each profiled stage's key (stage_key), and the plan in force's
  std::vector<std::string> stage_keys, planned_keys;
  // plans made before, for other input shapes, most recent last (at most kCachedPlans)
  struct Cached {
    std::vector<Shape> signature;
    std::string policy, target;
    std::vector<std::string> keys;
    Report report;
    schedule::ChainCosts costs;
    std::shared_ptr<const detail::OffloadReadPlan> read_plan;
  };
  static constexpr size_t kCachedPlans = 8;
  std::vector<Cached> cache;
  // Puts the plan in force for these shapes and this budget from the cache, if one is kept there.
  bool restore_plan(const std::vector<Shape>& shapes, const Policy& budget);
  // Forgets the plan in force (its stages were not the calls met) and its cached copy.
  void drop_plan();
  size_t saved_live_at_entry = 0, saved_peak_at_entry = 0;
  // profiling: what the ops between layer calls read, and who made it (Note [what a sweep keeps]
  // in budget.cpp): the calls met so far; per storage a call took as its input, the latest such
  // call; the last call's outputs; per storage seen, the call that made it (-1: none of the scope's
  // ops) and its value index; the reads since the last call
  int profiled_calls = 0;
  std::unordered_map<const Storage*, std::pair<std::weak_ptr<Storage>, int>> last_input_of;
  struct Known {
    std::weak_ptr<Storage> storage;
    int made_by = -1;
    int value = 0;
  };
  struct Read {
    std::weak_ptr<Storage> storage;
    int made_by = -1, value = 0;
    size_t bytes = 0;
  };
  class SweepWatch;
  std::vector<std::weak_ptr<Storage>> last_outputs;
  std::unordered_map<const Storage*, Known> known;
  std::vector<Read> reads;
  int next_value = 0;
  bool in_call = false;  // a profiled layer call runs
  // An op listener noting what the scope's ops make and read, installed until it is destroyed
  // (while a profiling step's forward runs).
  std::shared_ptr<autodiff::OpListener> watch_sweeps();
  Known* known_of(const Tensor& t);  // null: not a saved-value candidate (a parameter, a gradient)
  void note_made(const Tensor& t, int by);
  void note_read(const Tensor& t);
  // what the ops since the last call save (value, bytes): the next stage's ChainCosts::gap_saved
  std::vector<std::pair<int, size_t>> gap_saves;
  void note_gap_saved(const Tensor& t);
  std::vector<int> after_chain_saves;  // the values the ops after the last call saved
  void measure_sweep_kept(RegionProfile& profile) const;
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
  // measured, counted as the allocator counts saved bytes (Note [plans within the allocator's
  // count] in budget.cpp): boundaries while held, a record's output once, what sweeps keep
  schedule::ChainCosts held_costs(const schedule::ChainCosts& measured) const;

  // Is the plan in force for these input shapes and this budget?
  bool planned_for(const std::vector<Shape>& shapes, const Policy& budget) const;
  // Is a finished profile of these shapes kept, so that a plan can be made now?
  bool can_plan(const std::vector<Shape>& shapes) const;
  // Makes the plan from the kept profile; a budget below the smallest feasible one is a
  // remat::Error naming that budget. `scope` names the plan scope in messages.
  void make_plan(const Policy& budget, const std::vector<Shape>& shapes, const std::string& scope);
  // The plan make_plan would put in force, made without putting it in force.
  Report plan_report(const Policy& budget, const std::vector<Shape>& shapes, const std::string& scope) const;
  void price_offload(const OffloadTarget& target, schedule::ChainCosts& measured, Report& r) const;
  // budget:auto: fills the report's budget and what it was derived from (remat/budget.h).
  void derive_budget(const Policy& budget, Report& r) const;
  // Starts (or continues) profiling these shapes: the next layer calls are measured stages.
  void start_profiling(const std::vector<Shape>& shapes, Device device);
};

namespace detail {

// A layer call's key: its label and its inputs' shapes and dtypes (Note [what a plan is for]).
std::string stage_key(const std::string& label, const TensorList& inputs);

// Note [a budget compared at every step] (budget_check.cpp). Starts the check of a plan scope's
// step (restarting its device's window of peaks); the end of each outermost backward pass that
// follows compares the window's peak of saved bytes with the budget (check_budget).
void begin_budget_check(const std::shared_ptr<BudgetPlanner>& planner, const Policy& budget, const std::string& scope,
                        const std::vector<Shape>& shapes, Device device);
void check_budget();
BudgetCounters& budget_counters();

}  // namespace detail

}  // namespace remat
