// Focused tests of the row kernels (softmax, log-softmax, layer norm, RMS norm), the indexing
// kernels (embedding, cross entropy, dropout) and concat/split, for what the table-driven op
// harness (test_ops.cpp) does not check: shapes large enough for the parallel paths, the
// thread-count independence of reductions and masks, exact zeros and exact copies, the
// parameter-only backward, the RNG use of dropout, and the validation messages. Values and
// gradients on small shapes, other axes and strided operands are rows of the harness.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "emulated_backend.h"
#include "op_reference.h"
#include "remat/backend.h"
#include "remat/ops.h"

using namespace remat;
namespace ref = remat::test::ref;
using remat::test::Array;

namespace {

Tensor random(const Shape& shape, DType dtype, uint64_t seed, double scale = 1.0) {
  return randn(shape, dtype, RngState{seed, 0}, 0.0, scale);
}

// Sets and restores the CPU thread count.
class ThreadCount {
 public:
  explicit ThreadCount(int threads) : previous_(num_threads()) { set_num_threads(threads); }
  ~ThreadCount() { set_num_threads(previous_); }

 private:
  int previous_;
};

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::abs(want[i])) << what << " at flat index " << i;
}

double tol_for(DType dtype) { return dtype == DType::f32 ? 2e-5 : 1e-12; }

// Expects fn to throw remat::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const Error& e) {
    std::string message = e.what();
    for (const auto& p : parts) EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' not in: " << message;
    return;
  }
  ADD_FAILURE() << "no remat::Error thrown";
}

// The float64 reference of `x` (any dtype) as a plain array.
Array array_of(const Tensor& x) { return {x.shape(), x.to_vector()}; }

class RowsDtype : public ::testing::TestWithParam<DType> {};

}  // namespace

// ---------------------------------------------------------------- softmax

// Shapes large enough for the parallel row loops (the harness rows are small).
TEST_P(RowsDtype, SoftmaxAndLogSoftmaxLargeRows) {
  const DType dt = GetParam();
  Tensor x = random({300, 200}, dt, 1, 3.0);
  const Array xa = array_of(x);
  expect_close(softmax(x).to_vector(), ref::softmax(xa, -1, false).v, tol_for(dt), tol_for(dt) * 1e-2, "softmax");
  expect_close(log_softmax(x).to_vector(), ref::softmax(xa, -1, true).v, tol_for(dt), tol_for(dt), "log_softmax");
}

TEST_P(RowsDtype, SoftmaxIsStableForLargeLogits) {
  const DType dt = GetParam();
  Tensor x = from_vector(std::vector<double>{1000, 1001, 1002, -1000, -1001, -1002}, {2, 3}, dt);
  const Array xa = array_of(x);
  auto y = softmax(x).to_vector();
  auto ly = log_softmax(x).to_vector();
  for (double v : y) EXPECT_TRUE(std::isfinite(v));
  expect_close(y, ref::softmax(xa, -1, false).v, tol_for(dt), 1e-7, "softmax large");
  expect_close(ly, ref::softmax(xa, -1, true).v, tol_for(dt), 1e-5, "log_softmax large");
}

TEST(RowsSoftmax, Validation) {
  expect_error([] { softmax(zeros({2, 3}), 2); }, {"softmax", "axis 2", "[2, 3]"});
  expect_error([] { log_softmax(zeros({2, 3}), -3); }, {"log_softmax", "axis -3", "[2, 3]"});
  expect_error([] { softmax(from_indices({1, 2}, {2})); }, {"softmax", "i64"});
  expect_error([] { softmax(zeros({})); }, {"softmax", "rank"});
}

// ---------------------------------------------------------------- layer norm / rms norm

