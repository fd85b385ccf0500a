// remat/nn/containers.h - Sequential, Residual, Parallel and Lambda.
//
//   auto body = std::make_shared<remat::nn::Sequential>();
//   for (int i = 0; i < 12; ++i) body->add(std::make_shared<remat::nn::TransformerBlock>(768, 12));
//   Tensor y = body->forward(x);     // under every-layer (the default) each block is a region
//
// Sequential runs its children through a remat::Chain, so under the policy in force every child
// is a checkpoint region (every-layer: the blocks' internals are recomputed in the backward
// pass; every-k:K: segments of K children; save-all: plain calls). set_policy() overrides the
// policy for this container, and add(module, name, policy) for one child. The regions re-run a
// child during the backward pass, which is why the Chain holds each child by shared_ptr.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "remat/nn/module.h"
#include "remat/budget.h"
#include "remat/policy.h"

namespace remat::nn {

class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  // Appends a child named `name` ("0", "1", ... by position when empty), with an optional
  // policy for it alone.
  Sequential& add(std::shared_ptr<Module> module, const std::string& name = "",
                  std::optional<Policy> policy = std::nullopt);
  // A per-container policy override (a child's own override still wins); nullopt removes it.
  Sequential& set_policy(std::optional<Policy> policy);
  const std::optional<Policy>& policy() const { return policy_; }
  // The budget planner kept across calls (profile and plan under budget:BYTES).
  const std::shared_ptr<BudgetPlanner>& planner() const { return planner_; }
  size_t size() const { return layers_.size(); }
  const std::shared_ptr<Module>& operator[](size_t i) const { return layers_.at(i); }
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override;

 private:
  std::vector<std::shared_ptr<Module>> layers_;
  std::vector<std::string> names_;
  std::vector<std::optional<Policy>> layer_policies_;
  std::optional<Policy> policy_;
  std::shared_ptr<BudgetPlanner> planner_ = std::make_shared<BudgetPlanner>();
};

// x + fn(x); the child is named "fn".
class Residual : public Module {
 public:
  explicit Residual(std::shared_ptr<Module> fn);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Residual"; }
  const std::shared_ptr<Module>& fn() const { return fn_; }

 private:
  std::shared_ptr<Module> fn_;
};

// Every child applied to the same input; the outputs concatenated along the last axis.
class Parallel : public Module {
 public:
  Parallel() = default;
  Parallel(std::initializer_list<std::shared_ptr<Module>> modules);
  Parallel& add(std::shared_ptr<Module> module, const std::string& name = "");
  size_t size() const { return branches_.size(); }
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Parallel"; }

 private:
  std::vector<std::shared_ptr<Module>> branches_;
};

// A parameter-free function as a module (it must be deterministic apart from remat's RNG, since
// a region may re-run it). Parameters it captures get gradients but are not listed by
// named_parameters(); register them in a Module to have them listed and saved.
class Lambda : public Module {
 public:
  explicit Lambda(std::function<Tensor(const Tensor&)> fn, std::string name = "Lambda");
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return name_; }

 private:
  std::function<Tensor(const Tensor&)> fn_;
  std::string name_;
};

}  // namespace remat::nn
