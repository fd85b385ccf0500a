// nn layers: float64 finite-difference gradients of every layer, attention masking, shapes and
// PyTorch-compatible layouts.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "remat/nn.h"
#include "test_nn_gradcheck.h"

using namespace remat;
using remat::nn_test::expect_gradients_match;

namespace {

Tensor input(const Shape& shape, uint64_t seed, double stddev = 1.0) {
  return randn(shape, DType::f64, RngState{seed, 0}, 0.0, stddev).requires_grad_();
}

// Checks the gradients of module->forward(x) with respect to x and every parameter.
void check_module(const std::shared_ptr<nn::Module>& module, const Tensor& x, nn_test::GradcheckOptions options = {}) {
  TensorList inputs = module->parameters();
  std::vector<std::string> names;
  for (const auto& [name, p] : module->named_parameters()) names.push_back(name);
  inputs.push_back(x);
  names.push_back("x");
  expect_gradients_match([&] { return module->forward(x); }, inputs, names, options);
}

// Parameters away from their trivial initial values (norm weights 1, biases 0), so that every
// term of the gradient is exercised.
void perturb_parameters(nn::Module& module, uint64_t seed) {
  NoGradGuard no_grad;
  uint64_t i = 0;
  for (auto& p : module.parameters()) {
    Tensor noise = randn(p.shape(), p.dtype(), RngState{seed, (i++) << 32}, 0.0, 0.3);
    p.copy_(add(p.detach(), noise));
  }
}

// A deliberately wrong backward (d/dx x^2 given as x instead of 2x): the checker must object.
void check_wrong_gradient() {
  CustomOp wrong{"wrong_square",
                 [](const TensorList& in, SaveContext& ctx) {
                   ctx.save(in[0]);
                   return TensorList{mul(in[0], in[0])};
                 },
                 [](const TensorList& grads, const SavedValues& saved) { return TensorList{mul(grads[0], saved[0])}; }};
  Tensor x = from_vector(std::vector<double>{0.7}, {1}, DType::f64).requires_grad_();  // one element, one failure
  expect_gradients_match([&] { return wrong({x})[0]; }, {x});
}

}  // namespace

TEST(NnLayers, GradientCheckerCatchesAWrongGradient) {
  EXPECT_NONFATAL_FAILURE(check_wrong_gradient(), "input 0 element");
}

TEST(NnLayers, LinearGradientAndLayout) {
  auto fc = std::make_shared<nn::Linear>(5, 3, true, DType::f64);
  EXPECT_EQ(fc->weight.shape(), (Shape{3, 5}));  // [out, in] as PyTorch
  EXPECT_EQ(fc->bias.shape(), (Shape{3}));
  perturb_parameters(*fc, 1);
  check_module(fc, input({2, 4, 5}, 2));
  check_module(fc, input({4, 5}, 3));
  // x @ W^T + b, by hand
  Tensor x = input({2, 5}, 4);
  Tensor y = fc->forward(x);
  auto w = fc->weight.to_vector(), b = fc->bias.to_vector(), xv = x.to_vector(), yv = y.to_vector();
  for (int r = 0; r < 2; ++r)
    for (int o = 0; o < 3; ++o) {
      double expected = b[o];
      for (int i = 0; i < 5; ++i) expected += xv[r * 5 + i] * w[o * 5 + i];
      EXPECT_NEAR(yv[r * 3 + o], expected, 1e-12);
    }
  // a 1-D input works as one row
  EXPECT_EQ(fc->forward(input({5}, 5)).shape(), (Shape{3}));
  auto no_bias = std::make_shared<nn::Linear>(4, 2, false, DType::f64);
  EXPECT_FALSE(no_bias->bias.defined());
  EXPECT_EQ(no_bias->named_parameters().size(), 1u);
  check_module(no_bias, input({3, 4}, 6));
}

