// The example of include/remat/counters.h: the counters of one backward pass.
#include <gtest/gtest.h>

#include <iostream>

#include "remat/nn.h"

using namespace remat;

TEST(CountersH, OneBackwardPass) {
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Linear>(8, 8));
  model->add(std::make_shared<nn::Tanh>());  // its backward reads its output: a re-run computes it
  model->add(std::make_shared<nn::Linear>(8, 8));
  Tensor loss = sum(model->forward(randn({2, 8}, DType::f32, RngState{1, 0})));  // every-layer: 3 regions
REMAT_EXAMPLE(include/remat/counters.h: remat::reset_counters();)
  EXPECT_EQ(c.regions_recomputed, 1u);  // the Tanh's: a Linear's region keeps all its node saves
  EXPECT_GT(c.ops.recomputed_flops, 0.0);
  EXPECT_EQ(c.dynamic.bytes_offloaded, 0u);
}
