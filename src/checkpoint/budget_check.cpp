// A budget's measured peak, compared with it at every step.
//
// Note [a budget compared at every step]. A plan predicts the peak of saved bytes of the step it
// was made for, and tests hold it there; but a step may differ from the plan's (a router picked
// other layers, the shapes changed and the new ones are being profiled under every-layer, the
// model keeps values the profile did not see, a second backward runs through a retained graph).
// So a budget is not taken on trust: every plan scope restarts its device's window of peaks
// (memory::Allocator::start_window) and the end of every outermost backward pass after it reads
// the window's peak of saved bytes, which covers the whole step as the budget does (what was
// saved before the scope included). A peak above the budget is counted (remat::counters().budget:
// how many steps, by how much at most) and warned of, once per plan scope, shape and budget, with
// what the step was doing. A budget:auto step before its first plan has no budget yet and is not
// compared. Later backward passes through the same graph (retain_graph) are compared too, until
// the next plan scope starts.
#include <set>

#include "budget_internal.h"
#include "remat/backend.h"
#include "remat/checkpoint.h"
#include "remat/memory.h"

namespace remat::detail {

namespace {

struct PendingCheck {
  std::shared_ptr<BudgetPlanner> planner;
  Policy budget;
  std::string scope, inputs;
  Device device;
  bool profiling = false;
  bool compared = false;      // the step was counted
  size_t reported_peak = 0;   // the most this step's passes were reported at
};

thread_local std::optional<PendingCheck> pending;

}  // namespace

BudgetCounters& budget_counters() {
  thread_local BudgetCounters counters;
  return counters;
}

std::string stage_key(const std::string& label, const TensorList& inputs) {
  std::string key = label + "(";
  for (const Tensor& t : inputs)
    key += std::string(dtype_name(t.dtype())) + shape_str(t.shape()) + (t.requires_grad() ? "g" : "") + ",";
  return key + ")";
}

void begin_budget_check(const std::shared_ptr<BudgetPlanner>& planner, const Policy& budget, const std::string& scope,
                        const std::vector<Shape>& shapes, Device device) {
  PendingCheck check;
  check.planner = planner;
  check.budget = budget;
  check.scope = scope;
  for (const Shape& s : shapes) check.inputs += (check.inputs.empty() ? "" : ", ") + shape_str(s);
  check.device = device;
  check.profiling = !planner->state().planned_for(shapes, budget);
  pending = std::move(check);
  backend(device).allocator().start_window();
}

void check_budget() {
  if (!pending) return;
  PendingCheck& check = *pending;
  const BudgetPlanner::State& st = check.planner->state();
  const bool planned = !check.profiling && st.report.has_value();
  const size_t budget = check.budget.keep.budget_auto ? (planned ? st.report->budget_bytes : 0) : check.budget.keep.budget_bytes;
  if (budget == 0) return;  // budget:auto, not derived yet
  const size_t peak = backend(check.device).allocator().window_peak(memory::Tag::saved);
  BudgetCounters& counters = budget_counters();
  if (!check.compared) {
    check.compared = true;
    ++counters.steps;
  }
  counters.last_peak_bytes = peak;
  counters.last_budget_bytes = budget;
  if (peak <= budget || peak <= check.reported_peak) return;
  if (check.reported_peak <= budget) ++counters.steps_over;
  check.reported_peak = peak;
  counters.most_over_bytes = std::max(counters.most_over_bytes, peak - budget);
  thread_local std::set<std::string> warned;
  if (!warned.insert(check.scope + "|" + check.inputs + "|" + check.budget.to_string()).second) return;
  const std::string why =
      check.profiling ? "while its layer calls were profiled for these input shapes (every layer call a region of its "
                        "own; a budget below every-layer's peak is met only once the plan runs)"
      : st.stale     ? "under a plan made for other layer calls than the step made (the next step profiles them)"
                     : concat("under its plan, which predicted ", st.report->predicted_peak_bytes,
                              " bytes: the step kept values the plan did not see (a retained graph run backward again, "
                              "values the model keeps)");
  warn(concat("budget policy ", check.budget.to_string(), ": a step of ", check.scope, " with input ", check.inputs,
              " held ", peak, " bytes (", memory::format_bytes(static_cast<double>(peak)), ") of saved values at its peak, ",
              peak - budget, " bytes above the budget, ", why, "; remat::counters().budget counts such steps"));
}

}  // namespace remat::detail
