// The budget planner's state and its cost model (see include/remat/budget.h).
#include "remat/budget.h"

#include "remat/budget_internal.h"

namespace remat {

BudgetPlanner::BudgetPlanner() : state_(std::make_unique<State>()) {}
BudgetPlanner::~BudgetPlanner() = default;

std::optional<BudgetPlanner::Report> BudgetPlanner::report() const { return state_->report; }
std::optional<schedule::ChainCosts> BudgetPlanner::costs() const { return state_->costs; }

bool BudgetPlanner::State::profile_complete() const {
  if (!profiling || profiles.empty()) return false;
  for (const auto& p : profiles)
    if (!p->backward_done) return false;
  return true;
}

schedule::ChainCosts BudgetPlanner::State::measured_costs() const {
  schedule::ChainCosts c;
  for (const auto& p : profiles) {
    c.forward_time.push_back(p->forward_seconds);
    c.backward_time.push_back(p->backward_seconds);
    c.boundary_bytes.push_back(p->boundary_bytes);
    c.saved_bytes.push_back(p->saved_bytes);
  }
  c.boundary_bytes.push_back(profiles.back()->output_bytes);
  return c;
}

size_t BudgetPlanner::State::measured_outside_bytes() const {
  // Before the chain: what was saved when it started. After it (up to the loss): the step's saved
  // peak when the backward reached the chain, beyond what was live at entry plus the chain's own
  // boundaries, if that peak was reached during this step.
  size_t boundaries = 0;
  for (const auto& p : profiles) boundaries += p->boundary_bytes;
  const RegionProfile& last = *profiles.back();
  size_t after = 0;
  if (last.saved_peak_at_backward > saved_peak_at_entry &&
      last.saved_peak_at_backward > saved_live_at_entry + boundaries)
    after = last.saved_peak_at_backward - saved_live_at_entry - boundaries;
  return saved_live_at_entry + after;
}

}  // namespace remat
