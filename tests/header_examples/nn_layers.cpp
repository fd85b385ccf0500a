// The examples of the layers' headers: include/remat/nn/layers.h, loss.h, conv.h, transformer.h,
// containers.h, batch_norm.h and einsum.h, with the shapes and values their comments give.
#include <gtest/gtest.h>

#include <cmath>

#include "remat/nn.h"

using namespace remat;

TEST(NnLayersH, LinearAndGelu) {
  Tensor x = randn({2, 3, 64}, DType::f32, RngState{1, 0});
REMAT_EXAMPLE(include/remat/nn/layers.h: auto fc = std::make_shared<remat::nn::Linear>(64, 256);)
  EXPECT_EQ(fc->weight.shape(), (Shape{256, 64}));
  EXPECT_EQ(fc->bias.shape(), (Shape{256}));
  EXPECT_EQ(h.shape(), (Shape{2, 3, 256}));
}

TEST(NnLayersH, LayerNormWithAResidual) {
  Tensor x = randn({2, 3, 64}, DType::f32, RngState{1, 0}), attn_out = randn({2, 3, 64}, DType::f32, RngState{2, 0});
REMAT_EXAMPLE(include/remat/nn/layers.h: auto ln = std::make_shared<remat::nn::LayerNorm>(64);)
  ASSERT_EQ(hn.size(), 2u);
  EXPECT_EQ(hn[0].to_vector(), add(x, attn_out).to_vector());
  EXPECT_EQ(hn[1].to_vector(), ln->forward(hn[0]).to_vector());
}

TEST(NnLossH, Losses) {
  Tensor pred = randn({4, 3}, DType::f64, RngState{1, 0}), target = randn({4, 3}, DType::f64, RngState{2, 0});
  Tensor logits = randn({4, 5}, DType::f64, RngState{3, 0});
  Tensor targets = from_indices({0, 1, 2, 3}, {4});
REMAT_EXAMPLE(include/remat/nn/loss.h: Tensor l1 = remat::nn::mse_loss(pred, target);)
  EXPECT_DOUBLE_EQ(l1.item(), mean(mul(sub(pred, target), sub(pred, target))).item());
  EXPECT_GT(l2.item(), 0.0);
}

TEST(NnConvH, ConvAndPool) {
  Tensor x = randn({8, 3, 32, 32}, DType::f32, RngState{1, 0});
REMAT_EXAMPLE(include/remat/nn/conv.h: auto conv = std::make_shared<remat::nn::Conv2d>)
  EXPECT_EQ(y.shape(), (Shape{8, 16, 16, 16}));
}

TEST(NnTransformerH, Block) {
  Tensor x = randn({2, 5, 64}, DType::f32, RngState{1, 0});
REMAT_EXAMPLE(include/remat/nn/transformer.h: auto block = std::make_shared<remat::nn::TransformerBlock>)
  EXPECT_EQ(y.shape(), x.shape());
}

TEST(NnContainersH, Sequential) {
  Tensor x = randn({1, 4, 64}, DType::f32, RngState{1, 0});
  reset_counters();
REMAT_EXAMPLE(include/remat/nn/containers.h: auto body = std::make_shared<remat::nn::Sequential>();)
  EXPECT_EQ(y.shape(), x.shape());
  EXPECT_EQ(counters().regions_created, 12u);  // one region per block
}

TEST(NnBatchNormH, TrainAndEval) {
  Tensor x = add_scalar(randn({4, 16, 5, 5}, DType::f32, RngState{1, 0}), 3.0);
REMAT_EXAMPLE(include/remat/nn/batch_norm.h: auto bn = std::make_shared<remat::nn::BatchNorm2d>(16);)
  EXPECT_EQ(bn->num_batches_tracked(), 1);  // the training call updated the statistics once
  EXPECT_GT(bn->running_mean.to_vector()[0], 0.2);  // towards the batch mean, about 3
  EXPECT_NE(z.to_vector(), y.to_vector());        // the running statistics normalised z
}

TEST(NnEinsumH, Specs) {
  Tensor x = randn({2, 3, 4}, DType::f64, RngState{1, 0}), w = randn({4, 5}, DType::f64, RngState{2, 0});
  Tensor q = randn({2, 2, 3, 4}, DType::f64, RngState{3, 0}), k = randn({2, 2, 6, 4}, DType::f64, RngState{4, 0});
  Tensor a = randn({3, 3}, DType::f64, RngState{5, 0}), b = randn({2, 3, 2}, DType::f64, RngState{6, 0});
  Tensor m1 = randn({2, 3}, DType::f64, RngState{7, 0}), m2 = randn({3, 4}, DType::f64, RngState{8, 0});
  Tensor m3 = randn({4, 5}, DType::f64, RngState{9, 0}), m4 = randn({5, 6}, DType::f64, RngState{10, 0});
REMAT_EXAMPLE(include/remat/nn/einsum.h: Tensor y = remat::nn::einsum("bij,jk->bik", {x, w});)
  auto near = [](const Tensor& got, const Tensor& want) {
    ASSERT_EQ(got.shape(), want.shape());
    const std::vector<double> g = got.to_vector(), e = want.to_vector();
    for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], e[i], 1e-12);
  };
  near(y, matmul(x, w));
  near(s, matmul(q, k, false, true));
  near(t, sum(remat::diagonal(a, 0, 1)));
  near(d, remat::diagonal(a, 0, 1));
  near(z, matmul(a, b));
  near(c, matmul(matmul(matmul(m1, m2), m3), m4));
  EXPECT_EQ(layer->weights.size(), 2u);
  EXPECT_EQ(layer->forward(randn({2, 7, 8}, DType::f32, RngState{11, 0})).shape(), (Shape{2, 7, 4, 5}));
}
