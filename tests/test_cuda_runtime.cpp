// The CUDA backend's entry points on a machine with or without a GPU: asking for devices never
// crashes, and without one the answer is 0 devices with the runtime's reason and clear errors.
#include <gtest/gtest.h>

#if defined(REMAT_WITH_CUDA)
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
  EXPECT_THROW(remat::cuda::backend_for(n), remat::Error);
  EXPECT_THROW(remat::cuda::backend_for(-1), remat::Error);
  EXPECT_THROW(remat::cuda::describe(n), remat::Error);
  EXPECT_THROW(remat::cuda::device_memory(n), remat::Error);
  try {
    remat::cuda::backend_for(n);
  } catch (const remat::Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("cuda:" + std::to_string(n)), std::string::npos) << message;
    if (n == 0) EXPECT_NE(message.find(remat::cuda::unavailable_reason()), std::string::npos) << message;
  }
}

TEST(CudaRuntime, Tf32IsOffByDefaultAndSwitchable) {
  EXPECT_FALSE(remat::cuda::allow_tf32());
  remat::cuda::set_allow_tf32(true);
  EXPECT_TRUE(remat::cuda::allow_tf32());
  remat::cuda::set_allow_tf32(false);
  EXPECT_FALSE(remat::cuda::allow_tf32());
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

}  // namespace
#else
TEST(CudaRuntime, BuiltWithoutCuda) { GTEST_SKIP() << "built without the CUDA backend (REMAT_WITH_CUDA=OFF)"; }
#endif
