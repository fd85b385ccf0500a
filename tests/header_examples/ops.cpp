// The examples of include/remat/ops.h: a transformer's MLP and loss, and the image ops, with the
// shapes the comments give.
#include <gtest/gtest.h>

#include "remat/remat.h"

using namespace remat;

TEST(OpsH, MlpAndLoss) {
  const int64_t B = 2, T = 5, C = 8, V = 11;
  Tensor x = randn({B, T, C}, DType::f32, RngState{1, 0});
  Tensor w = randn({C, 4 * C}, DType::f32, RngState{2, 0}), b = randn({4 * C}, DType::f32, RngState{3, 0});
  Tensor logits = randn({B, T, V}, DType::f32, RngState{4, 0});
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < B * T; ++i) ids.push_back(i % V);
  Tensor targets = from_indices(ids, {B, T});
REMAT_EXAMPLE(include/remat/ops.h: Tensor h = gelu(add(matmul(x, w), b));)
  EXPECT_EQ(h.shape(), (Shape{B, T, 4 * C}));
  EXPECT_EQ(loss.numel(), 1);
  EXPECT_GT(loss.item(), 0.0);
}

TEST(OpsH, ResidualNorm) {
  const int64_t B = 2, T = 5, C = 8;
  Tensor x = randn({B, T, C}, DType::f32, RngState{1, 0}), attn_out = randn({B, T, C}, DType::f32, RngState{2, 0});
  Tensor weight = randn({C}, DType::f32, RngState{3, 0}), bias = randn({C}, DType::f32, RngState{4, 0});
REMAT_EXAMPLE(include/remat/ops.h: TensorList hn = add_layer_norm(x, attn_out, weight, bias);)
  EXPECT_EQ(out.shape(), (Shape{B, T, C}));
  EXPECT_EQ(hn[0].to_vector(), add(x, attn_out).to_vector());
  EXPECT_EQ(hn[1].to_vector(), layer_norm(hn[0], weight, bias).to_vector());
}

TEST(OpsH, Images) {
  Tensor x = randn({8, 3, 32, 32}, DType::f32, RngState{1, 0});
  Tensor w = randn({16, 3, 3, 3}, DType::f32, RngState{2, 0}), b = zeros({16});
  Tensor gamma = ones({16}), beta = zeros({16}), running_mean = zeros({16}), running_var = ones({16});
REMAT_EXAMPLE(include/remat/ops.h: Tensor y = conv2d(x, w, b, {1, 1}, {1, 1});)
  EXPECT_EQ(y.shape(), (Shape{8, 16, 32, 32}));
  EXPECT_EQ(p.shape(), (Shape{8, 16, 16, 16}));
  EXPECT_EQ(z.shape(), y.shape());
  EXPECT_NE(running_mean.to_vector(), zeros({16}).to_vector());  // training: the statistics moved
}