// Many rows (the parallel path), with every combination of the optional parameters and two eps.
TEST_P(RowsDtype, LayerNormAndRmsNormLargeRows) {
  const DType dt = GetParam();
  const Shape shape{300, 130};
  Tensor x = add_scalar(random(shape, dt, 4, 2.0), 0.5);
  Tensor w = random({130}, dt, 5), b = random({130}, dt, 6);
  const Array xa = array_of(x), wa = array_of(w), ba = array_of(b);
  const double tol = dt == DType::f32 ? 1e-5 : 1e-12;
  expect_close(layer_norm(x, w, b, 1e-5).to_vector(), ref::layer_norm(xa, &wa, &ba, 1e-5).v, tol, tol,
               "layer_norm affine");
  expect_close(layer_norm(x, Tensor(), Tensor(), 1e-3).to_vector(), ref::layer_norm(xa, nullptr, nullptr, 1e-3).v, tol,
               tol, "layer_norm plain");
  expect_close(layer_norm(x, w, Tensor()).to_vector(), ref::layer_norm(xa, &wa, nullptr, 1e-5).v, tol, tol,
               "layer_norm weight only");
  expect_close(layer_norm(x, Tensor(), b).to_vector(), ref::layer_norm(xa, nullptr, &ba, 1e-5).v, tol, tol,
               "layer_norm bias only");
  expect_close(rms_norm(x, w, 1e-6).to_vector(), ref::rms_norm(xa, &wa, 1e-6).v, tol, tol, "rms_norm affine");
  expect_close(rms_norm(x, Tensor(), 1e-2).to_vector(), ref::rms_norm(xa, nullptr, 1e-2).v, tol, tol, "rms_norm plain");
}

TEST(RowsNorm, LayerNormOnlyParameterGradients) {
  // x constant: only weight and bias gradients are requested
  Tensor x = random({40, 8}, DType::f64, 13);
  Tensor w = random({8}, DType::f64, 14).requires_grad_(), b = random({8}, DType::f64, 15).requires_grad_();
  Tensor y = layer_norm(x, w, b);
  Tensor gy = random({40, 8}, DType::f64, 16);
  TensorList g = remat::grad({y}, {w, b}, {gy});
  auto xhat = ref::layer_norm(array_of(x), nullptr, nullptr, 1e-5).v;
  auto gyv = gy.to_vector();
  std::vector<double> gw(8, 0), gb(8, 0);
  for (int r = 0; r < 40; ++r)
    for (int c = 0; c < 8; ++c) gw[c] += gyv[r * 8 + c] * xhat[r * 8 + c], gb[c] += gyv[r * 8 + c];
  expect_close(g[0].to_vector(), gw, 1e-10, 1e-10, "gweight");
  expect_close(g[1].to_vector(), gb, 1e-10, 1e-10, "gbias");
}

TEST(RowsNorm, ParameterGradientsDoNotDependOnThreadCount) {
  Tensor x = random({1000, 96}, DType::f32, 19);
  Tensor gy = random({1000, 96}, DType::f32, 20);
  auto run = [&](int threads) {
    ThreadCount tc(threads);
    Tensor w = random({96}, DType::f32, 21).requires_grad_(), b = random({96}, DType::f32, 22).requires_grad_();
    Tensor xr = x.detach().requires_grad_();
    TensorList g1 = remat::grad({layer_norm(xr, w, b)}, {xr, w, b}, {gy});
    TensorList g2 = remat::grad({rms_norm(xr, w)}, {xr, w}, {gy});
    return std::vector<std::vector<double>>{g1[0].to_vector(), g1[1].to_vector(), g1[2].to_vector(),
                                            g2[0].to_vector(), g2[1].to_vector()};
  };
  auto one = run(1), two = run(2);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_EQ(one[i], two[i]) << "gradient " << i << " differs bitwise";
}

TEST(RowsNorm, Validation) {
  Tensor x = zeros({2, 4});
  expect_error([&] { layer_norm(x, zeros({3}), Tensor()); }, {"layer_norm", "weight", "[3]", "[2, 4]"});
  expect_error([&] { layer_norm(x, Tensor(), zeros({4, 1})); }, {"layer_norm", "bias", "[4, 1]"});
  expect_error([&] { layer_norm(x, zeros({4}, DType::f64), Tensor()); }, {"layer_norm", "f64", "f32"});
  expect_error([&] { layer_norm(x, Tensor(), Tensor(), 0.0); }, {"layer_norm", "eps"});
  expect_error([&] { rms_norm(x, zeros({5})); }, {"rms_norm", "weight", "[5]"});
  expect_error([&] { rms_norm(x, Tensor(), -1.0); }, {"rms_norm", "eps", "-1"});
  expect_error([&] { rms_norm(zeros({3, 0}), Tensor()); }, {"rms_norm", "[3, 0]"});
}

