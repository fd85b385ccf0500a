// Convolution and pooling: the layers (shapes, parameter names and layouts, init bounds), the
// errors for hostile arguments (each a remat::Error naming the op and the values, with nothing
// changed), the float32 algorithms against each other on a shape large enough for oneDNN, and
// reproducibility (the same call twice gives the same bits, as checkpointing needs).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "checkpoint_models.h"
#include "remat/nn.h"

using namespace remat;
using remat::testing::bitwise_equal;

namespace {

void expect_error(const std::function<void()>& f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const auto& fr : fragments)
      EXPECT_NE(std::string(e.what()).find(fr), std::string::npos) << "'" << fr << "' not in: " << e.what();
  }
}

// Restores the process-wide convolution algorithm.
struct AlgorithmScope {
  ConvAlgorithm before = conv_algorithm();
  explicit AlgorithmScope(ConvAlgorithm a) { set_conv_algorithm(a); }
  ~AlgorithmScope() { set_conv_algorithm(before); }
};

TEST(Conv2dLayer, ShapesNamesAndInit) {
  nn::Conv2d conv(4, 6, {3, 3}, {2, 2}, {1, 1}, {1, 1}, 2, true, DType::f64);
  auto named = conv.named_parameters();
  ASSERT_EQ(named.size(), 2u);
  EXPECT_EQ(named[0].first, "weight");
  EXPECT_EQ(named[0].second.shape(), (Shape{6, 2, 3, 3}));
  EXPECT_EQ(named[1].first, "bias");
  const double bound = 1.0 / std::sqrt(2.0 * 9.0);
  for (double v : conv.weight.to_vector()) EXPECT_LE(std::abs(v), bound);
  for (double v : conv.bias.to_vector()) EXPECT_EQ(v, 0.0);
  Tensor y = conv.forward(randn({2, 4, 7, 7}, DType::f64, RngState{1, 0}));
  EXPECT_EQ(y.shape(), (Shape{2, 6, 4, 4}));
  EXPECT_NE(conv.type_name().find("groups 2"), std::string::npos) << conv.type_name();
}

TEST(PoolingLayers, Shapes) {
  Tensor x = randn({2, 3, 8, 6}, DType::f32, RngState{2, 0});
  EXPECT_EQ(nn::MaxPool2d({2, 2}).forward(x).shape(), (Shape{2, 3, 4, 3}));
  EXPECT_EQ(nn::MaxPool2d({3, 3}, {2, 2}, {1, 1}).forward(x).shape(), (Shape{2, 3, 4, 3}));
  EXPECT_EQ(nn::AvgPool2d({2, 2}, {1, 1}).forward(x).shape(), (Shape{2, 3, 7, 5}));
  EXPECT_EQ(nn::AdaptiveAvgPool2d({1, 1}).forward(x).shape(), (Shape{2, 3, 1, 1}));
  EXPECT_EQ(nn::Flatten().forward(nn::AdaptiveAvgPool2d({1, 1}).forward(x)).shape(), (Shape{2, 3}));
  // global average pooling is the mean over the image
  auto a = nn::AdaptiveAvgPool2d({1, 1}).forward(x).to_vector(), m = mean(x, {2, 3}).to_vector();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], m[i], 1e-6);
}

TEST(ConvErrors, HostileArgumentsAreErrorsNamingTheProblem) {
  Tensor x = zeros({2, 4, 5, 5}), w = zeros({6, 2, 3, 3});
  expect_error([&] { conv2d(x, w, Tensor(), {1, 1}, {0, 0}, {1, 1}, 3); }, {"conv2d", "4 channels", "3 groups"});
  expect_error([&] { conv2d(x, zeros({6, 3, 3, 3})); }, {"conv2d", "[6, 3, 3, 3]", "[2, 4, 5, 5]"});
  expect_error([&] { conv2d(x, zeros({6, 4, 7, 7})); }, {"conv2d", "height", "dilated kernel (7)"});
  expect_error([&] { conv2d(x, zeros({6, 4, 3, 3}), Tensor(), {0, 1}); }, {"conv2d", "stride", "got 0"});
  expect_error([&] { conv2d(x, zeros({6, 4, 3, 3}), Tensor(), {1, 1}, {-1, 0}); }, {"padding", "got -1"});
  expect_error([&] { conv2d(x, zeros({6, 4, 3, 3}), Tensor(), {1, 1}, {0, 0}, {int64_t{1} << 40, 1}); },
               {"dilation"});
  expect_error([&] { conv2d(x, zeros({6, 4, 3, 3}), zeros({5})); }, {"bias", "[5]", "[6]"});
  expect_error([&] { conv2d(zeros({2, 4, 5}), w); }, {"[N, C, H, W]", "[2, 4, 5]"});
  expect_error([&] { conv2d(x, zeros({6, 4, 3, 3}, DType::f64)); }, {"f64", "f32"});
  expect_error([&] { conv2d(from_indices(std::vector<int64_t>(4, 0), {1, 1, 2, 2}), zeros({1, 1, 1, 1})); },
               {"i64"});
  // an output too large to index
  expect_error([&] { conv2d(zeros({1, 1, 1, 1}), zeros({1, 1, 1, 1}), Tensor(), {1, 1}, {1 << 29, 1 << 29}); },
               {"conv2d"});
  expect_error([&] { conv1d(zeros({2, 3}), zeros({1, 3, 1})); }, {"conv1d", "[N, C, L]"});
  expect_error([&] { max_pool2d(x, {3, 3}, {1, 1}, {2, 2}); }, {"max_pool2d", "padding 2", "half"});
  expect_error([&] { max_pool2d(x, {0, 3}); }, {"max_pool2d", "kernel size", "got 0"});
  expect_error([&] { avg_pool2d(x, {6, 6}); }, {"avg_pool2d", "height"});
  expect_error([&] { adaptive_avg_pool2d(x, {0, 2}); }, {"adaptive_avg_pool2d", "positive"});
  expect_error([&] { diagonal(x, 1, 1); }, {"diagonal", "differ"});
  expect_error([&] { diagonal(x, 0, 7); }, {"diagonal", "out of range"});
  expect_error([&] { nn::Conv2d(4, 6, {3, 3}, {1, 1}, {0, 0}, {1, 1}, 4); }, {"Conv2d", "groups"});
  nn::Conv2d layer(4, 6, {3, 3});
  expect_error([&] { layer.forward(zeros({2, 5, 5, 5})); }, {"Conv2d(4 -> 6", "[2, 5, 5, 5]"});
}

