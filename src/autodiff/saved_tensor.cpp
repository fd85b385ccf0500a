#include "remat/autodiff.h"

namespace remat::autodiff {

SavedTensor::SavedTensor(const Tensor& value) {
  if (!value.defined()) return;
  value_ = value.detach();  // no grad_fn: no cycle through the node that keeps it
  version_ = value_.storage()->version();
  value_.storage()->add_saved_reference();
}

SavedTensor::~SavedTensor() { release(); }

SavedTensor::SavedTensor(SavedTensor&& other) noexcept
    : value_(std::move(other.value_)), version_(other.version_), released_(other.released_) {
  other.value_ = Tensor();
}

SavedTensor& SavedTensor::operator=(SavedTensor&& other) noexcept {
  if (this != &other) {
    release();
    value_ = std::move(other.value_);
    version_ = other.version_;
    released_ = other.released_;
    other.value_ = Tensor();
  }
  return *this;
}

Tensor SavedTensor::get() const {
  REMAT_CHECK(!released_, "a value saved for the backward pass was already freed: the graph was run backward "
                          "once already (pass retain_graph=true to run it again)");
  if (!value_.defined()) return Tensor();
  REMAT_CHECK(value_.storage()->version() == version_,
              "a tensor of shape ", shape_str(value_.shape()), " saved for the backward pass was modified in "
              "place after it was saved; its gradient would be wrong");
  return value_.detach();  // a fresh handle each time, so callers may attach history to it
}

void SavedTensor::release() {
  if (value_.defined()) {
    value_.storage()->remove_saved_reference();
    value_ = Tensor();
    released_ = true;
  }
}

size_t SavedTensor::bytes() const { return value_.defined() ? value_.storage()->bytes() : 0; }

}  // namespace remat::autodiff