// ---------------------------------------------------------------- embedding

TEST(RowsEmbedding, LargeScatterAddIsDeterministic) {
  // 4000 ids of dimension 64 into 37 rows: parallel path; compare with a serial reference and
  // across thread counts (bitwise).
  std::vector<int64_t> idv(4000);
  for (size_t i = 0; i < idv.size(); ++i) idv[i] = static_cast<int64_t>((i * 7919 + i / 3) % 37);
  Tensor ids = from_indices(idv, {4000});
  Tensor gy = random({4000, 64}, DType::f32, 26);
  auto run = [&](int threads) {
    ThreadCount tc(threads);
    Tensor table = random({37, 64}, DType::f32, 27).requires_grad_();
    Tensor y = embedding(table, ids);
    return remat::grad({y}, {table}, {gy})[0].to_vector();
  };
  auto one = run(1), two = run(2);
  EXPECT_EQ(one, two);
  auto gyv = gy.to_vector();
  std::vector<double> want(37 * 64, 0.0);
  for (size_t i = 0; i < idv.size(); ++i)
    for (int d = 0; d < 64; ++d) want[idv[i] * 64 + d] += gyv[i * 64 + d];
  expect_close(one, want, 1e-5, 1e-4, "embedding scatter-add");
}

TEST(RowsEmbedding, Validation) {
  Tensor table = zeros({5, 3});
  expect_error([&] { embedding(table, from_indices({0, 5}, {2})); }, {"embedding", "id 5", "5 rows"});
  expect_error([&] { embedding(table, from_indices({-1}, {1})); }, {"embedding", "id -1"});
  expect_error([&] { embedding(table, zeros({2})); }, {"embedding", "i64"});
  expect_error([&] { embedding(zeros({5}), from_indices({0}, {1})); }, {"embedding", "[5]"});
  // the kernel checks too (for callers of the backend)
  Tensor out = Tensor::empty({1, 3});
  expect_error([&] { cpu_backend().embedding(table, from_indices({7}, {1}), out); }, {"id 7", "5 rows"});
  Tensor gtable = zeros({5, 3});
  expect_error([&] { cpu_backend().embedding_backward(from_indices({9}, {1}), zeros({1, 3}), gtable); },
               {"id 9", "5 rows"});
}

// ---------------------------------------------------------------- cross entropy

TEST(RowsCrossEntropy, IgnoredRowsGetExactlyZeroGradient) {
  Tensor targets = from_indices({0, 4, -100, 2, 3}, {5});
  Tensor x = random({5, 5}, DType::f64, 32).requires_grad_();
  Tensor g = remat::grad({cross_entropy(x, targets, 0.3)}, {x})[0];
  for (int c = 0; c < 5; ++c) EXPECT_EQ(g.at({2, c}), 0.0);
}

TEST(RowsCrossEntropy, AllRowsIgnored) {
  Tensor x = random({3, 4}, DType::f32, 33).requires_grad_();
  Tensor loss = cross_entropy(x, from_indices({-100, -100, -100}, {3}), 0.1);
  EXPECT_EQ(loss.item(), 0.0);
  Tensor g = remat::grad({loss}, {x})[0];
  for (double v : g.to_vector()) EXPECT_EQ(v, 0.0);
}

