// Internal: bf16 and f16 operands of a kernel computed as float32 stand-ins, for the backends
// whose kernels have no 16-bit form of their own (the CPU's, Note [16-bit floats on the CPU] in
// cpu/widen.cpp; CUDA's, Note [16-bit floats on the GPU] in cuda/widen.cpp).
//
//   Widened w(backend, /*widen=*/true);
//   kernel(w.in(x), w.inout(y));  // float32 copies of 16-bit x and y, others as they are
//   w.finish();                   // y's stand-in rounded back into y, once
#pragma once

#include <array>

#include "remat/backend.h"
#include "tensor/allocate.h"

namespace remat::detail {

// The float32 stand-ins of one kernel call's 16-bit operands, on the operand's device, made and
// rounded back with `backend`'s copy kernel. A tensor passed twice (in place) has one stand-in;
// references stay valid until the call ends.
class Widened {
 public:
  // keep_bf16_inputs: in() passes bf16 tensors as they are (a kernel that computes on bf16 itself)
  Widened(Backend& backend, bool widen, bool keep_bf16_inputs = false)
      : backend_(backend), widen_(widen), keep_bf16_inputs_(keep_bf16_inputs) {}
  const Tensor& in(const Tensor& t) { return stage(t, false); }
  const Tensor& inout(const Tensor& t) { return stage(t, true); }
  // Rounds the written stand-ins back into their tensors.
  void finish() {
    for (size_t i = 0; i < count_; ++i)
      if (entries_[i].written) backend_.copy(entries_[i].wide, entries_[i].narrow);
  }

 private:
  struct Entry {
    Tensor narrow, wide;
    bool written = false;
  };
  const Tensor& stage(const Tensor& t, bool written) {
    if (!widen_ || !t.defined() || !is_16bit_float(t.dtype())) return t;
    if (keep_bf16_inputs_ && !written && t.dtype() == DType::bf16) return t;
    for (size_t i = 0; i < count_; ++i)
      if (entries_[i].narrow.same(t)) {
        entries_[i].written = entries_[i].written || written;
        return entries_[i].wide;
      }
    REMAT_ASSERT(count_ < entries_.size(), "a kernel with more than ", entries_.size(), " tensor operands");
    Entry& e = entries_[count_++];
    e.narrow = t;
    e.wide = allocate_tensor("float32 stand-in of a 16-bit operand", t.shape(), DType::f32, memory::Tag::other,
                             t.device());
    backend_.copy(t, e.wide);
    e.written = written;
    return e.wide;
  }

  Backend& backend_;
  bool widen_, keep_bf16_inputs_;
  std::array<Entry, 12> entries_;
  size_t count_ = 0;
};

}  // namespace remat::detail

// Defines Class::name for each optional kernel as Base::name on the stand-ins of its 16-bit
// operands, unless native(Kernel::name) says the kernel takes them as they are.
#define REMAT_WIDENED_KERNEL(Class, Base, native, name, parameters, arguments)               \
  void Class::name parameters {                                                             \
    ::remat::detail::Widened widened(*this, !native(::remat::Kernel::name));                \
    auto in = [&](const Tensor& t) -> const Tensor& { return widened.in(t); };              \
    auto inout = [&](const Tensor& t) -> const Tensor& { return widened.inout(t); };        \
    (void)in;                                                                               \
    Base::name arguments;                                                                   \
    widened.finish();                                                                       \
  }
