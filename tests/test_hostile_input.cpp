// Hostile input to the C++ API: one test per class of bad input found by the issue-11 battery
// (overflowing sizes, negative or huge dimensions, impossible allocations, foreign gradients,
// failures inside a backward pass, malformed policies, oversized plans, NaN). Each bad call must
// throw remat::Error naming what was wrong, and leave the state as it was: the allocator's live
// bytes per tag (and, where nothing was allocated, its peaks and allocation counts), the
// parameters, their gradients and the RNG state. Runs in the Release and the ASan+UBSan builds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

#include "remat/autodiff.h"
#include "remat/budget.h"
#include "remat/chain.h"
#include "remat/checkpoint.h"
#include "remat/memory.h"
#include "remat/nn/layers.h"
#include "remat/ops.h"
#include "remat/policy.h"
#include "remat/random.h"
#include "remat/scan.h"
#include "remat/schedule.h"
#include "schedule/chain_internal.h"

#if defined(__SANITIZE_ADDRESS__)
// An impossible allocation must come back as null (and then remat::OutOfMemory), not abort the
// process: AddressSanitizer's default is to abort. ASAN_OPTIONS from the environment still apply.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
#endif

using namespace remat;

namespace {

using Values = std::vector<double>;
constexpr int64_t kTwo = 2;
constexpr int64_t p2(int k) { return int64_t{1} << k; }

class Hostile : public ::testing::Test {
 protected:
  // Parameters W [3, 4] and b [4] (f64) that already hold gradients, and an input x [2, 3].
  Tensor W, b, x;
  // plain graphs here have no layer calls: save-all says so (no "met no region" warning)
  std::optional<ScopedPolicy> policy;

  void SetUp() override {
    policy.emplace(Policy::save_all());
    W = from_vector(Values{0.5, -0.25, 0.75, 0.1, -0.5, 0.3, 0.2, -0.8, 0.4, 0.6, -0.1, 0.05}, {3, 4}, DType::f64,
                    memory::Tag::parameter)
            .requires_grad_();
    b = from_vector(Values{0.1, -0.2, 0.3, 0.0}, {4}, DType::f64, memory::Tag::parameter).requires_grad_();
    x = from_vector(Values{1.0, -2.0, 0.5, 0.25, 1.5, -1.0}, {2, 3}, DType::f64);
    sum(tanh(add(matmul(x, W), b))).backward();
  }
  void TearDown() override { policy.reset(); }

  struct State {
    memory::Stats stats;
    Values w, b, gw, gb;
    RngState rng;
  };
  State state() const {
    return {memory::stats(), W.to_vector(), b.to_vector(), W.grad().to_vector(), b.grad().to_vector(), rng_state()};
  }