// cross_entropy keeps lse [N] for its backward on every backend; on a device (here the emulated
// one) it gives the CPU's loss and gradient bit for bit, on rows with label smoothing, an ignored
// row, masked (-inf) logits, and a +inf or a NaN logit, in f32, f64 and bf16.
TEST(RowsCrossEntropy, TheKeptLogSumExpGivesTheCpusResultsOnADevice) {
  remat::testing::EmulatedDevice dev;
  const int64_t rows = 9, cols = 301;
  const std::vector<int64_t> targets = {3, 61, 5, -100, 9, 10, 200, 300, 0};
  for (const bool specials : {false, true}) {
    std::vector<double> v(static_cast<size_t>(rows * cols));
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37 * static_cast<double>(i)) * 6.0;
    auto at = [&](int64_t r, int64_t c) -> double& { return v[static_cast<size_t>(r * cols + c)]; };
    for (int64_t c = 0; c < cols; c += 3) at(1, c) = -INFINITY;  // not the target, 61
    for (int64_t c = 0; c < cols; ++c)
      if (c != 5) at(2, c) = -INFINITY;
    if (specials) at(4, 123) = INFINITY, at(5, 77) = NAN;
    for (const DType dtype : {DType::f32, DType::f64, DType::bf16}) {
      const Tensor x = from_vector(v, {rows, cols}, dtype);
      for (const double smoothing : {0.0, 0.1, 1.0}) {
        const Tensor xh = x.detach().requires_grad_();
        const Tensor want_loss = cross_entropy(xh, from_indices(targets, {rows}), smoothing);
        const std::vector<double> want = remat::grad({want_loss}, {xh})[0].to_vector();
        const std::string what = detail::concat(dtype_name(dtype), " smoothing ", smoothing,
                                                specials ? " with inf and NaN" : "");
        const Tensor xd = x.to(dev.device).requires_grad_();
        const Tensor loss = cross_entropy(xd, from_indices(targets, {rows}, dev.device), smoothing);
        const std::vector<double> got = remat::grad({loss}, {xd})[0].to(kCpu).to_vector();
        const double l = loss.to(kCpu).item(), wl = want_loss.item();
        EXPECT_TRUE(l == wl || (std::isnan(l) && std::isnan(wl))) << what << ": loss " << l << ", CPU " << wl;
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          if (std::isnan(want[i])) {
            EXPECT_TRUE(std::isnan(got[i])) << what << " element " << i;
            continue;
          }
          EXPECT_TRUE(got[i] == want[i] && std::signbit(got[i]) == std::signbit(want[i]))
              << what << " element " << i << ": " << got[i] << ", CPU " << want[i];
        }
      }
    }
  }
}

// The kernels' two forms directly: the [N, C] form writes x - lse in the logits' dtype, the
// same losses, and its backward (logits undefined) writes the [N] form's gradient bits.
TEST(RowsCrossEntropy, KernelFormsAgree) {
  const int64_t rows = 64, cols = 257;  // several row ranges
  for (const DType dtype : {DType::f32, DType::f64}) {
    const Tensor x = random({rows, cols}, dtype, 34, 3.0);
    std::vector<int64_t> t(rows);
    for (int64_t r = 0; r < rows; ++r) t[static_cast<size_t>(r)] = r % 7 == 3 ? -100 : (r * 31) % cols;
    const Tensor targets = from_indices(t, {rows}), gloss = random({rows}, dtype, 35);
    Tensor losses[2] = {Tensor::empty({rows}, dtype), Tensor::empty({rows}, dtype)};
    Tensor scale = Tensor::empty({}, dtype), lse = Tensor::empty({rows}, dtype);
    Tensor logp = Tensor::empty({rows, cols}, dtype);
    cpu_backend().cross_entropy(x, targets, 0.1, -100, losses[0], lse, scale);
    cpu_backend().cross_entropy(x, targets, 0.1, -100, losses[1], logp, scale);
    EXPECT_EQ(losses[0].to_vector(), losses[1].to_vector()) << dtype_name(dtype);
    const std::vector<double> xs = x.to_vector(), shifts = lse.to_vector(), lp = logp.to_vector();
    for (size_t i = 0; i < lp.size(); ++i) {
      const double want = dtype == DType::f32 ? static_cast<double>(static_cast<float>(xs[i]) -
                                                                    static_cast<float>(shifts[i / cols]))
                                              : xs[i] - shifts[i / cols];
      ASSERT_EQ(lp[i], want) << dtype_name(dtype) << " element " << i;
    }
    Tensor g[2] = {Tensor::empty({rows, cols}, dtype), Tensor::empty({rows, cols}, dtype)};
    cpu_backend().cross_entropy_backward(x, lse, targets, gloss, 0.1, -100, g[0]);
    cpu_backend().cross_entropy_backward(Tensor(), logp, targets, gloss, 0.1, -100, g[1]);
    EXPECT_EQ(g[0].to_vector(), g[1].to_vector()) << dtype_name(dtype);
  }
}

