// The example of include/remat/devices.h: choosing a GPU, or the error that says why there is none.
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