TEST(NnLayers, LinearRejectsWrongInput) {
  nn::Linear fc(4, 2);
  try {
    fc.forward(randn({3, 5}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[3, 5]"), std::string::npos) << e.what();
  }
}

TEST(NnLayers, EmbeddingGradient) {
  auto emb = std::make_shared<nn::Embedding>(7, 3, DType::f64);
  Tensor ids = from_indices({1, 3, 3, 6, 0, 1}, {2, 3});
  EXPECT_EQ(emb->forward(ids).shape(), (Shape{2, 3, 3}));
  expect_gradients_match([&] { return emb->forward(ids); }, {emb->weight}, {"weight"});
}

TEST(NnLayers, LayerNormAndRmsNormGradients) {
  auto ln = std::make_shared<nn::LayerNorm>(6, 1e-5, true, DType::f64);
  EXPECT_EQ(ln->weight.to_vector(), std::vector<double>(6, 1.0));
  EXPECT_EQ(ln->bias.to_vector(), std::vector<double>(6, 0.0));
  perturb_parameters(*ln, 7);
  check_module(ln, input({2, 3, 6}, 8));
  auto plain = std::make_shared<nn::LayerNorm>(6, 1e-5, false, DType::f64);
  EXPECT_TRUE(plain->parameters().empty());
  check_module(plain, input({4, 6}, 9));
  auto rms = std::make_shared<nn::RMSNorm>(6, 1e-6, DType::f64);
  EXPECT_EQ(rms->weight.to_vector(), std::vector<double>(6, 1.0));
  perturb_parameters(*rms, 10);
  check_module(rms, input({2, 3, 6}, 11));
}

TEST(NnLayers, ActivationGradients) {
  Tensor x = input({3, 7}, 12);
  check_module(std::make_shared<nn::GELU>(), x);
  check_module(std::make_shared<nn::GELU>(true), x);
  check_module(std::make_shared<nn::ReLU>(), x);
  check_module(std::make_shared<nn::Tanh>(), x);
  check_module(std::make_shared<nn::SiLU>(), x);
  // values at one point
  Tensor one = from_vector(std::vector<double>{1.0}, {1}, DType::f64);
  EXPECT_NEAR(nn::GELU().forward(one).item(), 0.5 * (1 + std::erf(1 / std::sqrt(2.0))), 1e-12);
  EXPECT_NEAR(nn::GELU(true).forward(one).item(),
              0.5 * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (1 + 0.044715))), 1e-12);
  EXPECT_NEAR(nn::SiLU().forward(one).item(), 1 / (1 + std::exp(-1.0)), 1e-12);
}

TEST(NnLayers, DropoutTrainAndEval) {
  auto drop = std::make_shared<nn::Dropout>(0.5);
  Tensor x = input({4, 16}, 13);
  drop->eval();
  EXPECT_TRUE(drop->forward(x).same(x));  // the identity in eval mode
  drop->train();
  manual_seed(5);
  std::vector<double> y = drop->forward(x).to_vector(), xv = x.to_vector();
  int zeros = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (y[i] == 0) {
      ++zeros;
    } else {
      EXPECT_DOUBLE_EQ(y[i], 2 * xv[i]);
    }
  }
  EXPECT_GT(zeros, 8);
  EXPECT_LT(zeros, 56);
  // with the generator reset before each evaluation the function is deterministic
  expect_gradients_match(
      [&] {
        manual_seed(5);
        return drop->forward(x);
      },
      {x});
  EXPECT_THROW(nn::Dropout(1.5), Error);
}

TEST(NnLayers, CausalSelfAttentionGradient) {
  auto attn = std::make_shared<nn::CausalSelfAttention>(8, 2, 0.0, 0.0, DType::f64);
  EXPECT_EQ(attn->qkv->weight.shape(), (Shape{24, 8}));
  perturb_parameters(*attn, 14);
  check_module(attn, input({2, 4, 8}, 15));
}

TEST(NnLayers, CausalSelfAttentionMatchesReference) {
  // One head of width 2: compare with attention written out by hand.
  auto attn = std::make_shared<nn::CausalSelfAttention>(4, 2, 0.0, 0.0, DType::f64);
  perturb_parameters(*attn, 16);
  Tensor x = input({1, 3, 4}, 17);
  std::vector<double> y = attn->forward(x).to_vector();
  NoGradGuard no_grad;
  Tensor qkv = attn->qkv->forward(x);  // [1, 3, 12]
  std::vector<double> z = qkv.to_vector(), mixed(12, 0.0);
  const int t_len = 3, c = 4, d = 2;
  for (int h = 0; h < 2; ++h)
    for (int t = 0; t < t_len; ++t) {
      std::vector<double> w(t + 1);
      double mx = -1e300, total = 0;
      for (int s = 0; s <= t; ++s) {
        double dot = 0;
        for (int e = 0; e < d; ++e) dot += z[t * 12 + h * d + e] * z[s * 12 + c + h * d + e];
        w[s] = dot / std::sqrt(double(d));
        mx = std::max(mx, w[s]);
      }
      for (auto& v : w) total += (v = std::exp(v - mx));
      for (int s = 0; s <= t; ++s)
        for (int e = 0; e < d; ++e) mixed[t * c + h * d + e] += w[s] / total * z[s * 12 + 2 * c + h * d + e];
    }
  std::vector<double> expected = attn->proj->forward(from_vector(mixed, {1, 3, 4}, DType::f64)).to_vector();
  ASSERT_EQ(y.size(), expected.size());
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expected[i], 1e-12) << i;
}

