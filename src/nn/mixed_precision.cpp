// Mixed precision for a module tree: float32 master weights, a compute copy of each per step
// (Module::set_compute_dtype in remat/nn/module.h).
//
// Note [Compute copies]. Under set_compute_dtype(bf16) every module of the tree shares one
// ComputeCopies. A call of a module that is not inside another call (the step's forward) first
// replaces its contents: for each parameter of the called module's tree (each tensor once, so a
// tied weight has one copy) one conversion to the compute dtype, recorded on the tape like any
// op, whose backward converts the copy's summed gradient back to the master's dtype and
// accumulates it into the master's .grad. Layers read their weights through compute_weight(),
// which returns the copy. The copies are made outside every checkpoint region, so a region
// captures them as it captures parameters: its recomputation in the backward pass reads the same
// tensors, bit for bit, that its forward read, and the policies' gradients stay those of
// save-all. A recomputation (is_recomputing()) never replaces them. The copies are the weights
// of the step, as the masters are: their storage is counted as parameter memory, not as saved
// values. They live until the next step's forward replaces them.
#include <unordered_map>

#include "remat/checkpoint.h"
#include "remat/nn/module.h"

namespace remat::nn {

struct Module::ComputeCopies {
  DType dtype = DType::bf16;
  std::unordered_map<const Storage*, Tensor> copies;  // by the master's storage
};

Module& Module::set_compute_dtype(std::optional<DType> dtype) {
  REMAT_CHECK(!dtype || is_16bit_float(*dtype), type_name(), ": set_compute_dtype takes bf16 or f16 (or nullopt), got ",
              dtype ? dtype_name(*dtype) : "");
  std::shared_ptr<ComputeCopies> shared;
  if (dtype) {
    shared = std::make_shared<ComputeCopies>();
    shared->dtype = *dtype;
  }
  for (const auto& [name, module] : walk(/*once=*/true)) const_cast<Module*>(module)->compute_copies_ = shared;
  return *this;
}

std::optional<DType> Module::compute_dtype() const {
  if (!compute_copies_) return std::nullopt;
  return compute_copies_->dtype;
}

void Module::refresh_compute_copies() {
  if (!compute_copies_ || is_recomputing()) return;
  ComputeCopies& c = *compute_copies_;
  c.copies.clear();
  for (const Tensor& p : parameters()) {
    if (!is_floating(p.dtype()) || p.dtype() == c.dtype) continue;
    Tensor copy = p.to(c.dtype);
    copy.storage()->set_tag(memory::Tag::parameter);
    c.copies.emplace(p.storage().get(), copy);
  }
}

Tensor Module::compute_weight(const Tensor& p) const {
  if (!compute_copies_ || !p.defined()) return p;
  const auto it = compute_copies_->copies.find(p.storage().get());
  return it == compute_copies_->copies.end() ? p : it->second;
}

}  // namespace remat::nn