  // Runs `bad`, which must throw remat::Error (or a subclass E) whose message contains every
  // needle; then checks that the state is unchanged. `allocates_nothing`: the error is found
  // before any memory is asked for, so peaks and allocation counts are unchanged as well.
  template <class E = Error>
  std::string expect_error(const std::function<void()>& bad, const std::vector<std::string>& needles,
                           bool allocates_nothing = true) {
    memory::reset_peaks();
    const State before = state();
    std::string message;
    try {
      bad();
      ADD_FAILURE() << "no exception (expected a remat::Error mentioning '" << needles.at(0) << "')";
      return "";
    } catch (const E& e) {
      message = e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "threw a " << typeid(e).name() << " instead of " << typeid(E).name() << ": " << e.what();
      return "";
    }
    for (const auto& n : needles) EXPECT_NE(message.find(n), std::string::npos) << "'" << n << "' missing in: " << message;
    const State after = state();
    for (size_t t = 0; t < memory::kTagCount; ++t) {
      const char* tag = memory::tag_name(static_cast<memory::Tag>(t));
      EXPECT_EQ(after.stats.live_bytes[t], before.stats.live_bytes[t]) << tag << " live bytes changed by: " << message;
      if (allocates_nothing) {
        EXPECT_EQ(after.stats.peak_bytes[t], before.stats.peak_bytes[t]) << tag << " peak changed by: " << message;
        EXPECT_EQ(after.stats.allocations[t], before.stats.allocations[t]) << tag << " allocations by: " << message;
      }
    }
    EXPECT_EQ(after.w, before.w) << "W changed by: " << message;
    EXPECT_EQ(after.b, before.b) << "b changed by: " << message;
    EXPECT_EQ(after.gw, before.gw) << "W.grad changed by: " << message;
    EXPECT_EQ(after.gb, before.gb) << "b.grad changed by: " << message;
    EXPECT_EQ(after.rng, before.rng) << "RNG state changed by: " << message;
    return message;
  }
};

// ============================================================================================
// Element and byte counts: every shape that becomes a size is checked (tensor.h "Limits").
// ============================================================================================

TEST_F(Hostile, ElementCountOverflowInFactories) {
  // 2^62 f32 elements are 2^64 bytes, which used to wrap to a 0-byte allocation
  expect_error([] { zeros({p2(62)}); }, {"zeros", "[4611686018427387904]", "2^60"});
  expect_error([] { zeros({p2(31), p2(31)}); }, {"zeros", "[2147483648, 2147483648]"});
  expect_error([] { zeros({p2(40), p2(40)}); }, {"zeros", "[1099511627776, 1099511627776]"});
  expect_error([] { ones({3, p2(62)}); }, {"ones", "[3, 4611686018427387904]"});
  expect_error([] { full({p2(30), p2(30), p2(30)}, 1.0); }, {"full", "[1073741824, 1073741824, 1073741824]"});
  expect_error([] { randn({p2(62)}); }, {"randn", "[4611686018427387904]"});
  expect_error([] { rand({p2(61), kTwo}); }, {"rand", "[2305843009213693952, 2]"});
  expect_error([] { Tensor::empty({p2(61)}, DType::f64).fill_(1.0); }, {"empty", "[2305843009213693952]"});
  expect_error([] { from_vector(Values{1.0}, {p2(32), p2(32)}); }, {"from_vector", "[4294967296, 4294967296]"});
  expect_error([] { from_indices({1}, {-1, -1}); }, {"from_indices", "negative", "[-1, -1]"});
  // the last axis of 2^60 elements is the limit, not beyond it
  EXPECT_EQ(Tensor::empty({0, p2(60)}).shape(), (Shape{0, p2(60)}));
  expect_error([] { zeros({0, p2(60) + 1}); }, {"zeros", "[0, 1152921504606846977]"});
}

TEST_F(Hostile, StrideOverflowWithZeroSizeAxis) {
  // numel 0, but the contiguous stride of axis 0 would be 2^124
  expect_error([] { zeros({0, p2(62), p2(62)}); }, {"zeros", "[0, 4611686018427387904, 4611686018427387904]"});
  expect_error([] { contiguous_strides({0, p2(62), p2(62)}); }, {"[0, 4611686018427387904, 4611686018427387904]"});
  expect_error([] { shape_numel({p2(40), p2(40)}); }, {"[1099511627776, 1099511627776]"});
  expect_error([] { shape_numel({4, -2}); }, {"negative", "[4, -2]"});
}

TEST_F(Hostile, RankAboveTheLimit) {
  expect_error([] { zeros({1, 1, 1, 1, 1, 1, 1}); }, {"zeros", "rank 7", "[1, 1, 1, 1, 1, 1, 1]"});
  Tensor rank6 = ones({1, 1, 1, 1, 1, 1});
  expect_error([&] { rank6.unsqueeze(0); }, {"reshape", "exceeds 6"});
  expect_error([&] { W.expand({1, 1, 1, 1, 1, 3, 4}); }, {"expand", "exceeds 6"});
}

TEST_F(Hostile, ReshapeOverflow) {
  Tensor empty = zeros({0});
  expect_error([&] { empty.reshape({p2(32), p2(32), 0}); }, {"reshape", "[4294967296, 4294967296, 0]"});
  expect_error([&] { empty.reshape({p2(32), p2(32), -1}); }, {"reshape", "[4294967296, 4294967296, 1]"});
  expect_error([&] { W.reshape({p2(62), p2(62), 0, -1}); }, {"reshape"});
  expect_error([&] { W.view({-2, 6}); }, {"view", "invalid dimension -2", "[-2, 6]"});
  expect_error([&] { W.reshape({5, -1}); }, {"reshape", "[3, 4]", "[5, -1]"});
}

TEST_F(Hostile, ExpandToInvalidOrHugeShape) {
  Tensor v = from_vector(Values{1, 2, 3, 4}, {4}, DType::f64);
  // -1 keeps an existing axis only: a new leading axis of -1 or any other negative size is wrong
  expect_error([&] { v.expand({-1, 4}); }, {"expand", "invalid size -1", "[-1, 4]"});
  expect_error([&] { v.expand({-5, 4}); }, {"expand", "invalid size -5", "[-5, 4]"});
  expect_error([&] { v.expand({2, -3}); }, {"expand", "invalid size -3"});
  expect_error([&] { b.expand({p2(62), 4}); }, {"expand", "[4611686018427387904, 4]", "2^60"});
  expect_error([&] { b.expand({p2(30), p2(30), 4}); }, {"expand", "[1073741824, 1073741824, 4]"});
  // a view up to the limit is fine (no memory), and -1 keeps the existing size
  EXPECT_EQ(v.expand({p2(58), -1}).shape(), (Shape{p2(58), 4}));
  EXPECT_EQ(v.expand({p2(58), -1}).numel(), p2(60));
}

TEST_F(Hostile, SliceWithExtremeBoundsAndStep) {
  // used to give shape [-1, 4]: (stop - start + step - 1) overflowed
  Tensor s = W.slice(0, 0, 3, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(s.shape(), (Shape{1, 4}));
  EXPECT_EQ(s.to_vector(), (Values{0.5, -0.25, 0.75, 0.1}));
  Tensor all = W.slice(1, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(all.to_vector(), W.to_vector());
  EXPECT_EQ(W.slice(1, 1, std::numeric_limits<int64_t>::max(), 2).shape(), (Shape{3, 2}));
  EXPECT_EQ(W.slice(0, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()).shape(),
            (Shape{0, 4}));
  expect_error([&] { W.slice(0, 0, 3, 0); }, {"slice", "step must be positive"});
  expect_error([&] { W.slice(0, 0, 3, std::numeric_limits<int64_t>::min()); }, {"slice", "step must be positive"});
  // the gradient of a huge-step slice is right too
  Tensor P = from_vector(Values{1, 2, 3, 4, 5, 6}, {3, 2}, DType::f64).requires_grad_();
  sum(P.slice(0, 1, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max())).backward();
  EXPECT_EQ(P.grad().to_vector(), (Values{0, 0, 1, 1, 0, 0}));
}

TEST_F(Hostile, BroadcastOrProductTooLarge) {
  // views of 2^31 elements each are fine; their broadcast or product would not be
  Tensor column = ones({1}, DType::f64).expand({p2(31), 1});
  Tensor row = ones({1}, DType::f64).expand({1, p2(31)});
  expect_error([&] { add(column, row); }, {"add", "[2147483648, 1]", "[1, 2147483648]"});
  expect_error([&] { maximum(column, row); }, {"maximum"});
  expect_error([&] { matmul(column, row); }, {"matmul", "[2147483648, 2147483648]"});
  expect_error([&] { where(column, row, column); }, {"where"});
}

TEST_F(Hostile, ConcatAndSplitSizeOverflow) {
  Tensor big = ones({1}, DType::f64).expand({p2(59)});
  expect_error([&] { concat({big, big, big}, 0); }, {"concat", "[1729382256910270464]", "2^60"});
  TensorList many(20, ones({1}, DType::f64).expand({p2(59) + p2(58)}));
  expect_error([&] { concat(many, 0); }, {"concat"});
  expect_error([&] { split(W, {std::numeric_limits<int64_t>::max(), 2, 1}, 0); }, {"split", "overflows"});
  expect_error([&] { split(W, {1, 1}, 0); }, {"split", "sum to 2"});
}

TEST_F(Hostile, ArangeWithNonFiniteOrHugeBounds) {
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  expect_error([&] { arange(0.0, nan, 1.0); }, {"arange", "finite", "nan"});
  expect_error([&] { arange(nan, 1.0, 1.0); }, {"arange", "finite"});
  expect_error([&] { arange(0.0, 1.0, nan); }, {"arange", "finite"});
  expect_error([&] { arange(0.0, inf, 1.0); }, {"arange", "finite"});
  expect_error([&] { arange(0.0, 1e30, 1.0); }, {"arange", "2^60"});
  expect_error([&] { arange(0.0, 1.0, 1e-300); }, {"arange", "2^60"});
  expect_error([&] { arange(-1e308, 1e308, 1.0); }, {"arange", "2^60"});
  EXPECT_EQ(arange(0.0, 1.0, -1.0).numel(), 0);  // an empty range is not an error
}

TEST_F(Hostile, LayerSizesTooLarge) {
  expect_error([] { nn::Embedding(1, p2(62)); }, {"Embedding(1, 4611686018427387904)", "weight", "[1, 4611686018427387904]"});
  expect_error([] { nn::Linear(p2(31), p2(31)); }, {"Linear", "weight", "[2147483648, 2147483648]"});
  expect_error([] { nn::LayerNorm(p2(61)); }, {"LayerNorm", "[2305843009213693952]"});
}

// ============================================================================================
// Allocation failure: remat::OutOfMemory naming the op, the shape and the bytes; counters unchanged.
// ============================================================================================

bool overcommit_always() {
  std::ifstream in("/proc/sys/vm/overcommit_memory");
  int mode = 0;
  return (in >> mode) && mode == 1;
}

TEST_F(Hostile, AllocationFailure) {
  // 2^50 bytes (1 PiB) exceeds the x86-64 user address space: refused under any overcommit mode
  auto m = expect_error<OutOfMemory>([] { zeros({p2(20), p2(28)}, DType::f32); },
                                     {"zeros", "[1048576, 268435456]", "1125899906842624 bytes", "f32"});
  expect_error<OutOfMemory>([] { randn({p2(47)}, DType::f64); }, {"randn", "[140737488355328]", "1125899906842624"});
  expect_error<OutOfMemory>([] { nn::Embedding(p2(20), p2(28)); },
                            {"Embedding(1048576, 268435456)", "weight", "1125899906842624 bytes"});
  // an op's output: the message names the op (the kernel's allocation does not know it)
  Tensor huge = ones({1}).expand({p2(20), p2(28)});
  expect_error<OutOfMemory>([&] { tanh(huge); }, {"tanh", "cannot allocate", "[1048576, 268435456]"});
  expect_error<OutOfMemory>([&] { huge.contiguous(); }, {"contiguous", "1125899906842624 bytes"});
  // the OutOfMemory carries the size
  try {
    zeros({p2(20), p2(28)});
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.bytes(), size_t{1} << 50);
  }
  // the case, 4 TiB: refused unless the kernel overcommits without limit
  if (overcommit_always()) GTEST_SKIP() << "vm.overcommit_memory = 1: a 4 TiB request would succeed virtually";
  expect_error<OutOfMemory>([] { zeros({p2(20), p2(20)}); },
                            {"zeros", "[1048576, 1048576]", "4398046511104 bytes", "4.00 TiB"});
}

TEST_F(Hostile, AllocatorRefusesImpossibleSizes) {
  const memory::Stats before = memory::stats();
  EXPECT_THROW(memory::cpu().allocate(std::numeric_limits<size_t>::max(), memory::Tag::other), OutOfMemory);
  EXPECT_THROW(memory::cpu().allocate(std::numeric_limits<size_t>::max() - 10, memory::Tag::gradient), OutOfMemory);
  const memory::Stats after = memory::stats();
  EXPECT_EQ(after.live_bytes, before.live_bytes);
  EXPECT_EQ(after.allocations, before.allocations);
  EXPECT_EQ(after.peak_total, before.peak_total);
}

// ============================================================================================
// set_grad: a foreign gradient is checked and copied, never aliased.
// ============================================================================================

TEST_F(Hostile, SetGradWithForeignDtypeShapeOrLayout) {
  Tensor f32_grad = ones({3, 4}, DType::f32), transposed = ones({4, 3}, DType::f64), f64_grad = ones({4}, DType::f64);
  expect_error([&] { W.set_grad(f32_grad); }, {"set_grad", "f32", "f64"});
  expect_error([&] { W.set_grad(transposed); }, {"set_grad", "[4, 3]", "[3, 4]"});
  Tensor P32 = zeros({4}).requires_grad_();
  expect_error([&] { P32.set_grad(f64_grad); }, {"set_grad", "f64", "f32"});

  // a stride-0 view: the backward must add into P's own copy, not into the caller's base
  Tensor P = zeros({2, 2}, DType::f64).requires_grad_();
  Tensor base = ones({2}, DType::f64);
  P.set_grad(base.expand({2, 2}));
  EXPECT_NE(P.grad().storage(), base.storage());
  EXPECT_TRUE(P.grad().is_contiguous());
  EXPECT_EQ(P.grad().storage()->tag(), memory::Tag::gradient);
  sum(P).backward();
  EXPECT_EQ(P.grad().to_vector(), (Values{2, 2, 2, 2}));  // was 4 when the view's base was shared
  EXPECT_EQ(base.to_vector(), (Values{1, 1}));            // the caller's tensor is untouched
  // writing to the caller's tensor later does not change the gradient either
  Tensor g = full({2, 2}, 5.0, DType::f64);
  P.set_grad(g);
  g.fill_(7.0);
  EXPECT_EQ(P.grad().to_vector(), (Values{5, 5, 5, 5}));
}

TEST_F(Hostile, GradOfTheSameInputTwice) {
  Tensor P = from_vector(Values{1.5, -2.0, 0.25}, {3}, DType::f64).requires_grad_();
  const Values twice{3.0, -4.0, 0.5};
  auto both = grad([](const TensorList& in) { return sum(mul(in[0], in[1])); }, {P, P}, GradOptions{});
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(both[0].to_vector(), twice);  // the first entry was zeros
  EXPECT_EQ(both[1].to_vector(), twice);
  EXPECT_NE(both[0].storage(), both[1].storage()) << "two entries, two tensors";
  auto again = grad([](const TensorList& in) { return sum(square(in[0])); }, {P, P, P}, GradOptions{});
  for (const auto& g : again) EXPECT_EQ(g.to_vector(), twice);
  // the tensor-level entry point, and P's own .grad() stays untouched
  Tensor loss = sum(mul(P, P));
  auto direct = grad(TensorList{loss}, TensorList{P, P});
  EXPECT_EQ(direct[0].to_vector(), twice);
  EXPECT_EQ(direct[1].to_vector(), twice);
  EXPECT_FALSE(P.grad().defined());
}

// ============================================================================================
// A backward pass that throws changes no leaf's gradient (Note [leaf gradients are transactional]).
// ============================================================================================

// loss = sum(tanh(fail(x W) * b)) + sum(c): b's and c's accumulators run before fail's backward
// (they are reached first), so a non-transactional engine would already have changed them.
TEST_F(Hostile, BackwardThatThrowsInACustomOp) {
  bool armed = true;
  CustomOp fail{"fail",
                [](const TensorList& in, SaveContext&) { return TensorList{mul_scalar(in[0], 1.0)}; },
                [&armed](const TensorList& grads, const SavedValues&) {
                  if (armed) throw Error("fail: backward refused");
                  return TensorList{grads[0]};
                }};
  Tensor c = from_vector(Values{1, 2}, {2}, DType::f64).requires_grad_();
  auto make_loss = [&] { return add(sum(tanh(mul(fail({matmul(x, W)})[0], b))), sum(c)); };
  expect_error([&] { make_loss().backward(); }, {"fail: backward refused"}, /*allocates_nothing=*/false);
  EXPECT_FALSE(c.grad().defined()) << "a leaf without a gradient still has none";
  // and a retry that succeeds accumulates exactly one step on top of the old gradients
  armed = false;
  const Values gb_before = b.grad().to_vector();
  Tensor z = matmul(x, W);
  Values gb_step(4, 0.0);
  {
    auto zv = z.to_vector(), bv = b.to_vector();
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 4; ++j) {
        double t = std::tanh(zv[i * 4 + j] * bv[j]);
        gb_step[j] += (1 - t * t) * zv[i * 4 + j];
      }
  }
  make_loss().backward();
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(b.grad().to_vector()[j], gb_before[j] + gb_step[j], 1e-12);
  EXPECT_EQ(c.grad().to_vector(), (Values{1, 1}));
}

TEST_F(Hostile, BackwardThatThrowsInARecomputedRegion) {
  for (const char* text : {"every-layer", "selective:matmul"}) {
    ScopedPolicy scope(Policy::parse(text));
    bool armed = true;
    // a recomputation runs ops, not the region's code: the op's own forward refuses to run again
    CustomOp refusing{"refusing_tanh",
                      [&](const TensorList& in, SaveContext& ctx) {
                        if (armed && is_recomputing()) throw Error("region: refused to run twice");
                        Tensor y = tanh(in[0]);
                        ctx.save(y);
                        return TensorList{y};
                      },
                      [](const TensorList& grads, const SavedValues& saved) {
                        return TensorList{mul(grads[0], add_scalar(neg(square(saved[0])), 1.0))};
                      }};
    auto region = [&](const Tensor& h) { return refusing({matmul(h, W)})[0]; };
    auto make_loss = [&] { return sum(mul(checkpoint(region, x), b)); };
    expect_error([&] { make_loss().backward(); }, {"region: refused to run twice"}, /*allocates_nothing=*/false);
    // the same under grad(): nothing is accumulated there, but nothing may break either
    expect_error([&] { grad(TensorList{make_loss()}, TensorList{W, b}); }, {"refused"}, false);
    armed = false;
    const Values gw_before = W.grad().to_vector();
    Tensor loss = make_loss();
    auto expected = grad(TensorList{sum(mul(tanh(matmul(x, W)), b))}, TensorList{W});
    loss.backward();
    auto gw = W.grad().to_vector(), step = expected[0].to_vector();
    for (size_t i = 0; i < gw.size(); ++i) EXPECT_NEAR(gw[i], gw_before[i] + step[i], 1e-12) << text;
  }
}

// ============================================================================================
// Policy strings and byte counts are parsed strictly.
// ============================================================================================

TEST_F(Hostile, PolicyParseRejectsOverflowAndUnknownOps) {
  // byte counts beyond 2^63 - 1 used to become 2^63 bytes
  for (const char* text : {"budget:10000000000000000000", "budget:18446744073709551616",
                           "budget:99999999999999999999999GiB", "budget:9223372036854775808", "budget:8589934592GiB",
                           "budget:1e400MiB"})
    expect_error([&] { Policy::parse(text); }, {"cannot parse policy", text});
  expect_error([] { Policy::parse("budget:99999999999999999999999GiB"); }, {"2^63"});
  EXPECT_EQ(Policy::parse("budget:9223372036854775807").keep.budget_bytes, 9223372036854775807u);
  // K must fit in int: 4294967297 used to become every-k:1
  for (const char* text : {"every-k:4294967297", "every-k:2147483648", "every-k:99999999999999999999"})
    expect_error([&] { Policy::parse(text); }, {"cannot parse policy", text, "2147483647"});
  for (const char* text : {"every-k:+3", "every-k:-3", "every-k:3.0", "every-k:0x10", "every-k:3 4"})
    expect_error([&] { Policy::parse(text); }, {"cannot parse policy", text});
  EXPECT_EQ(Policy::parse("every-k:2147483647").keep.k, 2147483647);
  // an unknown op kind lists the known ones
  auto m = expect_error([] { Policy::parse("selective:notanop"); }, {"unknown op kind 'notanop'", "matmul", "tanh"});
  for (const auto& kind : autodiff::op_kinds()) EXPECT_NE(m.find(kind), std::string::npos) << kind;
  expect_error([] { Policy::parse("selective:matmul,Tanh"); }, {"'Tanh'"});
  expect_error([] { Policy::selective({"matmul", "notanop"}); }, {"notanop"});
  EXPECT_EQ(Policy::parse("selective:matmul,tanh").keep.ops, (std::vector<std::string>{"matmul", "tanh"}));
}

TEST_F(Hostile, ParseBytesRejectsOverflowFractionsAndGarbage) {
  for (const char* text : {"18446744073709551616", "9223372036854775808", "99999999999999999999999GiB",
                           "8589934592GiB", "8388608TiB", "1.5", "1.5B", "0.5 B", "64 Mi B", "64MiB ", "1e3", "+5"})
    expect_error([&] { memory::parse_bytes(text); }, {"parse_bytes", std::string("'") + text + "'"});
  EXPECT_EQ(memory::parse_bytes("9223372036854775807"), 9223372036854775807u);
  EXPECT_EQ(memory::parse_bytes("8388607TiB"), size_t{8388607} << 40);
  EXPECT_EQ(memory::parse_bytes("0.5KiB"), 512u);
  EXPECT_EQ(memory::parse_bytes("2 KiB"), 2048u);
}

// ============================================================================================
// Planner and schedule errors are remat::Error (they were std::invalid_argument).
// ============================================================================================

TEST_F(Hostile, PlannerLimitsAreRematErrors) {
  auto costs = schedule::ChainCosts::uniform(1000, 1.0, 2.0, 1000, 4000);
  expect_error([&] { schedule::plan_rotor(costs, size_t{1} << 30); }, {"plan_rotor", "1000 stages", "table"});
  expect_error([] { schedule::revolve_repetition_number(p2(40), 1); }, {"revolve_repetition_number", "1099511627776"});
  expect_error([] { schedule::revolve_schedule(p2(40), 8); }, {"revolve_schedule", "2^24"});
  expect_error([] { schedule::plan_every_k(schedule::ChainCosts::uniform(3, 1, 1, 1, 1), 0); }, {"every_k"});
}

TEST_F(Hostile, ScanWithTooManySteps) {
  int calls = 0;
  Tensor s0 = x.slice(1, 0, 3).slice(0, 0, 1);  // [1, 3]
  Tensor W3 = W.slice(1, 0, 3);                 // [3, 3]
  auto step3 = [&](const Tensor& s, int64_t) {
    ++calls;
    return tanh(matmul(s, W3));
  };
  expect_error([&] { scan(step3, s0, p2(40), {.schedule = ScanSchedule::revolve, .snapshots = 1}); },
               {"scan", "1099511627776", "2^24"});
  expect_error([&] { scan(step3, s0, p2(40), {.schedule = ScanSchedule::revolve, .snapshots = 8}); },
               {"scan", "1099511627776"});
  EXPECT_EQ(calls, 0) << "refused before running a step";
}

// plan_rotor refuses 1000 stages (above); the budget policy plans them with the grouped planner.
TEST_F(Hostile, BudgetChainTooLongForTheExactPlanner) {
  Chain chain;
  for (int i = 0; i < 1000; ++i) chain.add([](const Tensor& h) { return tanh(h); });
  Tensor input = from_vector(Values{0.1, 0.2}, {1, 2}, DType::f64);
  Tensor scale = from_vector(Values{1.0, 2.0}, {2}, DType::f64).requires_grad_();
  auto step = [&](const Policy& policy) {
    scale.zero_grad();
    backward([&] { return sum(chain.forward(mul(input, scale))); }, GradOptions{policy});
    return scale.grad().clone();
  };
  const Tensor reference = step(Policy::save_all());
  for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) step(Policy::parse("budget:1GiB"));
  // a budget between them, below save-all's held peak (about half its planned one here: each
  // tanh's record is its output), so not save-all
  const auto range = chain.planner()->feasible_range();
  ASSERT_TRUE(range.has_value());
  const Tensor planned = step(Policy::budget(range->smallest_budget_bytes +
                                             (range->save_all_peak_bytes - range->smallest_budget_bytes) / 4));
  ASSERT_TRUE(chain.planner()->report().has_value());
  EXPECT_EQ(chain.planner()->report()->costs.num_stages(), 1000);
  EXPECT_NE(chain.planner()->report()->planner.find("grouped"), std::string::npos)
      << chain.planner()->report()->planner << ": " << chain.planner()->report()->tree.substr(0, 200);
  EXPECT_EQ(planned.to_vector(), reference.to_vector());  // exact doubles
}

