// Fused attention (scaled_dot_product_attention) beyond the op harness: saved and workspace bytes
// from the allocator's counters (linear in T, never T^2), independence of the thread count, the
// explicit attention of nn::CausalSelfAttention as a reference (dropout included), policies
// bitwise equal, and errors that leave state untouched.
#include <gtest/gtest.h>

#include <cmath>

#include "checkpoint_models.h"
#include "gpt_steps.h"
#include "remat/backend.h"
#include "remat/nn.h"
#include "remat/remat.h"

using namespace remat;
using remat::testing::bitwise_equal;
using remat::testing::gpt_gradients;
using remat::testing::token_ids;

namespace {

struct Qkv {
  Tensor q, k, v;
};
Qkv make_qkv(int64_t b, int64_t h, int64_t t, int64_t d, DType dtype, uint64_t seed) {
  Qkv x{randn({b, h, t, d}, dtype, RngState{seed, 0}), randn({b, h, t, d}, dtype, RngState{seed + 1, 0}),
        randn({b, h, t, d}, dtype, RngState{seed + 2, 0})};
  x.q.requires_grad_();
  x.k.requires_grad_();
  x.v.requires_grad_();
  return x;
}

size_t saved_bytes_of_attention(int64_t b, int64_t h, int64_t t, int64_t d) {
  Qkv x = make_qkv(b, h, t, d, DType::f32, 3);
  const size_t before = memory::live_bytes(memory::Tag::saved);
  Tensor y = scaled_dot_product_attention(x.q, x.k, x.v);
  return memory::live_bytes(memory::Tag::saved) - before;
}

}  // namespace

// The op keeps q, k, v, its output and one log-sum-exp per (b, h, query): exactly
// 4 * B*H*T*D + B*H*T elements, linear in T.
TEST(Attention, SavedBytesAreQkvOutputAndOneLogSumExpPerRow) {
  const int64_t b = 2, h = 3, d = 8;
  for (int64_t t : {16, 64, 256}) {
    const size_t expected = static_cast<size_t>(4 * b * h * t * d + b * h * t) * sizeof(float);
    EXPECT_EQ(saved_bytes_of_attention(b, h, t, d), expected) << "T = " << t;
  }
  EXPECT_EQ(saved_bytes_of_attention(b, h, 512, d), 2 * saved_bytes_of_attention(b, h, 256, d));
}

// The explicit attention keeps the [B, H, T, T] probabilities; the fused one keeps none of that.
TEST(Attention, FusedNnAttentionSavesNoSquareTensor) {
  const int64_t b = 2, t = 128, c = 32, heads = 4;
  Tensor x = randn({b, t, c}, DType::f32, RngState{5, 0}).requires_grad_();
  auto saved_by = [&](bool fused) {
    nn::CausalSelfAttention attn(c, heads, 0.0, 0.0, DType::f32, fused);
    ScopedPolicy policy(Policy::save_all());
    const size_t before = memory::live_bytes(memory::Tag::saved);
    Tensor y = attn.forward(x);
    return memory::live_bytes(memory::Tag::saved) - before;
  };
  const size_t square = static_cast<size_t>(b * heads * t * t) * sizeof(float);
  const size_t fused = saved_by(true), explicit_attention = saved_by(false);
  EXPECT_LT(fused, square / 2) << "fused attention keeps " << fused << " bytes";
  EXPECT_GE(explicit_attention, fused + square);
}

// Peak bytes of the backward beyond what is live before it: the three input gradients, and per
// thread a workspace of packed copies (O(T * D)), far below the [T, T] probabilities.
TEST(Attention, BackwardWorkspaceIsLinearInT) {
  const int64_t b = 1, h = 2, t = 1024, d = 16;
  Qkv x = make_qkv(b, h, t, d, DType::f32, 7);
  Tensor y = scaled_dot_product_attention(x.q, x.k, x.v);
  Tensor gy = randn(y.shape(), DType::f32, RngState{8, 0});
  memory::reset_peaks();
  const size_t live_before = memory::stats().live_total;
  backward({y}, {gy});
  const size_t extra = memory::stats().peak_total - live_before;
  const size_t gradients = 3 * x.q.nbytes();
  // per thread: at most 3 [T + 32, D + 8] packed copies of K, V, Q, dO and dQ each, plus tiles
  const size_t workspace_bound =
      static_cast<size_t>(num_threads()) * (6 * (t + 32) * (d + 8) + 8 * 32 * 32 + t) * sizeof(float);
  EXPECT_LE(extra, gradients + workspace_bound);
  EXPECT_LT(extra, static_cast<size_t>(b * h * t * t) * sizeof(float) / 2);
}

TEST(Attention, ResultsDoNotDependOnTheThreadCount) {
  for (DType dtype : {DType::f32, DType::f64}) {
    auto run = [&](int threads) {
      set_num_threads(threads);
      Qkv x = make_qkv(3, 4, 70, 12, dtype, 11);
      Tensor y = scaled_dot_product_attention(x.q, x.k, x.v, true, 0.1, RngState{12, 0});
      backward({y}, {randn(y.shape(), dtype, RngState{13, 0})});
      return TensorList{y, x.q.grad(), x.k.grad(), x.v.grad()};
    };
    const int threads = num_threads();
    TensorList one = run(1), two = run(2);
    set_num_threads(threads);
    for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(bitwise_equal(one[i], two[i])) << dtype_name(dtype) << " " << i;
  }
}

