// remat::CustomOp wrapping a hand-written kernel: a fused silu, y = x * sigmoid(x), written as raw
// loops over data<double>() / data<float>() in forward and backward. Its backward reads the saved
// input twice (once to recompute sigmoid, once for the x factor). Checked against the float64
// reference by finite differences (with the op harness), against the built-in silu, and for the
// custom-op contract: saved values are counted and freed, retain_graph, several uses, unused
// outputs receive zero gradients, nothing inside the forward is taped.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>

#include "op_harness.h"
#include "remat/memory.h"
#include "remat/remat.h"

using namespace remat;
using namespace remat::test;

namespace {

std::atomic<int> backward_calls{0};
std::atomic<int> saved_reads{0};

template <class T>
void silu_forward_kernel(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (T(1) + std::exp(-x[i]));
}

// gx = gy * s * (1 + x * (1 - s)), s = sigmoid(x); the saved x is read in two passes.
template <class T>
void silu_backward_kernel(const Tensor& saved_x, const T* gy, T* gx, int64_t n) {
  const T* x = saved_x.data<T>();  // first read: sigmoid
  ++saved_reads;
  for (int64_t i = 0; i < n; ++i) gx[i] = T(1) / (T(1) + std::exp(-x[i]));
  const T* x2 = saved_x.data<T>();  // second read: the x factor
  ++saved_reads;
  for (int64_t i = 0; i < n; ++i) gx[i] = gy[i] * gx[i] * (T(1) + x2[i] * (T(1) - gx[i]));
}

const CustomOp& fused_silu_op() {
  static const CustomOp op{
      "fused_silu",
      [](const TensorList& in, SaveContext& ctx) {
        Tensor x = in[0].contiguous();  // a plain call inside the forward: not taped
        Tensor y = Tensor::empty(x.shape(), x.dtype());
        if (x.dtype() == DType::f64)
          silu_forward_kernel(x.data<double>(), y.data<double>(), x.numel());
        else
          silu_forward_kernel(x.data<float>(), y.data<float>(), x.numel());
        ctx.save(x);
        return TensorList{y};
      },
      [](const TensorList& grads, const SavedValues& saved) {
        ++backward_calls;
        Tensor gy = grads[0].contiguous();
        const Tensor& x = saved.at(0);
        Tensor gx = Tensor::empty(x.shape(), x.dtype());
        if (x.dtype() == DType::f64)
          silu_backward_kernel<double>(x, gy.data<double>(), gx.data<double>(), x.numel());
        else
          silu_backward_kernel<float>(x, gy.data<float>(), gx.data<float>(), x.numel());
        return TensorList{gx};
      }};
  return op;
}

Tensor fused_silu(const Tensor& x) { return fused_silu_op()({x})[0]; }

double silu_ref(double x) { return x / (1.0 + std::exp(-x)); }

OpCase fused_silu_case(const std::string& name, Shape shape, bool transposed) {
  OpCase c;
  c.name = name;
  c.make_inputs = [=](Rng& r) { return Inputs{floating("x", shape, r.uniform_vector(numel_of(shape), -4, 4))}; };
  c.apply = [=](const TensorList& in) { return TensorList{fused_silu(transposed ? in[0].transpose(0, 1) : in[0])}; };
  c.reference = [=](const std::vector<Array>& a) {
    Array x = transposed ? ref::permute(a[0], {1, 0}) : a[0];
    return std::vector<Array>{ref::map(x, silu_ref)};
  };
  return c;
}

class FusedSilu : public ::testing::TestWithParam<DType> {};

TEST_P(FusedSilu, ForwardMatchesReference) {
  for (bool transposed : {false, true}) {
    CheckResult r = check_forward(fused_silu_case("fused_silu", {5, 7}, transposed), GetParam());
    EXPECT_TRUE(r.ok) << r.message;
  }
}

TEST_P(FusedSilu, GradientMatchesFiniteDifferences) {
  for (bool transposed : {false, true}) {
    CheckResult r = check_case_gradient(fused_silu_case("fused_silu", {5, 7}, transposed), GetParam());
    EXPECT_TRUE(r.ok) << r.message;
  }
}

TEST_P(FusedSilu, MatchesBuiltinSilu) {
  DType d = GetParam();
  double tol = d == DType::f64 ? 1e-14 : 1e-6;
  Tensor x0 = randn({6, 9}, d, RngState{42, 0}, 0.0, 2.0);
  Tensor a = x0.detach().requires_grad_(), b = x0.detach().requires_grad_();
  Tensor r = randn({6, 9}, d, RngState{43, 0});
  Tensor ya = fused_silu(a), yb = silu(b);
  auto va = ya.to_vector(), vb = yb.to_vector();
  for (size_t i = 0; i < va.size(); ++i) EXPECT_NEAR(va[i], vb[i], tol * (1 + std::abs(vb[i])));
  remat::backward({ya}, {r});
  remat::backward({yb}, {r});
  auto ga = a.grad().to_vector(), gb = b.grad().to_vector();
  for (size_t i = 0; i < ga.size(); ++i) EXPECT_NEAR(ga[i], gb[i], tol * (1 + std::abs(gb[i])));
  EXPECT_EQ(a.grad().dtype(), d);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FusedSilu, ::testing::Values(DType::f32, DType::f64),
                         [](const ::testing::TestParamInfo<DType>& info) { return dtype_name(info.param); });

TEST(CustomOp, BackwardReadsTheSavedValueTwicePerCall) {
  Tensor x = randn({3, 4}, DType::f64, RngState{1, 0}).requires_grad_();
  Tensor loss = sum(fused_silu(x));
  int calls = backward_calls, reads = saved_reads;
  loss.backward();
  EXPECT_EQ(backward_calls - calls, 1);
  EXPECT_EQ(saved_reads - reads, 2);
}

TEST(CustomOp, RecordsOneNodeAndTapesNothingInside) {
  Tensor x = randn({3, 4}, DType::f64, RngState{2, 0}).requires_grad_();
  Tensor y = fused_silu(x.transpose(0, 1));  // contiguous() inside the forward is not recorded
  ASSERT_TRUE(y.requires_grad());
  EXPECT_EQ(y.grad_fn()->name(), "custom:fused_silu");
  ASSERT_EQ(y.grad_fn()->next_edges.size(), 1u);
  EXPECT_EQ(y.grad_fn()->next_edges[0].node->name(), "permute");  // straight to the input's producer
  {
    NoGradGuard guard;
    EXPECT_FALSE(fused_silu(x).requires_grad());
  }
}

TEST(CustomOp, SavedValuesAreCountedAndFreed) {
  const memory::Stats start = memory::stats();
  {
    Tensor x = randn({8, 8}, DType::f64, RngState{3, 0}).requires_grad_();  // 512 B, other
    Tensor loss = sum(fused_silu(x));
    EXPECT_EQ(memory::stats().live(memory::Tag::saved), start.live(memory::Tag::saved) + 512);
    EXPECT_EQ(loss.grad_fn()->next_edges[0].node->saved_bytes(), 512u);
    loss.backward();
    EXPECT_EQ(memory::stats().live(memory::Tag::saved), start.live(memory::Tag::saved));
  }
  EXPECT_EQ(memory::stats().live_bytes, start.live_bytes);
}

TEST(CustomOp, RetainGraphRunsTheBackwardAgain) {
  Tensor x = from_vector(std::vector<double>{-1.0, 0.5, 2.0}, {3}, DType::f64).requires_grad_();
  Tensor loss = sum(fused_silu(x));
  loss.backward(Tensor(), /*retain_graph=*/true);
  auto once = x.grad().to_vector();
  loss.backward();
  auto twice = x.grad().to_vector();
  for (size_t i = 0; i < once.size(); ++i) EXPECT_DOUBLE_EQ(twice[i], 2 * once[i]);
  try {
    loss.backward();
    ADD_FAILURE() << "a third backward without retained graph must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("custom:fused_silu"), std::string::npos) << e.what();
  }
}

TEST(CustomOp, SeveralUsesKeepTheirOwnSavedValues) {
  // z = fused_silu(x) * fused_silu(2x) against the built-in silu
  Tensor x0 = randn({4, 5}, DType::f64, RngState{4, 0});
  Tensor a = x0.detach().requires_grad_(), b = x0.detach().requires_grad_();
  sum(mul(fused_silu(a), fused_silu(mul_scalar(a, 2.0)))).backward();
  sum(mul(silu(b), silu(mul_scalar(b, 2.0)))).backward();
  auto ga = a.grad().to_vector(), gb = b.grad().to_vector();
  for (size_t i = 0; i < ga.size(); ++i) EXPECT_NEAR(ga[i], gb[i], 1e-13 * (1 + std::abs(gb[i])));
}

TEST(CustomOp, SavedValueModifiedInPlaceIsReported) {
  Tensor x = randn({3}, DType::f64, RngState{5, 0}).requires_grad_();
  Tensor h = mul_scalar(x, 1.0);
  Tensor y = fused_silu(h);  // saves h (contiguous: the same block)
  h.fill_(0.0);
  try {
    sum(y).backward();
    ADD_FAILURE() << "overwritten saved value not detected";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("custom:fused_silu"), std::string::npos) << m;
    EXPECT_NE(m.find("modified in place"), std::string::npos) << m;
  }
}