TEST(RowsCrossEntropy, Validation) {
  Tensor x = zeros({3, 4});
  expect_error([&] { cross_entropy(x, from_indices({0, 4, 1}, {3})); }, {"cross_entropy", "target 4", "4 classes"});
  expect_error([&] { cross_entropy(x, from_indices({0, -1, 1}, {3})); }, {"cross_entropy", "target -1"});
  expect_error([&] { cross_entropy(x, from_indices({0, 1}, {2})); }, {"cross_entropy", "[2]", "[3, 4]"});
  expect_error([&] { cross_entropy(x, zeros({3})); }, {"cross_entropy", "i64"});
  expect_error([&] { cross_entropy(zeros({3}), from_indices({0, 1, 2}, {3})); }, {"cross_entropy", "[3]"});
  expect_error([&] { cross_entropy(x, from_indices({0, 1, 2}, {3}), 1.5); }, {"cross_entropy", "label_smoothing", "1.5"});
  Tensor losses = Tensor::empty({3}), lse = Tensor::empty({3}), scale = Tensor::empty({});
  expect_error([&] { cpu_backend().cross_entropy(x, from_indices({0, 9, 1}, {3}), 0.0, -100, losses, lse, scale); },
               {"target 9", "4 classes"});
}

// ---------------------------------------------------------------- dropout

// The mask's values are a harness row (dropout_*); here: replay, the drop rate, another state, and
// the probabilities 0 and 1.
TEST_P(RowsDtype, DropoutReplayRateAndEdgeProbabilities) {
  const DType dt = GetParam();
  Tensor x = add_scalar(random({64, 33}, dt, 34), 5.0);  // no zeros in x
  const double p = 0.3;
  RngState state{1234, 8};
  Tensor y1 = dropout(x, p, state), y2 = dropout(x, p, state);
  EXPECT_EQ(y1.to_vector(), y2.to_vector());
  auto xv = x.to_vector(), yv = y1.to_vector();
  int64_t dropped = 0;
  for (double v : yv) dropped += v == 0.0;
  const double rate = static_cast<double>(dropped) / static_cast<double>(xv.size());
  EXPECT_NEAR(rate, p, 0.05);
  // another state gives another mask
  EXPECT_NE(dropout(x, p, RngState{1235, 8}).to_vector(), yv);
  // p == 0 copies, p == 1 zeroes
  EXPECT_EQ(dropout(x, 0.0, state).to_vector(), xv);
  for (double v : dropout(x, 1.0, state).to_vector()) EXPECT_EQ(v, 0.0);
}

TEST(RowsDropout, DefaultGeneratorAndEvalMode) {
  Tensor x = ones({10, 10});
  EXPECT_TRUE(dropout(x, 0.5, false).same(x));
  EXPECT_TRUE(dropout(x, 0.0, true).same(x));
  manual_seed(77);
  RngState before = rng_state();
  Tensor a = dropout(x, 0.5, true);
  RngState after = rng_state();
  EXPECT_EQ(after.seed, before.seed);
  EXPECT_GE(after.offset, before.offset + 100);
  EXPECT_EQ(a.to_vector(), dropout(x, 0.5, before).to_vector());  // same state -> same mask
  set_rng_state(before);
  EXPECT_EQ(dropout(x, 0.5, true).to_vector(), a.to_vector());  // replay after restoring the generator
  EXPECT_NE(dropout(x, 0.5, true).to_vector(), a.to_vector());
}

TEST(RowsDropout, MaskDoesNotDependOnThreadCount) {
  Tensor x = random({300, 257}, DType::f32, 35);  // above the parallel threshold
  RngState state{99, 3};                           // offset not a multiple of 4
  std::vector<double> one, two;
  {
    ThreadCount tc(1);
    one = dropout(x, 0.4, state).to_vector();
  }
  {
    ThreadCount tc(2);
    two = dropout(x, 0.4, state).to_vector();
  }
  EXPECT_EQ(one, two);
  auto xv = x.to_vector();
  for (size_t i = 0; i < xv.size(); i += 97) {
    const bool keep = uniform_float(philox_word(state, i)) >= 0.4;
    EXPECT_EQ(one[i], keep ? static_cast<double>(static_cast<float>(xv[i]) * static_cast<float>(1 / 0.6)) : 0.0);
  }
}