// nn::CausalSelfAttention fused and written out (matmul, mask, softmax, dropout) agree, with the
// same dropout mask from the same generator state.
TEST(Attention, FusedMatchesExplicitNnAttentionWithDropout) {
  const int64_t b = 2, t = 37, c = 24, heads = 3;
  Tensor x = randn({b, t, c}, DType::f64, RngState{21, 0});
  auto run = [&](bool fused) {
    nn::CausalSelfAttention attn(c, heads, 0.3, 0.0, DType::f64, fused);
    for (auto& p : attn.parameters()) {
      NoGradGuard no_grad;
      p.copy_(randn(p.shape(), DType::f64, RngState{22 + static_cast<uint64_t>(p.numel()), 0}, 0.0, 0.3));
    }
    Tensor xi = x.detach().requires_grad_();
    manual_seed(23);
    Tensor y = attn.forward(xi);
    const RngState after = rng_state();
    backward({y}, {randn(y.shape(), DType::f64, RngState{24, 0})});
    TensorList out{y, xi.grad()};
    for (auto& p : attn.parameters()) out.push_back(p.grad());
    return std::make_pair(out, after);
  };
  auto [fused, fused_rng] = run(true);
  auto [explicit_attention, explicit_rng] = run(false);
  EXPECT_EQ(fused_rng, explicit_rng) << "both claim one word per probability";
  EXPECT_EQ(fused_rng.offset, static_cast<uint64_t>(b * heads * t * t + 3) / 4 * 4) << "attention dropout drew its words";
  ASSERT_EQ(fused.size(), explicit_attention.size());
  for (size_t i = 0; i < fused.size(); ++i) {
    std::vector<double> a = fused[i].to_vector(), e = explicit_attention[i].to_vector();
    ASSERT_EQ(a.size(), e.size());
    double worst = 0;
    for (size_t j = 0; j < a.size(); ++j) worst = std::max(worst, std::abs(a[j] - e[j]) / (1 + std::abs(e[j])));
    EXPECT_LT(worst, 1e-12) << "tensor " << i;
  }
}

// A GPT with attention dropout: every policy gives the save-all gradients bit for bit (the fused
// op is the same kernel in the first run and in the recomputation, and its mask is replayed).
TEST(Attention, GptGradientsBitwiseEqualAcrossPolicies) {
  nn::GPTConfig config{.vocab = 13, .layers = 3, .width = 16, .heads = 2, .seq = 40, .dropout = 0.2, .dtype = DType::f32, .seed = 4};
  nn::GPT model(config);
  Tensor ids = token_ids(2, 40, 13, 31);
  Tensor targets = token_ids(2, 40, 13, 32);
  auto grads_under = [&](const Policy& policy) { return gpt_gradients(model, ids, targets, policy, 33); };
  TensorList reference = grads_under(Policy::save_all());
  for (const char* policy : {"every-layer", "every-k:2", "selective:scaled_dot_product_attention", "selective:matmul"}) {
    TensorList g = grads_under(Policy::parse(policy));
    ASSERT_EQ(g.size(), reference.size());
    for (size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(bitwise_equal(g[i], reference[i])) << policy << " parameter " << i;
  }
}

TEST(Attention, ErrorsNameTheProblemAndLeaveTheGeneratorAlone) {
  auto t = [](Shape shape, DType dtype = DType::f32) { return randn(shape, dtype, RngState{1, 0}); };
  Tensor q = t({1, 2, 4, 3}), k = t({1, 2, 4, 3}), v = t({1, 2, 4, 3});
  Tensor wide_k = t({1, 2, 4, 5}), short_v = t({1, 2, 3, 3}), v64 = t({1, 2, 4, 3}, DType::f64), flat = t({4, 3}),
         other_heads = t({1, 3, 4, 3}), no_keys = t({1, 2, 0, 3});
  manual_seed(3);
  const RngState before = rng_state();
  auto expect_error = [&](auto&& call, const std::string& needle) {
    try {
      call();
      ADD_FAILURE() << "no error (expected one mentioning '" << needle << "')";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(rng_state(), before) << needle;
  };
  expect_error([&] { scaled_dot_product_attention(q, wide_k, v, true, 0.5); }, "head sizes");
  expect_error([&] { scaled_dot_product_attention(q, k, short_v, true, 0.5); }, "positions");
  expect_error([&] { scaled_dot_product_attention(q, k, v64, true, 0.5); }, "dtype");
  expect_error([&] { scaled_dot_product_attention(q, k, v, true, 1.5); }, "dropout probability");
  expect_error([&] { scaled_dot_product_attention(flat, k, v); }, "expects q");
  expect_error([&] { scaled_dot_product_attention(q, other_heads, v); }, "batch and head axes");
  expect_error([&] { scaled_dot_product_attention(q, k, v, true, 0.0, true, std::nan("")); }, "scale");
  expect_error([&] { scaled_dot_product_attention(q, no_keys, no_keys, true, 0.5); }, "no keys");
}

TEST(Attention, EmptyShapesGiveEmptyOutputsAndZeroGradients) {
  Qkv x = make_qkv(1, 2, 0, 3, DType::f32, 41);
  Tensor y = scaled_dot_product_attention(x.q, x.k, x.v, false);
  EXPECT_EQ(y.shape(), (Shape{1, 2, 0, 3}));
  Tensor q = randn({2, 3, 4}).requires_grad_(), k = randn({2, 5, 4}).requires_grad_(),
         v = randn({2, 5, 0}).requires_grad_();
  Tensor z = scaled_dot_product_attention(q, k, v, false);
  EXPECT_EQ(z.shape(), (Shape{2, 3, 0}));
  sum(z).backward();
  EXPECT_EQ(q.grad().to_vector(), std::vector<double>(24, 0.0));
  EXPECT_EQ(k.grad().to_vector(), std::vector<double>(40, 0.0));
}
