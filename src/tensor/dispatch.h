// Internal: the dispatcher that backend(device) returns for a registered, non-CPU device.
//
// For each kernel call: if the device's backend supports() the kernel for the call's dtype, the
// call goes to it inside a DeviceKernelScope (the only place where host code may hold a pointer
// into device memory); otherwise it runs on the CPU backend: every tensor operand is copied to a
// host tensor, the CPU kernel runs on those, and the outputs (which the caller allocated on the
// device) receive the host results. Slow, and counted (fallback_calls), but complete: a backend
// may start with a handful of kernels.
#pragma once

#include <array>
#include <atomic>

#include "remat/backend.h"

namespace remat::detail {

class DeviceDispatch final : public Backend {
 public:
  DeviceDispatch(Device device, Backend& inner) : device_(device), inner_(inner) {}
  uint64_t fallback_calls() const { return fallbacks_.load(); }

  DeviceType device_type() const override { return inner_.device_type(); }
  memory::Allocator& allocator() override { return inner_.allocator(); }
  void set_num_threads(int threads) override { inner_.set_num_threads(threads); }
  int num_threads() const override { return inner_.num_threads(); }
  void copy_from_host(const void* host, const Tensor& dst) override;
  void copy_to_host(const Tensor& src, void* host) override;
  void synchronize() override;
  TimeMark mark_time() override { return inner_.mark_time(); }
  bool time_ready(const TimeMark& mark) override { return inner_.time_ready(mark); }
  double seconds_between(const TimeMark& from, const TimeMark& to) override { return inner_.seconds_between(from, to); }
  void raise_deferred_errors() override;
  Tensor host_buffer(DType dtype, int64_t numel) override { return inner_.host_buffer(dtype, numel); }
  CopyTicket copy_to_host_async(const Tensor& src, const Tensor& host) override;
  CopyTicket copy_from_host_async(const Tensor& host, const Tensor& dst) override;
  bool copy_done(const CopyTicket& ticket) override;
  void wait_copy(const CopyTicket& ticket) override;
  void wait_on_device(const CopyTicket& ticket) override;
  // the inner backend's counts with the kernel calls of this dispatcher
  DeviceActivity activity() const override;
  bool supports(Kernel kernel, DType dtype) const override { return inner_.supports(kernel, dtype); }
  bool holds(DType dtype) const override { return inner_.holds(dtype); }
  std::string why_not_held(DType dtype) const override { return inner_.why_not_held(dtype); }
  const BackendOptions& options() const override { return inner_.options(); }

  REMAT_OVERRIDE_KERNELS()

 private:
  class Staging;
  template <class Call>
  void dispatch(Kernel kernel, DType dtype, Call&& call);

  Device device_;
  Backend& inner_;
  std::atomic<uint64_t> fallbacks_{0};
  std::array<std::atomic<uint64_t>, kKernelCount> calls_{};
};

}  // namespace remat::detail