TEST(CustomOp, UnusedOutputsReceiveZeroGradients) {
  // two inputs, two outputs: (a * b, a + b); only the first is used
  static bool second_grad_was_zero = false;
  static const CustomOp op{
      "mul_and_add",
      [](const TensorList& in, SaveContext& ctx) {
        ctx.save(in[0]);
        ctx.save(in[1]);
        return TensorList{mul(in[0], in[1]), add(in[0], in[1])};
      },
      [](const TensorList& g, const SavedValues& saved) {
        second_grad_was_zero = g[1].defined() && g[1].shape() == g[0].shape();
        for (double v : g[1].to_vector()) second_grad_was_zero = second_grad_was_zero && v == 0.0;
        return TensorList{add(mul(g[0], saved[1]), g[1]), add(mul(g[0], saved[0]), g[1])};
      }};
  Tensor a = from_vector(std::vector<double>{1, 2}, {2}, DType::f64).requires_grad_();
  Tensor b = from_vector(std::vector<double>{3, 5}, {2}, DType::f64).requires_grad_();
  TensorList outs = op({a, b});
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_EQ(outs[1].to_vector(), (std::vector<double>{4, 7}));
  sum(outs[0]).backward();
  EXPECT_TRUE(second_grad_was_zero);
  EXPECT_EQ(a.grad().to_vector(), (std::vector<double>{3, 5}));
  EXPECT_EQ(b.grad().to_vector(), (std::vector<double>{1, 2}));
}