TEST(NnLayers, AttentionOutputAtPositionTIgnoresLaterPositions) {
  auto attn = std::make_shared<nn::CausalSelfAttention>(8, 4, 0.0, 0.0, DType::f64);
  perturb_parameters(*attn, 18);
  const int64_t t_len = 6;
  Tensor x = randn({2, t_len, 8}, DType::f64, RngState{19, 0});
  Tensor y = attn->forward(x);
  for (int64_t t = 0; t < t_len - 1; ++t) {
    // change every input at positions > t
    Tensor changed = x.clone();
    {
      NoGradGuard no_grad;
      Tensor tail = changed.slice(1, t + 1, t_len);
      tail.copy_(randn(tail.shape(), DType::f64, RngState{20, static_cast<uint64_t>(t) << 20}, 0.0, 5.0));
    }
    Tensor y2 = attn->forward(changed);
    for (int64_t s = 0; s < t_len; ++s) {
      std::vector<double> a = y.slice(1, s, s + 1).to_vector(), b = y2.slice(1, s, s + 1).to_vector();
      if (s <= t) {
        EXPECT_EQ(a, b) << "position " << s << " changed when positions > " << t << " changed";
      } else {
        EXPECT_NE(a, b) << "position " << s << " did not change";
      }
    }
  }
}

TEST(NnLayers, MlpAndTransformerBlockGradients) {
  auto mlp = std::make_shared<nn::MLP>(4, 0.0, DType::f64);
  EXPECT_EQ(mlp->fc->weight.shape(), (Shape{16, 4}));
  EXPECT_EQ(mlp->proj->weight.shape(), (Shape{4, 16}));
  perturb_parameters(*mlp, 21);
  check_module(mlp, input({2, 3, 4}, 22));

  auto block = std::make_shared<nn::TransformerBlock>(8, 2, 0.0, DType::f64);
  perturb_parameters(*block, 23);
  check_module(block, input({2, 3, 8}, 24), {.max_elements_per_input = 24});
}

TEST(NnLayers, ResidualParallelSequentialGradients) {
  auto res = std::make_shared<nn::Residual>(std::make_shared<nn::Linear>(5, 5, true, DType::f64));
  EXPECT_EQ(res->named_parameters()[0].first, "fn.weight");
  perturb_parameters(*res, 25);
  check_module(res, input({3, 5}, 26));
  Tensor x = input({3, 5}, 27);
  {
    Tensor expected = add(x, res->fn()->forward(x));
    EXPECT_EQ(res->forward(x).to_vector(), expected.to_vector());
  }

  auto par = std::make_shared<nn::Parallel>();
  par->add(std::make_shared<nn::Linear>(5, 2, true, DType::f64));
  par->add(std::make_shared<nn::Linear>(5, 3, true, DType::f64), "wide");
  EXPECT_EQ(par->forward(x).shape(), (Shape{3, 5}));
  EXPECT_EQ(par->named_parameters()[2].first, "wide.weight");
  perturb_parameters(*par, 28);
  check_module(par, input({2, 5}, 29));

  for (Policy policy : {Policy::save_all(), Policy::every_layer(), Policy::every_k(2)}) {
    SCOPED_TRACE(policy.to_string());
    ScopedPolicy scope(policy);
    auto seq = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(5, 6, true, DType::f64), std::make_shared<nn::Tanh>(),
        std::make_shared<nn::Linear>(6, 4, true, DType::f64), std::make_shared<nn::GELU>()});
    perturb_parameters(*seq, 30);
    check_module(seq, input({3, 5}, 31));
  }
}

TEST(NnLayers, LambdaModule) {
  auto square_it = std::make_shared<nn::Lambda>([](const Tensor& x) { return square(x); }, "Square");
  EXPECT_EQ(square_it->type_name(), "Square");
  check_module(square_it, input({2, 3}, 32));
}