// ============================================================================================
// NaN propagates through relu, maximum and minimum (as in PyTorch); gradients go to the operand
// whose value was returned, and are exactly zero for the other.
// ============================================================================================

TEST_F(Hostile, NanPropagation) {
  const double nan = std::nan("");
  for (DType dtype : {DType::f32, DType::f64}) {
    // 40 elements: the vectorised f32 path as well as the tail
    Values xs(40, -1.0);
    for (size_t i = 0; i < xs.size(); i += 3) xs[i] = nan;
    xs[1] = 2.0;
    Tensor X = from_vector(xs, {40}, dtype);
    auto r = relu(X).to_vector();
    for (size_t i = 0; i < xs.size(); ++i) {
      if (std::isnan(xs[i])) EXPECT_TRUE(std::isnan(r[i])) << "relu(NaN) at " << i;
      else EXPECT_EQ(r[i], xs[i] > 0 ? xs[i] : 0.0);
    }
    Tensor a = from_vector(Values{nan, 1.0, nan, 3.0, 2.0}, {5}, dtype).requires_grad_();
    Tensor bb = from_vector(Values{1.0, nan, nan, 3.0, 5.0}, {5}, dtype).requires_grad_();
    for (bool is_max : {true, false}) {
      Tensor y = is_max ? maximum(a, bb) : minimum(a, bb);
      auto v = y.to_vector();
      for (int i = 0; i < 3; ++i) EXPECT_TRUE(std::isnan(v[i])) << (is_max ? "maximum" : "minimum") << " at " << i;
      EXPECT_EQ(v[3], 3.0);
      EXPECT_EQ(v[4], is_max ? 5.0 : 2.0);
      auto g = grad(TensorList{y}, TensorList{a, bb}, TensorList{full({5}, 10.0, dtype)});
      // picked: a (NaN), b (NaN), a (both NaN), a (tie), b / a
      EXPECT_EQ(g[0].to_vector(), (Values{10, 0, 10, 10, is_max ? 0.0 : 10.0}));
      EXPECT_EQ(g[1].to_vector(), (Values{0, 10, 0, 0, is_max ? 10.0 : 0.0}));
    }
    // the broadcast paths (a scalar operand on either side)
    Tensor s = full({}, nan, dtype);
    for (double v : maximum(X, s).to_vector()) EXPECT_TRUE(std::isnan(v));
    for (double v : minimum(s, X).to_vector()) EXPECT_TRUE(std::isnan(v));
    // relu's derivative at NaN is 0 (as PyTorch's), elsewhere the usual
    Tensor R = from_vector(Values{nan, 2.0, -1.0}, {3}, dtype).requires_grad_();
    EXPECT_EQ(grad(TensorList{sum(relu(R))}, TensorList{R})[0].to_vector(), (Values{0, 1, 0}));
    // the max reduction propagates NaN too
    EXPECT_TRUE(std::isnan(max(from_vector(Values{1, nan, 3}, {3}, dtype), {0}).item()));
  }
}

}  // namespace
