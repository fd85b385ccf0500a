// The examples of include/remat/checkpoint.h: one region by hand, and every layer call a region.
#include <gtest/gtest.h>

#include "remat/nn.h"

using namespace remat;

TEST(CheckpointH, OneRegion) {
  Tensor w = randn({16, 16}, DType::f64, RngState{1, 0}).requires_grad_();
  auto mlp_block = [&](const Tensor& h) { return tanh(matmul(tanh(matmul(h, w)), w)); };
  Tensor x = randn({4, 16}, DType::f64, RngState{2, 0});
  reset_counters();
REMAT_EXAMPLE(include/remat/checkpoint.h: // a block run as a region)
  EXPECT_EQ(counters().regions_created, 1u);
  EXPECT_EQ(y.to_vector(), mlp_block(x).to_vector());
  sum(y).backward();  // the region is re-run once
  EXPECT_EQ(counters().regions_recomputed, 1u);
  EXPECT_TRUE(w.grad().defined());
}

TEST(CheckpointH, EveryLayerCallARegion) {
  auto model = std::make_shared<nn::Sequential>();
  for (int i = 0; i < 3; ++i) model->add(std::make_shared<nn::Linear>(16, 16));
  Tensor x = randn({4, 16}, DType::f32, RngState{3, 0});
  reset_counters();
REMAT_EXAMPLE(include/remat/checkpoint.h: // or set it once for a whole model)
  EXPECT_EQ(counters().regions_created, 3u);
  // a Linear saves only its input and its weight, which its region keeps: nothing to make again
  EXPECT_EQ(counters().regions_recomputed, 0u);
}