TEST(CustomOp, MissingFunctionsAreRejected) {
  CustomOp incomplete{"incomplete", nullptr, nullptr};
  try {
    incomplete({ones({2})});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("incomplete"), std::string::npos);
  }
}

// A declared side effect runs once per call, whatever recomputes the forward (a region's re-run,
// dynamic: rematerialization); an effect hidden in the forward runs again (so the count can fail).
TEST(CustomOp, ADeclaredSideEffectRunsOncePerCallUnderEveryPolicy) {
  for (const Policy& policy : {Policy::save_all(), Policy::every_layer(), Policy::dynamic(1536)}) {
    SCOPED_TRACE(policy.to_string());
    int forward_runs = 0, effects = 0;
    CustomOp doubled{"doubled",
                     [&](const TensorList& in, SaveContext&) {
                       ++forward_runs;
                       return TensorList{mul_scalar(in[0], 2.0)};
                     },
                     [](const TensorList& grads, const SavedValues&) { return TensorList{mul_scalar(grads[0], 2.0)}; },
                     [&](const TensorList&, const TensorList&) { ++effects; }};
    Chain chain;
    for (int i = 0; i < 3; ++i) {
      chain.add([&](const Tensor& h) { return tanh(doubled({tanh(h)})[0]); });
    }
    ScopedPolicy scoped(policy);
    reset_counters();
    Tensor x = randn({64}, DType::f64, RngState{1, 0}).requires_grad_();
    sum(chain.forward(x)).backward();
    EXPECT_EQ(effects, 3);
    if (policy.recomputes()) {
      EXPECT_GT(forward_runs, 3) << "nothing was recomputed; the test would prove nothing";
    }
  }
}

}  // namespace
