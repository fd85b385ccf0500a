// The example of include/remat/memory.h: the peak of saved bytes of one step.
#include <gtest/gtest.h>

#include "remat/nn.h"

using namespace remat;

TEST(MemoryH, Example) {
  auto model = std::make_shared<nn::Sequential>();
  for (int i = 0; i < 4; ++i) model->add(std::make_shared<nn::Linear>(32, 32));
  Tensor x = randn({8, 32}, DType::f32, RngState{1, 0});
REMAT_EXAMPLE(include/remat/memory.h: remat::memory::reset_peaks();)
  // under every-layer each layer call keeps its input (8 x 32 floats) at least: the peak is the
  // step's, not what was live after it
  EXPECT_GE(saved_peak, 4u * 8 * 32 * sizeof(float));
  EXPECT_EQ(remat::memory::stats().live(remat::memory::Tag::saved), 0u);
}
