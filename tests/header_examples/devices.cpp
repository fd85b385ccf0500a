// The examples of include/remat/devices.h: choosing a GPU, or the error that says why there is none,
// and the backend options chosen with it.
#include <gtest/gtest.h>

#include <cstdio>

#include "remat/nn.h"

using namespace remat;

TEST(DevicesH, Example) {
  nn::Linear model(4, 4);
  try {
REMAT_EXAMPLE(include/remat/devices.h: for (const std::string& b : remat::compiled_backends()))
    EXPECT_EQ(model.parameters()[0].device(), gpu);
  } catch (const Error& e) {
    // use_device refused: this build has no CUDA, or this machine no usable device, and it says so
    EXPECT_EQ(device_count(DeviceType::cuda), 0) << e.what();
    EXPECT_FALSE(unavailable_reason(DeviceType::cuda).empty());
    EXPECT_EQ(model.parameters()[0].device(), kCpu);
  }
}

// The backend options chosen with the device: on a GPU, cuda:0's backend runs with TF32 and async
// (this test runs in a process of its own); without one, use_device says why not.
TEST(DevicesH, BackendOptions) {
  const Device gpu{DeviceType::cuda, 0};
  if (has_backend(gpu)) GTEST_SKIP() << "cuda:0 is in use already, with the options it was chosen with";
  try {
REMAT_EXAMPLE(include/remat/devices.h: remat::BackendOptions o)
    EXPECT_TRUE(o.tf32 && o.async);
    EXPECT_EQ(describe_backend_options(gpu).text, "cuda:0 backend options: async (not device-checked), tf32");
  } catch (const Error& e) {
    EXPECT_EQ(device_count(DeviceType::cuda), 0) << e.what();
  }
}
