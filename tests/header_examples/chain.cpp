// The example of include/remat/chain.h: a Chain of 16 blocks, each a region; then a budget.
#include <gtest/gtest.h>

#include "remat/remat.h"

using namespace remat;

TEST(ChainH, Example) {
  std::vector<Tensor> weights;
  std::vector<std::function<Tensor(const Tensor&)>> blocks;
  for (int i = 0; i < 16; ++i) {
    Tensor w = randn({8, 8}, DType::f32, RngState{1, static_cast<uint64_t>(i) * 1000}).requires_grad_();
    weights.push_back(w);
    blocks.push_back([w](const Tensor& h) { return tanh(matmul(h, w)); });
  }
  Tensor x = randn({4, 8}, DType::f32, RngState{2, 0});
  auto head = [](const Tensor& h) { return mul_scalar(h, 0.5); };
  reset_counters();
REMAT_EXAMPLE(include/remat/chain.h: remat::Chain model;)
  EXPECT_EQ(counters().regions_created, 16u);
  EXPECT_EQ(counters().regions_recomputed, 16u);
  for (const Tensor& w : weights) EXPECT_TRUE(w.grad().defined());
REMAT_EXAMPLE(include/remat/chain.h: model.set_policy(remat::Policy::parse("budget:32MiB"));)
  EXPECT_EQ(model.size(), 17u);
  EXPECT_EQ(model.policy(), Policy::parse("budget:32MiB"));
}
