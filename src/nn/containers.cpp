// Containers: Sequential, Residual and Parallel (transparent: their children are the layer calls),
// and Lambda.
#include "remat/nn/containers.h"

#include "remat/checkpoint.h"
#include "remat/ops.h"

namespace remat::nn {

// ---- Sequential

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) {
  set_transparent();
  for (const auto& m : modules) add(m);
}

Sequential& Sequential::add(std::shared_ptr<Module> module, const std::string& name, std::optional<Policy> policy) {
  std::string child = name.empty() ? std::to_string(layers_.size()) : name;
  add_child(child, module);  // validates the name and the pointer
  layers_.push_back(std::move(module));
  layer_policies_.push_back(std::move(policy));
  return *this;
}

std::string Sequential::type_name() const { return detail::concat("Sequential(", layers_.size(), ")"); }

Tensor Sequential::forward_impl(const Tensor& x) {
  Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    TensorList out = call_child(*layers_[i], {h}, layer_policies_[i]);
    REMAT_CHECK(out.size() == 1, type_name(), ": child ", i, " (", layers_[i]->type_name(), ") returned ", out.size(),
                " outputs; a Sequential passes one tensor from child to child");
    h = out[0];
  }
  return h;
}

// ---- Residual

Residual::Residual(std::shared_ptr<Module> fn) : fn_(fn) {
  set_transparent();
  add_child("fn", std::move(fn));
}

Tensor Residual::forward_impl(const Tensor& x) {
  Tensor y = fn_->forward(x);
  REMAT_CHECK(y.defined() && y.shape() == x.shape(), "Residual: ", fn_->type_name(), " maps ", shape_str(x.shape()),
              " to ", y.defined() ? shape_str(y.shape()) : "an undefined tensor", "; x + fn(x) needs equal shapes");
  return add(x, y);
}

// ---- Parallel

Parallel::Parallel(std::initializer_list<std::shared_ptr<Module>> modules) {
  set_transparent();
  for (const auto& m : modules) add(m);
}

Parallel& Parallel::add(std::shared_ptr<Module> module, const std::string& name) {
  add_child(name.empty() ? std::to_string(branches_.size()) : name, module);
  branches_.push_back(std::move(module));
  return *this;
}

Tensor Parallel::forward_impl(const Tensor& x) {
  REMAT_CHECK(!branches_.empty(), "Parallel: no branches");
  TensorList outputs;
  outputs.reserve(branches_.size());
  for (auto& b : branches_) outputs.push_back(b->forward(x));
  return outputs.size() == 1 ? outputs[0] : concat(outputs, -1);
}

// ---- Lambda

Lambda::Lambda(std::function<Tensor(const Tensor&)> fn, std::string name) : fn_(std::move(fn)), name_(std::move(name)) {
  REMAT_CHECK(static_cast<bool>(fn_), "Lambda: the function is empty");
}

Tensor Lambda::forward_impl(const Tensor& x) { return fn_(x); }

}  // namespace remat::nn
