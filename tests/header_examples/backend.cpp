// The examples of include/remat/backend.h: registering a backend for a device, and declaring every
// kernel of the list in a backend class.
#include <gtest/gtest.h>

#include <type_traits>

#include "remat/remat.h"
#include "tensor/cpu/cpu_backend.h"  // the CPU's kernels, which the stand-in below runs

using namespace remat;

namespace {

// A stand-in for a CUDA backend, so that the example runs without a GPU: the CPU's kernels behind
// an allocator of its own, registered for cuda:0 (a CUDA build registers its real backend only
// when use_device asks for it).
class MyCudaBackend final : public cpu::CpuBackend {
 public:
  DeviceType device_type() const override { return DeviceType::cuda; }
  memory::Allocator& allocator() override { return allocator_; }

 private:
  memory::Allocator allocator_{"cuda:0 (stand-in)"};
};

}  // namespace

// At namespace scope with external linkage: the example declares the kernels without defining them.
namespace backend_example {
REMAT_EXAMPLE(include/remat/backend.h: class MyBackend final : public remat::Backend {)
}  // namespace backend_example
using backend_example::MyBackend;

TEST(BackendH, RegisterABackend) {
  MyCudaBackend my_cuda_backend;
  {
REMAT_EXAMPLE(include/remat/backend.h: remat::register_backend({remat::DeviceType::cuda, 0}, &my_cuda_backend);)
    EXPECT_EQ(y.device(), (Device{DeviceType::cuda, 0}));
    EXPECT_GT(my_cuda_backend.allocator().stats().live_total, 0u);  // x and y live on the device
    EXPECT_EQ(v, remat::tanh(x.to(kCpu)).to_vector());
  }
  register_backend({DeviceType::cuda, 0}, nullptr);  // its tensors are gone
}

TEST(BackendH, OverrideEveryKernel) {
  // the macro declares every kernel of the list as an override of Backend's: with the device
  // verbs, nothing is left abstract
  EXPECT_TRUE((std::is_base_of_v<Backend, MyBackend>));
  EXPECT_FALSE(std::is_abstract_v<MyBackend>);
}
