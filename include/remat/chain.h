// remat/chain.h - Chain: a list of layer functions, each child a checkpoint region under the policy.
//
//   remat::Chain model;
//   for (int i = 0; i < 16; ++i)
//     model.add([&, i](const Tensor& h) { return blocks[i](h); }, "block" + std::to_string(i));
//   remat::ScopedPolicy policy(remat::Policy::parse("every-layer"));   // the default anyway
//   Tensor loss = remat::mean(model.forward(x));   // 16 regions; only their inputs are kept
//   loss.backward();                               // each block re-run once in the backward
//
//   model.set_policy(remat::Policy::parse("budget:32MiB"));   // the planner chooses what to keep
//   model.add(head, "head", remat::Policy::save_all());        // a child's own policy
//
// For code that is not an nn::Module: a Chain's call is transparent and each child's call is a
// layer call (remat/call.h), so under the policy in force every child is a checkpoint region
// (remat/checkpoint.h), every-k:K groups K children into one region, and budget:BYTES plans over
// the children with the Chain's planner (remat/budget.h). A policy resolves child first, then
// the Chain's own, then the scoped default (remat/policy.h).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "remat/budget.h"
#include "remat/policy.h"
#include "remat/tensor.h"

namespace remat {

class Chain {
 public:
  using Layer = std::function<Tensor(const Tensor&)>;
  // policy: a per-layer override for this child alone.
  Chain& add(Layer layer, std::string name = "", std::optional<Policy> policy = std::nullopt);
  // A per-container override for all children (a child's own override still wins).
  Chain& set_policy(std::optional<Policy> policy);
  const std::optional<Policy>& policy() const { return policy_; }
  Tensor forward(const Tensor& x) const;
  Tensor operator()(const Tensor& x) const { return forward(x); }
  // The planner state used under budget:BYTES (profile, plan). A Chain rebuilt on every call
  // passes the same planner each time so the plan is kept.
  Chain& set_planner(std::shared_ptr<BudgetPlanner> planner);
  const std::shared_ptr<BudgetPlanner>& planner() const;
  size_t size() const { return layers_.size(); }
  const std::string& name(size_t i) const { return names_.at(i); }

 private:
  std::vector<Layer> layers_;
  std::vector<std::string> names_;
  std::vector<std::optional<Policy>> layer_policies_;
  std::optional<Policy> policy_;
  mutable std::shared_ptr<BudgetPlanner> planner_;
};

}  // namespace remat
