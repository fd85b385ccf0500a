// remat/nn/containers.h - Sequential, Residual, Parallel and Lambda.
//
//   auto body = std::make_shared<remat::nn::Sequential>();
//   for (int i = 0; i < 12; ++i) body->add(std::make_shared<remat::nn::TransformerBlock>(64, 4));
//   Tensor y = body->forward(x);     // under every-layer (the default) each block is a region
//
// Sequential, Residual and Parallel are transparent (remat/nn/module.h): they only route data, so
// their own calls are never regions and the calls they make are layer calls wherever the
// container itself is called where a layer would be: the children of a Sequential are the layers
// (every-layer: one region each; every-k:K: groups of K children; save-all: plain calls), the
// function of a Residual is one, and so is each branch of a Parallel. set_policy() sets the policy
// for the container's children (a child's own policy still wins), and Sequential::add(module,
// name, policy) a policy for one child slot. A region calls its module again in the backward
// pass, which is why containers hold their children by shared_ptr.
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
  Sequential() { set_transparent(); }
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  // Appends a child named `name` ("0", "1", ... by position when empty), with an optional
  // policy for it alone.
  Sequential& add(std::shared_ptr<Module> module, const std::string& name = "",
                  std::optional<Policy> policy = std::nullopt);
  size_t size() const { return layers_.size(); }
  const std::shared_ptr<Module>& operator[](size_t i) const { return layers_.at(i); }
  std::string type_name() const override;

 protected:
  Tensor forward_impl(const Tensor& x) override;

 private:
  std::vector<std::shared_ptr<Module>> layers_;
  std::vector<std::optional<Policy>> layer_policies_;
};

// x + fn(x); the child is named "fn".
class Residual : public Module {
 public:
  explicit Residual(std::shared_ptr<Module> fn);
  std::string type_name() const override { return "Residual"; }
  const std::shared_ptr<Module>& fn() const { return fn_; }

 protected:
  Tensor forward_impl(const Tensor& x) override;

 private:
  std::shared_ptr<Module> fn_;
};

// Every child applied to the same input; the outputs concatenated along the last axis.
class Parallel : public Module {
 public:
  Parallel() { set_transparent(); }
  Parallel(std::initializer_list<std::shared_ptr<Module>> modules);
  Parallel& add(std::shared_ptr<Module> module, const std::string& name = "");
  size_t size() const { return branches_.size(); }
  std::string type_name() const override { return "Parallel"; }

 protected:
  Tensor forward_impl(const Tensor& x) override;

 private:
  std::vector<std::shared_ptr<Module>> branches_;
};

// A parameter-free function as a module (it must be deterministic apart from remat's RNG, since
// a region may re-run it). Parameters it captures get gradients but are not listed by
// named_parameters(); register them in a Module to have them listed and saved.
class Lambda : public Module {
 public:
  explicit Lambda(std::function<Tensor(const Tensor&)> fn, std::string name = "Lambda");
  std::string type_name() const override { return name_; }

 protected:
  Tensor forward_impl(const Tensor& x) override;

 private:
  std::function<Tensor(const Tensor&)> fn_;
  std::string name_;
};

}  // namespace remat::nn