TEST(RowsDropout, GradientRegeneratesTheMask) {
  // the backward keeps nothing but the RNG state, and applies the same mask and scale
  RngState state{5, 0};
  Tensor x = random({4, 6}, DType::f64, 37).requires_grad_();
  Tensor y = dropout(x, 0.5, state);
  EXPECT_EQ(y.grad_fn()->saved_bytes(), 0u);
  Tensor gy = random({4, 6}, DType::f64, 38);
  Tensor g = remat::grad({y}, {x}, {gy})[0];
  EXPECT_EQ(g.to_vector(), dropout(gy, 0.5, state).to_vector());
}

TEST(RowsDropout, Validation) {
  expect_error([] { dropout(ones({2}), 1.5, true); }, {"dropout", "1.5"});
  expect_error([] { dropout(ones({2}), -0.1, RngState{}); }, {"dropout", "-0.1"});
  RngState before = rng_state();
  expect_error([] { dropout(ones({2}), 2.0, true); }, {"dropout"});
  EXPECT_EQ(rng_state(), before);  // nothing drawn for an invalid call
}

// ---------------------------------------------------------------- concat / split

// Copies are exact (the harness compares within a tolerance).
TEST_P(RowsDtype, ConcatAndSplitCopyExactly) {
  const DType dt = GetParam();
  Tensor a = random({2, 3, 4}, dt, 39), b = random({2, 1, 4}, dt, 40), c = random({2, 2, 4}, dt, 41);
  Tensor y = concat({a, b, c}, 1);
  ASSERT_EQ(y.shape(), (Shape{2, 6, 4}));
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 4; ++k) {
      for (int j = 0; j < 3; ++j) EXPECT_EQ(y.at({i, j, k}), a.at({i, j, k}));
      EXPECT_EQ(y.at({i, 3, k}), b.at({i, 0, k}));
      for (int j = 0; j < 2; ++j) EXPECT_EQ(y.at({i, 4 + j, k}), c.at({i, j, k}));
    }
  TensorList parts = split(y, {3, 1, 2}, -2);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].to_vector(), a.to_vector());
  EXPECT_EQ(parts[1].to_vector(), b.to_vector());
  EXPECT_EQ(parts[2].to_vector(), c.to_vector());
  // a non-contiguous input and an empty part
  Tensor t = a.transpose(0, 2);  // [4, 3, 2]
  Tensor z = concat({t, Tensor::empty({4, 0, 2}, dt), t}, 1);
  ASSERT_EQ(z.shape(), (Shape{4, 6, 2}));
  EXPECT_EQ(split(z, {3, 0, 3}, 1)[2].to_vector(), t.to_vector());
}

TEST(RowsJoin, Validation) {
  expect_error([] { concat({}, 0); }, {"concat"});
  expect_error([] { concat({zeros({2, 3}), zeros({2, 4})}, 0); }, {"concat", "[2, 4]", "[2, 3]"});
  expect_error([] { concat({zeros({2, 3}), zeros({2, 3}, DType::f64)}, 0); }, {"concat", "f64", "f32"});
  expect_error([] { concat({zeros({2, 3}), zeros({2, 3, 1})}, 0); }, {"concat", "[2, 3, 1]"});
  expect_error([] { concat({zeros({2, 3})}, 2); }, {"concat", "axis 2"});
  expect_error([] { split(zeros({2, 5}), {2, 2}, 1); }, {"split", "[2, 2]", "4", "[2, 5]"});
  expect_error([] { split(zeros({2, 5}), {6, -1}, 1); }, {"split", "-1"});
  expect_error([] { split(zeros({2, 5}), {5}, 3); }, {"split", "axis 3"});
}

INSTANTIATE_TEST_SUITE_P(Rows, RowsDtype, ::testing::Values(DType::f32, DType::f64),
                         [](const ::testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); });
