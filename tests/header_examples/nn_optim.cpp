// The examples of include/remat/nn/optim.h: AdamW with clipping and a warm-up + cosine schedule,
// and the optimizer inside the backward.
#include <gtest/gtest.h>

#include "remat/nn.h"

using namespace remat;

TEST(NnOptimH, Examples) {
  auto model = std::make_shared<nn::GPT>(nn::GPTConfig{.vocab = 8, .layers = 1, .width = 8, .heads = 2, .seq = 4});
  const int64_t steps = 3;
  std::vector<int64_t> tokens = {1, 2, 3, 4, 5, 6, 7, 0};
  Tensor ids = from_indices(std::vector<int64_t>(tokens.begin(), tokens.begin() + 4), {1, 4});
  Tensor targets = from_indices(std::vector<int64_t>(tokens.begin() + 1, tokens.begin() + 5), {1, 4});
  const Tensor before = model->parameters()[0].clone();
REMAT_EXAMPLE(include/remat/nn/optim.h: remat::nn::AdamW opt(model->parameters())
  EXPECT_NE(model->parameters()[0].to_vector(), before.to_vector());
  EXPECT_EQ(opt.lr(), schedule(steps - 1));
  const Tensor trained = model->parameters()[0].clone();
REMAT_EXAMPLE(include/remat/nn/optim.h: for (int64_t step = 0; step < steps; ++step) {)
  EXPECT_NE(model->parameters()[0].to_vector(), trained.to_vector());
  for (const Tensor& p : model->parameters()) EXPECT_FALSE(p.grad().defined());  // each freed once used
}