TEST(ConvAlgorithmsAgree, Float32OnAShapeLargeEnoughForOneDnn) {
  Tensor x = randn({4, 16, 12, 12}, DType::f32, RngState{3, 0});
  Tensor w = randn({24, 8, 3, 3}, DType::f32, RngState{4, 0}, 0.0, 0.2);
  Tensor b = randn({24}, DType::f32, RngState{5, 0});
  auto run = [&](ConvAlgorithm a) {
    AlgorithmScope scope(a);
    Tensor xl = x.detach().requires_grad_(), wl = w.detach().requires_grad_(), bl = b.detach().requires_grad_();
    Tensor y = conv2d(xl, wl, bl, {2, 1}, {1, 1}, {1, 2}, 2);
    Tensor g = randn(y.shape(), DType::f32, RngState{6, 0});
    TensorList grads = remat::grad({y}, {xl, wl, bl}, {g});
    return TensorList{y, grads[0], grads[1], grads[2]};
  };
  TensorList reference = run(ConvAlgorithm::im2col_gemm);
  for (ConvAlgorithm a : {ConvAlgorithm::onednn_plain, ConvAlgorithm::onednn_blocked, ConvAlgorithm::automatic}) {
    TensorList got = run(a);
    for (size_t i = 0; i < got.size(); ++i) {
      auto u = got[i].to_vector(), v = reference[i].to_vector();
      double scale = 0;
      for (double e : v) scale = std::max(scale, std::abs(e));
      for (size_t j = 0; j < u.size(); ++j)
        ASSERT_NEAR(u[j], v[j], 1e-5 * scale) << conv_algorithm_name(a) << " result " << i << " element " << j;
    }
  }
}

TEST(ConvReproducibility, TheSameCallGivesTheSameBits) {
  for (ConvAlgorithm a : {ConvAlgorithm::im2col_gemm, ConvAlgorithm::onednn_blocked}) {
    AlgorithmScope scope(a);
    for (DType dt : {DType::f32, DType::f64}) {
      Tensor x = randn({4, 8, 10, 10}, dt, RngState{7, 0}).requires_grad_();
      Tensor w = randn({8, 8, 3, 3}, dt, RngState{8, 0}).requires_grad_();
      auto once = [&] {
        Tensor y = max_pool2d(relu(conv2d(x, w, Tensor(), {1, 1}, {1, 1})), {2, 2});
        TensorList g = remat::grad({sum(mul(y, y))}, {x, w});
        return TensorList{y, g[0], g[1]};
      };
      TensorList first = once(), second = once();
      for (size_t i = 0; i < first.size(); ++i)
        EXPECT_TRUE(bitwise_equal(first[i], second[i])) << conv_algorithm_name(a) << " " << dtype_name(dt) << " " << i;
    }
  }
}

TEST(ConvThreads, Im2colResultsDoNotDependOnTheThreadCount) {
  AlgorithmScope scope(ConvAlgorithm::im2col_gemm);
  const int before = num_threads();
  Tensor x = randn({16, 8, 10, 10}, DType::f32, RngState{7, 0}).requires_grad_();
  Tensor w = randn({8, 8, 3, 3}, DType::f32, RngState{8, 0}).requires_grad_();
  auto run = [&] {
    TensorList g = remat::grad({sum(mul(conv2d(x, w, Tensor(), {1, 1}, {1, 1}), x))}, {x, w});
    return g;
  };
  set_num_threads(1);
  TensorList one = run();
  set_num_threads(2);
  TensorList two = run();
  set_num_threads(before);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(bitwise_equal(one[i], two[i])) << i;
}

TEST(MaxPool, GradientGoesToTheFirstMaximumOfEachWindow) {
  // ties: all equal -> the first element of each window gets the gradient
  Tensor x = ones({1, 1, 2, 4}, DType::f64).requires_grad_();
  sum(max_pool2d(x, {2, 2})).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{1, 0, 1, 0, 0, 0, 0, 0}));
}

}  // namespace
