// A test-only device backend that proves the device seam without a GPU.
//
// The "emulated" device keeps its tensors in host memory but behaves as an accelerator does: it
// has its own allocator (and so its own counters), the host may not read its memory except
// through an explicit copy (Tensor::to, copy_from_host / copy_to_host; the dispatcher enforces it,
// see remat/tensor.h), and it can be told to lack kernels, which then run through the CPU
// fallback. Its kernels are the CPU backend's, so results on it must equal the CPU's bit for bit.
//
//   EmulatedDevice dev;                        // registers emulated:0 for the scope
//   Tensor x = randn({4, 3}, DType::f32, 0.0, 1.0, dev.device);
//   dev.backend.refuse(Kernel::softmax, DType::f32);   // softmax now runs via the CPU fallback
#pragma once

#include <cstring>
#include <set>
#include <utility>

#include "remat/backend.h"
#include "tensor/cpu/cpu_backend.h"

namespace remat::testing {

class EmulatedBackend final : public cpu::CpuBackend {
 public:
  explicit EmulatedBackend(int index = 0) : allocator_("emulated:" + std::to_string(index)) {}
  DeviceType device_type() const override { return DeviceType::emulated; }
  memory::Allocator& allocator() override { return allocator_; }
  void copy_from_host(const void* host, const Tensor& dst) override {
    ++host_to_device;
    CpuBackend::copy_from_host(host, dst);
  }
  void copy_to_host(const Tensor& src, void* host) override {
    ++device_to_host;
    CpuBackend::copy_to_host(src, host);
  }
  void synchronize() override { ++synchronizations; }
  bool supports(Kernel kernel, DType dtype) const override {
    asked.insert(kernel);
    return refused_.count({kernel, dtype}) == 0;
  }
  void refuse(Kernel kernel, DType dtype) { refused_.insert({kernel, dtype}); }
  void refuse_all_dtypes(Kernel kernel) {
    for (DType d : {DType::f32, DType::f64, DType::i64}) refuse(kernel, d);
  }

  uint64_t host_to_device = 0, device_to_host = 0, synchronizations = 0;
  mutable std::set<Kernel> asked;  // the kernels the dispatcher asked supports() for

 private:
  memory::Allocator allocator_;
  std::set<std::pair<Kernel, DType>> refused_;
};

// Registers an emulated device for the life of the object (tensors on it must be gone first).
struct EmulatedDevice {
  explicit EmulatedDevice(int index = 0) : backend(index), device{DeviceType::emulated, index} {
    register_backend(device, &backend);
  }
  ~EmulatedDevice() {
    register_backend(device, nullptr);
    backend.allocator().empty_cache();
  }
  EmulatedDevice(const EmulatedDevice&) = delete;
  EmulatedDevice& operator=(const EmulatedDevice&) = delete;
  EmulatedBackend backend;
  Device device;
};

// One emulated device registered for the whole test program (never unregistered: tensors made
// on it may outlive any scope, e.g. in static tables).
inline Device emulated_device() {
  static EmulatedDevice* shared = new EmulatedDevice(0);
  return shared->device;
}

}  // namespace remat::testing
