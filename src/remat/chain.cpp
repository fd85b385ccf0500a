// Chain: the container whose children become checkpoint regions under the policy, so a model
// written once is checkpointed without wrapping anything (the seed user's container rewrite,
// done once here). Under budget:BYTES it profiles, plans (remat/schedule.h) and runs the plan.
#include <chrono>

#include "remat/budget_internal.h"
#include "remat/checkpoint.h"
#include "remat/memory.h"

namespace remat {

Chain& Chain::add(Layer layer, std::string name, std::optional<Policy> policy) {
  REMAT_CHECK(static_cast<bool>(layer), "Chain::add: the layer function is empty");
  if (name.empty()) name = std::to_string(layers_.size());
  layers_.push_back(std::move(layer));
  names_.push_back(std::move(name));
  layer_policies_.push_back(std::move(policy));
  return *this;
}

Chain& Chain::set_policy(std::optional<Policy> policy) {
  policy_ = std::move(policy);
  return *this;
}

Chain& Chain::set_planner(std::shared_ptr<BudgetPlanner> planner) {
  planner_ = std::move(planner);
  return *this;
}

const std::shared_ptr<BudgetPlanner>& Chain::planner() const {
  if (!planner_) planner_ = std::make_shared<BudgetPlanner>();
  return planner_;
}

namespace {

using Layers = std::vector<Chain::Layer>;

// Runs a plan tree over `layers`: a stage with recording, a region as a checkpoint region whose
// re-run follows its children.
Tensor run_plan(const std::vector<schedule::PlanNode>& nodes, const std::shared_ptr<const Layers>& layers,
                Tensor h) {
  for (const auto& node : nodes) {
    if (node.kind == schedule::PlanNode::Kind::stage) {
      ScopedPolicy record_all(Policy::save_all());
      h = (*layers)[static_cast<size_t>(node.first)](h);
      continue;
    }
    auto children = std::make_shared<const std::vector<schedule::PlanNode>>(node.children);
    std::string label = "R[" + std::to_string(node.first) + ".." + std::to_string(node.last) + "]";
    h = checkpoint([children, layers](const Tensor& in) { return run_plan(*children, layers, in); }, h,
                   {Policy::every_layer(), label, nullptr});
  }
  return h;
}

}  // namespace

Tensor Chain::forward(const Tensor& x) const {
  const Policy container = policy_.value_or(current_policy());
  if (container.kind == Policy::Kind::budget && grad_enabled() && !layers_.empty()) {
    BudgetPlanner::State& st = planner()->state();
    auto layers = std::make_shared<const Layers>(layers_);
    bool planned = st.report && st.report->input_shape == x.shape() && st.report->budget_bytes == container.budget_bytes;
    if (!planned && st.profiling && st.shape == x.shape() && st.profile_complete() &&
        st.profile_runs >= BudgetPlanner::kProfilingSteps) {
      schedule::ChainCosts costs = st.measured_costs();
      size_t outside = st.measured_outside_bytes();
      size_t limit = container.budget_bytes > outside ? container.budget_bytes - outside : 0;
      BudgetPlanner::Report report;
      report.input_shape = x.shape();
      report.budget_bytes = container.budget_bytes;
      report.outside_bytes = outside;
      report.chain_limit_bytes = limit;
      report.costs = costs;
      try {
        report.plan = schedule::plan_rotor(costs, limit);
      } catch (const schedule::InfeasibleError& e) {
        size_t smallest = e.min_feasible_bytes + outside;
        throw Error(detail::concat("budget policy: ", container.to_string(), " (",
                                   memory::format_bytes(static_cast<double>(container.budget_bytes)),
                                   ") is below the smallest feasible budget for this chain and input ",
                                   shape_str(x.shape()), ": ", smallest, " bytes (",
                                   memory::format_bytes(static_cast<double>(smallest)), "; the chain needs ",
                                   e.min_feasible_bytes, " bytes and ", outside,
                                   " bytes are saved outside it)"));
      }
      report.tree = schedule::format_tree(report.plan.tree);
      report.predicted_peak_bytes = report.plan.predicted_peak_bytes + outside;
      report.predicted_seconds = report.plan.predicted_time;
      for (const auto& p : st.profiles)
        report.profiled_chain_seconds += p->forward_seconds + p->recompute_seconds + p->backward_seconds;
      st.costs = costs;
      st.report = std::move(report);  // the profile is kept: another budget re-plans from it
      planned = true;
    }
    if (planned) return run_plan(st.report->plan.tree, layers, x);
    // Profile: every child its own region, timed and measured.
    st.profile_runs = st.profiling && st.shape == x.shape() ? st.profile_runs + 1 : 1;
    st.profiling = true;
    st.shape = x.shape();
    st.report.reset();
    st.profiles.clear();
    st.saved_live_at_entry = memory::live_bytes(memory::Tag::saved);
    st.saved_peak_at_entry = memory::peak_bytes(memory::Tag::saved);
    Tensor h = x;
    for (size_t i = 0; i < layers_.size(); ++i) {
      auto profile = std::make_shared<RegionProfile>();
      st.profiles.push_back(profile);
      Layer layer = layers_[i];
      // inside the child everything is recorded on re-run, as for a stage of the plan
      h = checkpoint(
          [layer](const Tensor& in) {
            ScopedPolicy record_all(Policy::save_all());
            return layer(in);
          },
          h, {Policy::every_layer(), names_[i], profile});
    }
    return h;
  }
  REMAT_CHECK(container.kind != Policy::Kind::budget || !grad_enabled(), "Chain: policy ", container.to_string(),
              " applies to a non-empty chain");
  Tensor h = x;
  size_t i = 0;
  while (i < layers_.size()) {
    Policy policy = layer_policies_[i].value_or(container);
    if (policy.kind == Policy::Kind::budget) policy = Policy::save_all();  // no gradient: plain calls
    if (policy.kind == Policy::Kind::every_k && policy.k > 1 && !layer_policies_[i]) {
      // a segment of up to K consecutive children without their own override
      size_t end = i;
      while (end < layers_.size() && end - i < static_cast<size_t>(policy.k) && !layer_policies_[end]) ++end;
      std::vector<Layer> segment(layers_.begin() + static_cast<std::ptrdiff_t>(i),
                                 layers_.begin() + static_cast<std::ptrdiff_t>(end));
      std::string label = names_[i] + ".." + names_[end - 1];
      h = checkpoint(
          [segment](const Tensor& in) {
            Tensor t = in;
            for (const auto& layer : segment) t = layer(t);
            return t;
          },
          h, {policy, label, nullptr});
      i = end;
      continue;
    }
    Layer layer = layers_[i];  // copied: the region may re-run it after this call returns
    h = checkpoint([layer](const Tensor& in) { return layer(in); }, h, {policy, names_[i], nullptr});
    ++i;
  }
  return h;
}

}  // namespace remat
