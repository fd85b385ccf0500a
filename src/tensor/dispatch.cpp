// The device dispatcher (dispatch.h) and copies between devices.
#include "tensor/dispatch.h"

#include <deque>

#include "tensor/allocate.h"

namespace remat {

namespace detail {

// Host copies of one kernel call's device operands. in() copies a device tensor to a new host
// tensor; out() does the same for a tensor the kernel writes (its contents are copied too, for
// kernels that update in place or accumulate) and finish() copies it back. A tensor passed twice
// (an in-place update) has one host copy.
class DeviceDispatch::Staging {
 public:
  const Tensor& in(const Tensor& t) { return stage(t, false); }
  const Tensor& out(const Tensor& t) { return stage(t, true); }
  void finish() {
    for (auto& e : entries_)
      if (e.output) copy_between_devices(e.host, e.device);
  }

 private:
  struct Entry {
    Tensor device, host;
    bool output = false;
  };
  const Tensor& stage(const Tensor& t, bool output) {
    if (!t.defined() || t.device().type == DeviceType::cpu) return t;
    for (auto& e : entries_)
      if (e.device.same(t)) {
        e.output = e.output || output;
        return e.host;
      }
    Tensor host = allocate_tensor("CPU fallback", t.shape(), t.dtype(), memory::Tag::other, kCpu);
    copy_between_devices(t, host);
    entries_.push_back({t, host, output});
    return entries_.back().host;
  }
  std::deque<Entry> entries_;  // stable references
};

// Note: the forwarding of the optional kernels is generated from the kernel list
// (REMAT_OPTIONAL_KERNELS in remat/backend.h): each entry's argument list marks every tensor in()
// or inout(), and dispatch() calls the entry once with the backend to run on and the two marks as
// functions. On the device both marks hand the tensor through as it is; on the CPU fallback in()
// stages a host copy and inout() a host copy that finish() copies back. A kernel added to the
// list is forwarded with no code here.
template <class Call>
void DeviceDispatch::dispatch(Kernel kernel, DType dtype, Call&& call) {
  calls_[static_cast<size_t>(kernel)].fetch_add(1, std::memory_order_relaxed);
  if (inner_.supports(kernel, dtype)) {
    DeviceKernelScope scope;
    auto as_is = [](const Tensor& t) -> const Tensor& { return t; };
    call(inner_, as_is, as_is);
    return;
  }
  ++fallbacks_;
  Staging staging;
  call(cpu_backend(), [&](const Tensor& t) -> const Tensor& { return staging.in(t); },
       [&](const Tensor& t) -> const Tensor& { return staging.out(t); });
  staging.finish();
}

void DeviceDispatch::copy_from_host(const void* host, const Tensor& dst) {
  DeviceKernelScope scope;
  inner_.copy_from_host(host, dst);
}
void DeviceDispatch::copy_to_host(const Tensor& src, void* host) {
  DeviceKernelScope scope;
  inner_.copy_to_host(src, host);
}
void DeviceDispatch::synchronize() {
  DeviceKernelScope scope;
  inner_.synchronize();
}
void DeviceDispatch::raise_deferred_errors() {
  DeviceKernelScope scope;
  inner_.raise_deferred_errors();
}
CopyTicket DeviceDispatch::copy_to_host_async(const Tensor& src, const Tensor& host) {
  DeviceKernelScope scope;
  return inner_.copy_to_host_async(src, host);
}
CopyTicket DeviceDispatch::copy_from_host_async(const Tensor& host, const Tensor& dst) {
  DeviceKernelScope scope;
  return inner_.copy_from_host_async(host, dst);
}
bool DeviceDispatch::copy_done(const CopyTicket& ticket) {
  DeviceKernelScope scope;
  return inner_.copy_done(ticket);
}
void DeviceDispatch::wait_copy(const CopyTicket& ticket) {
  DeviceKernelScope scope;
  inner_.wait_copy(ticket);
}
void DeviceDispatch::wait_on_device(const CopyTicket& ticket) {
  DeviceKernelScope scope;
  inner_.wait_on_device(ticket);
}

DeviceActivity DeviceDispatch::activity() const {
  DeviceActivity a = inner_.activity();
  a.kernel_calls = 0;
  for (size_t k = 0; k < calls_.size(); ++k) {
    a.calls_by_kernel[k] = calls_[k].load(std::memory_order_relaxed);
    a.kernel_calls += a.calls_by_kernel[k];
  }
  return a;
}

// copy and fill are required of every backend (the fallback itself needs them).
void DeviceDispatch::copy(const Tensor& src, const Tensor& dst) {
  if (src.device() != dst.device()) return copy_between_devices(src, dst);
  calls_[static_cast<size_t>(Kernel::copy)].fetch_add(1, std::memory_order_relaxed);
  DeviceKernelScope scope;
  inner_.copy(src, dst);
}
void DeviceDispatch::fill(const Tensor& dst, double value) {
  calls_[static_cast<size_t>(Kernel::fill)].fetch_add(1, std::memory_order_relaxed);
  DeviceKernelScope scope;
  inner_.fill(dst, value);
}

#define REMAT_FORWARD_KERNEL(name, dtype_of, parameters, arguments)                                 \
  void DeviceDispatch::name parameters {                                                            \
    dispatch(Kernel::name, dtype_of.dtype(),                                                        \
             [&](Backend& target, const auto& in, const auto& inout) { target.name arguments; });   \
  }
REMAT_OPTIONAL_KERNELS(REMAT_FORWARD_KERNEL)
#undef REMAT_FORWARD_KERNEL

}  // namespace detail

// ---- copies between devices

namespace {
// src as a contiguous tensor on its own device (itself when it already is).
Tensor contiguous_on_device(const Tensor& src) {
  if (src.is_contiguous()) return src;
  Tensor c = detail::allocate_tensor("copy between devices", src.shape(), src.dtype(), memory::Tag::other, src.device());
  backend(src.device()).copy(src, c);
  return c;
}
}  // namespace

void copy_between_devices(const Tensor& src, const Tensor& dst) {
  REMAT_CHECK(src.defined() && dst.defined(), "copy between devices: undefined tensor");
  if (src.device() == dst.device()) return backend(dst.device()).copy(src, dst);
  if (dst.numel() == 0) return;
  if (src.device().type == DeviceType::cpu) {
    // host -> device: the host side takes dst's dtype, shape and a contiguous layout first
    Tensor staged = src;
    if (src.dtype() != dst.dtype() || src.shape() != dst.shape() || !src.is_contiguous()) {
      staged = detail::allocate_tensor("copy between devices", dst.shape(), dst.dtype(), memory::Tag::other, kCpu);
      cpu_backend().copy(src, staged);
    }
    if (dst.is_contiguous()) {
      backend(dst.device()).copy_from_host(staged.raw_data(), dst);
      if (dst.dtype() == DType::i64) detail::note_index_range(dst, static_cast<const int64_t*>(staged.raw_data()));
      return;
    }
    Tensor tmp = detail::allocate_tensor("copy between devices", dst.shape(), dst.dtype(), memory::Tag::other, dst.device());
    backend(dst.device()).copy_from_host(staged.raw_data(), tmp);
    return backend(dst.device()).copy(tmp, dst);
  }
  if (dst.device().type == DeviceType::cpu) {
    // device -> host: the bytes of a contiguous copy, straight into dst when it has src's layout
    // and dtype (Tensor::to(kCpu)); otherwise into a host buffer the CPU converts and lays out
    Tensor c = contiguous_on_device(src);
    if (dst.is_contiguous() && dst.dtype() == c.dtype() && dst.shape() == c.shape())
      return backend(src.device()).copy_to_host(c, dst.raw_data());
    Tensor host = detail::allocate_tensor("copy between devices", c.shape(), c.dtype(), memory::Tag::other, kCpu);
    backend(src.device()).copy_to_host(c, host.raw_data());
    return cpu_backend().copy(host, dst);
  }
  // device -> device: through the host
  Tensor host = detail::allocate_tensor("copy between devices", src.shape(), src.dtype(), memory::Tag::other, kCpu);
  copy_between_devices(src, host);
  copy_between_devices(host, dst);
}

}  // namespace remat
