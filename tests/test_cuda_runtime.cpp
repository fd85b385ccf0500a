// The CUDA backend's entry points on a machine with or without a GPU: asking for devices never
// crashes, and without one the answer is 0 devices with the runtime's reason and clear errors.
#include <gtest/gtest.h>

#if defined(REMAT_WITH_CUDA)
#include <memory>
#include <string>
#include <vector>

#include "remat/backend.h"
#include "remat/devices.h"
#include "tensor/cuda/cuda_backend.h"

namespace {

TEST(CudaRuntime, DeviceCountAnswersWithoutCrashing) {
  const int n = remat::cuda::device_count();
  EXPECT_GE(n, 0);
  EXPECT_EQ(remat::cuda::device_count(), n);  // stable across calls
  if (n == 0) {
    EXPECT_FALSE(remat::cuda::unavailable_reason().empty());
  } else {
    EXPECT_EQ(remat::cuda::unavailable_reason(), "");
  }
}

TEST(CudaRuntime, InvalidDeviceIsAnError) {
  const int n = remat::cuda::device_count();
  EXPECT_THROW(remat::cuda::backend_for(n, {}), remat::Error);
  EXPECT_THROW(remat::cuda::backend_for(-1, {}), remat::Error);
  EXPECT_THROW(remat::cuda::make_backend(n, {}), remat::Error);
  EXPECT_THROW(remat::cuda::describe(n), remat::Error);
  EXPECT_THROW(remat::cuda::device_memory(n), remat::Error);
  try {
    remat::cuda::backend_for(n, {});
  } catch (const remat::Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("cuda:" + std::to_string(n)), std::string::npos) << message;
    if (n == 0) EXPECT_NE(message.find(remat::cuda::unavailable_reason()), std::string::npos) << message;
  }
}

// A device's backend is made once with its options (chosen with the device): asking for it with
// others is an error naming both; a backend of one's own (make_backend) may have any.
TEST(CudaRuntime, ADevicesBackendKeepsTheOptionsItWasMadeWith) {
  if (remat::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << remat::cuda::unavailable_reason();
  const remat::BackendOptions defaults = remat::default_backend_options();
  remat::Backend& b = remat::cuda::backend_for(0, defaults);
  EXPECT_EQ(&remat::cuda::backend_for(0, defaults), &b);
  EXPECT_TRUE(b.options() == defaults);
  remat::BackendOptions other = defaults;
  other.async = !other.async;
  try {
    remat::cuda::backend_for(0, other);
    ADD_FAILURE() << "no error";
  } catch (const remat::Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(remat::backend_options_text(defaults)), std::string::npos) << message;
    EXPECT_NE(message.find(remat::backend_options_text(other)), std::string::npos) << message;
  }
  const std::unique_ptr<remat::Backend> own = remat::cuda::make_backend(0, other);
  EXPECT_TRUE(own->options() == other);
}

TEST(CudaRuntime, DescribesEachDevice) {
  const int n = remat::cuda::device_count();
  if (n == 0) GTEST_SKIP() << "no CUDA device: " << remat::cuda::unavailable_reason();
  const std::string text = remat::cuda::describe(0);
  EXPECT_NE(text.find("sm_"), std::string::npos) << text;
  const remat::cuda::MemoryInfo info = remat::cuda::device_memory(0);
  EXPECT_GT(info.total_bytes, 0u);
  EXPECT_LE(info.free_bytes, info.total_bytes);
}

// ---- with a device: the allocator and the host copies of cuda:0

class CudaDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (remat::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << remat::cuda::unavailable_reason();
    if (!remat::has_backend(kDevice))
      remat::register_backend(kDevice, &remat::cuda::backend_for(0, remat::default_backend_options()));
  }
  static constexpr remat::Device kDevice{remat::DeviceType::cuda, 0};
};

TEST_F(CudaDevice, CopiesRoundTripThroughPinnedStaging) {
  // more than one 8 MiB staging buffer, and an odd size
  const int64_t n = (int64_t{5} << 20) + 3;
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = static_cast<double>(i % 1000) - 500.0;
  remat::Tensor host = remat::from_vector(values, {n}, remat::DType::f32);
  remat::Tensor device = host.to(kDevice);
  EXPECT_EQ(device.device(), kDevice);
  EXPECT_EQ(device.to(remat::kCpu).to_vector(), host.to_vector());
}

TEST_F(CudaDevice, CountersFollowAllocations) {
  const remat::memory::Stats before = remat::memory_stats(kDevice);
  {
    remat::Tensor t = remat::Tensor::empty({1000, 1000}, remat::DType::f32, remat::memory::Tag::saved, kDevice);
    const remat::memory::Stats during = remat::memory_stats(kDevice);
    EXPECT_EQ(during.live(remat::memory::Tag::saved), before.live(remat::memory::Tag::saved) + 4000000u);
  }
  EXPECT_EQ(remat::memory_stats(kDevice).live(remat::memory::Tag::saved), before.live(remat::memory::Tag::saved));
}

// Freed device blocks wait in the base allocator's cache (small ones too: cudaFree stalls the
// device), so Stats::cached_bytes counts them and empty_cache() returns them to the driver.
TEST_F(CudaDevice, FreedBlocksAreCachedAndCountedUntilEmptyCache) {
  remat::memory::Allocator& allocator = remat::backend(kDevice).allocator();
  remat::backend(kDevice).synchronize();
  allocator.empty_cache();
  EXPECT_EQ(remat::memory_stats(kDevice).cached_bytes, 0u);
  const auto make = [] { return remat::Tensor::empty({100}, remat::DType::f32, remat::memory::Tag::other, kDevice); };
  { remat::Tensor t = make(); }  // 400 bytes, freed at once
  const size_t cached = remat::memory_stats(kDevice).cached_bytes;
  EXPECT_GE(cached, 400u);
  {
    remat::Tensor again = make();  // the same size: the cached block is handed out again
    EXPECT_EQ(remat::memory_stats(kDevice).cached_bytes, cached - 448u);
  }
  allocator.empty_cache();
  EXPECT_EQ(remat::memory_stats(kDevice).cached_bytes, 0u);
}

TEST_F(CudaDevice, AnAllocationBeyondTheDeviceIsOutOfMemoryNamingFreeBytes) {
  const remat::cuda::MemoryInfo info = remat::cuda::device_memory(0);
  const remat::memory::Stats before = remat::memory_stats(kDevice);
  const int64_t too_many = static_cast<int64_t>(info.total_bytes / 4) * 2;  // f32: twice the device
  try {
    remat::Tensor::empty({too_many}, remat::DType::f32, remat::memory::Tag::other, kDevice);
    FAIL() << "allocated twice the device's memory";
  } catch (const remat::OutOfMemory& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("free"), std::string::npos) << message;
    EXPECT_NE(message.find(std::to_string(static_cast<size_t>(too_many) * 4)), std::string::npos) << message;
  }
  EXPECT_EQ(remat::memory_stats(kDevice).live_total, before.live_total);
  // the device still works
  remat::Tensor t = remat::from_vector(std::vector<double>{1, 2, 3}, {3}).to(kDevice);
  EXPECT_EQ(t.to(remat::kCpu).to_vector(), (std::vector<double>{1, 2, 3}));
}

}  // namespace
#else
TEST(CudaRuntime, BuiltWithoutCuda) { GTEST_SKIP() << "built without the CUDA backend (REMAT_WITH_CUDA=OFF)"; }
#endif
