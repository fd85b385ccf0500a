// Bad inputs: each must throw remat::Error whose message names the op and the offending shape or
// value, and must leave everything as it was: live bytes per memory tag, the parameters' values
// and gradients, the RNG state and grad mode; and a valid backward afterwards must still produce
// correct gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <typeinfo>
#include <vector>

#include "remat/autodiff.h"
#include "remat/backend.h"
#include "remat/memory.h"
#include "remat/ops.h"
#include "remat/random.h"

using namespace remat;

namespace {

using Values = std::vector<double>;

class Errors : public ::testing::Test {
 protected:
  // Parameters W [3,4], b [4] (f64, parameter tag) and an input x [2,3]; loss = sum(tanh(x W + b)).
  Tensor W, b, x;

  void SetUp() override {
    W = from_vector(Values{0.5, -0.25, 0.75, 0.1, -0.5, 0.3, 0.2, -0.8, 0.4, 0.6, -0.1, 0.05}, {3, 4}, DType::f64,
                    memory::Tag::parameter)
            .requires_grad_();
    b = from_vector(Values{0.1, -0.2, 0.3, 0.0}, {4}, DType::f64, memory::Tag::parameter).requires_grad_();
    x = from_vector(Values{1.0, -2.0, 0.5, 0.25, 1.5, -1.0}, {2, 3}, DType::f64);
    loss().backward();  // the parameters start with gradients
  }

  Tensor loss() const { return sum(tanh(add(matmul(x, W), b))); }

  // One valid step's gradient, with plain loops: dz = 1 - tanh(z)^2, dW = x^T dz, db = sum_rows dz.
  void expected_step(Values& gW, Values& gb) const {
    auto xv = x.to_vector(), wv = W.to_vector(), bv = b.to_vector();
    gW.assign(12, 0);
    gb.assign(4, 0);
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 4; ++j) {
        double z = bv[j];
        for (int k = 0; k < 3; ++k) z += xv[i * 3 + k] * wv[k * 4 + j];
        double dz = 1 - std::tanh(z) * std::tanh(z);
        gb[j] += dz;
        for (int k = 0; k < 3; ++k) gW[k * 4 + j] += xv[i * 3 + k] * dz;
      }
  }

  struct Snapshot {
    memory::Stats stats;
    Values w, b, gw, gb;
    RngState rng;
    bool grad_mode;
  };
  Snapshot snapshot() const {
    return {memory::stats(), W.to_vector(), b.to_vector(), W.grad().to_vector(), b.grad().to_vector(), rng_state(),
            grad_enabled()};
  }

  // Runs `bad`, which must throw remat::Error mentioning every needle, then checks that nothing
  // changed and that a valid backward still gives the right gradients.
  void expect_error(const std::function<void()>& bad, const std::vector<std::string>& needles) {
    Snapshot before = snapshot();
    std::string message;
    bool threw = false;
    try {
      bad();
    } catch (const Error& e) {
      threw = true;
      message = e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "threw a " << typeid(e).name() << " instead of remat::Error: " << e.what();
      return;
    }
    ASSERT_TRUE(threw) << "no remat::Error thrown (expected one mentioning '" << needles.at(0) << "')";
    for (const auto& n : needles) EXPECT_NE(message.find(n), std::string::npos) << "'" << n << "' missing in: " << message;

    Snapshot after = snapshot();
    for (size_t t = 0; t < memory::kTagCount; ++t)
      EXPECT_EQ(after.stats.live_bytes[t], before.stats.live_bytes[t])
          << memory::tag_name(static_cast<memory::Tag>(t)) << " bytes leaked or lost by: " << message;
    EXPECT_EQ(after.w, before.w) << "W changed";
    EXPECT_EQ(after.b, before.b) << "b changed";
    EXPECT_EQ(after.gw, before.gw) << "W.grad changed";
    EXPECT_EQ(after.gb, before.gb) << "b.grad changed";
    EXPECT_EQ(after.rng, before.rng) << "RNG state changed";
    EXPECT_EQ(after.grad_mode, before.grad_mode) << "grad mode changed";

    // a valid step afterwards accumulates exactly one correct step
    Values gW, gb;
    expected_step(gW, gb);
    Tensor l = loss();
    EXPECT_TRUE(l.requires_grad()) << "ops no longer record after the error";
    l.backward();
    auto new_gw = W.grad().to_vector(), new_gb = b.grad().to_vector();
    for (size_t i = 0; i < gW.size(); ++i) EXPECT_NEAR(new_gw[i], before.gw[i] + gW[i], 1e-12) << "dW " << i;
    for (size_t i = 0; i < gb.size(); ++i) EXPECT_NEAR(new_gb[i], before.gb[i] + gb[i], 1e-12) << "db " << i;
    EXPECT_EQ(memory::stats().live(memory::Tag::saved), before.stats.live(memory::Tag::saved));
  }
};

Tensor ones64(const Shape& s) { return ones(s, DType::f64); }

// ---- matmul

TEST_F(Errors, MatmulInnerDimensionsDiffer) {
  expect_error([] { matmul(ones({2, 3}), ones({4, 5})); }, {"matmul", "[2, 3]", "[4, 5]"});
}
TEST_F(Errors, MatmulWithParameterWrongOrientation) {
  expect_error([&] { matmul(W, x); }, {"matmul", "[3, 4]", "[2, 3]"});
}
TEST_F(Errors, MatmulTransposedInnerDimensionsDiffer) {
  expect_error([&] { matmul(x, W, false, true); }, {"matmul", "[2, 3]", "[3, 4]", "transposed"});
}
TEST_F(Errors, MatmulRankOne) {
  expect_error([] { matmul(ones({3}), ones({3, 2})); }, {"matmul", "[3]", "[3, 2]"});
}
TEST_F(Errors, MatmulBatchShapesDoNotBroadcast) {
  expect_error([] { matmul(ones({2, 3, 4}), ones({3, 4, 5})); }, {"matmul", "[2]", "[3]"});
}
TEST_F(Errors, MatmulDtypeMismatch) {
  expect_error([&] { matmul(x, ones({3, 4}, DType::f32)); }, {"matmul", "f64", "f32"});
}

// ---- elementwise and broadcasting

TEST_F(Errors, AddBadBroadcast) {
  expect_error([&] { add(W, ones64({3})); }, {"add", "[3, 4]", "[3]"});
}
TEST_F(Errors, MulBadBroadcastWithGradInputs) {
  expect_error([&] { mul(b, ones64({3})); }, {"mul", "[4]", "[3]"});
}
TEST_F(Errors, MaximumBadBroadcast) {
  expect_error([&] { maximum(W, ones64({4, 3})); }, {"maximum", "[3, 4]", "[4, 3]"});
}
TEST_F(Errors, WhereBadBroadcast) {
  expect_error([&] { where(from_indices({1, 0}, {2}), W, W); }, {"where", "[2]", "[3, 4]"});
}
TEST_F(Errors, MaskedFillMaskLargerThanInput) {
  expect_error([&] { masked_fill(b, from_indices({1, 0, 1, 0, 1, 0, 1, 0}, {2, 4}), 0.0); },
               {"masked_fill", "[2, 4]", "[4]"});
}
TEST_F(Errors, AddDtypeMismatch) {
  expect_error([&] { add(W, ones({3, 4}, DType::f32)); }, {"add", "f64", "f32", "[3, 4]"});
}
TEST_F(Errors, IndexTensorIntoUnaryOp) {
  expect_error([] { exp(from_indices({1, 2, 3}, {3})); }, {"exp", "i64", "[3]"});
}
TEST_F(Errors, IndexTensorIntoBinaryOp) {
  expect_error([] { add(from_indices({1, 2}, {2}), from_indices({1, 2}, {2})); }, {"add", "i64", "[2]"});
}
TEST_F(Errors, IndexTensorIntoReduction) {
  expect_error([] { sum(from_indices({1, 2}, {2})); }, {"sum", "i64"});
}
TEST_F(Errors, IndexTensorIntoSoftmax) {
  expect_error([] { softmax(from_indices({1, 2}, {2})); }, {"softmax", "i64", "[2]"});
}
TEST_F(Errors, DivideByScalarZero) {
  expect_error([&] { W / 0.0; }, {"div", "[3, 4]", "0"});
}

// ---- axes

TEST_F(Errors, SumAxisOutOfRange) {
  expect_error([&] { sum(W, {2}); }, {"sum", "axis 2", "[3, 4]"});
}
TEST_F(Errors, MeanAxisGivenTwice) {
  expect_error([&] { mean(W, {1, -1}); }, {"mean", "axis -1", "twice"});
}
TEST_F(Errors, MaxNegativeAxisOutOfRange) {
  expect_error([&] { max(W, {-3}); }, {"max", "-3", "[3, 4]"});
}
TEST_F(Errors, ArgmaxAxisOutOfRange) {
  expect_error([&] { argmax(W, 5); }, {"argmax", "5", "[3, 4]"});
}
TEST_F(Errors, SoftmaxAxisOutOfRange) {
  expect_error([&] { log_softmax(W, 2); }, {"log_softmax", "axis 2", "[3, 4]"});
}
TEST_F(Errors, PermuteRepeatedAxis) {
  expect_error([&] { W.permute({0, 0}); }, {"permute", "axis 0", "repeated"});
}
TEST_F(Errors, PermuteWrongNumberOfAxes) {
  expect_error([&] { W.permute({1, 0, 2}); }, {"permute", "3 axes", "[3, 4]"});
}
TEST_F(Errors, TransposeAxisOutOfRange) {
  expect_error([&] { W.transpose(0, 2); }, {"transpose", "axis 2", "[3, 4]"});
}
TEST_F(Errors, SliceStepZero) {
  expect_error([&] { W.slice(0, 0, 3, 0); }, {"slice", "step", "0"});
}
TEST_F(Errors, SliceAxisOutOfRange) {
  expect_error([&] { W.slice(-3, 0, 1); }, {"slice", "-3", "[3, 4]"});
}
TEST_F(Errors, SqueezeAxisNotOne) {
  expect_error([&] { W.squeeze(0); }, {"squeeze", "[3, 4]", "size 3"});
}

// ---- shapes

TEST_F(Errors, ReshapeToWrongNumel) {
  expect_error([&] { W.reshape({5, 2}); }, {"reshape", "[3, 4]", "[5, 2]"});
}
TEST_F(Errors, ReshapeTwoInferredAxes) {
  expect_error([&] { W.reshape({-1, -1}); }, {"reshape", "[-1, -1]"});
}
TEST_F(Errors, ViewOfNonContiguous) {
  expect_error([&] { W.transpose(0, 1).view({12}); }, {"view", "[4, 3]", "contiguous"});
}
TEST_F(Errors, RankAboveSixOnCreation) {
  expect_error([] { Tensor::empty({1, 1, 1, 1, 1, 1, 1}); }, {"empty", "[1, 1, 1, 1, 1, 1, 1]", "6"});
}
TEST_F(Errors, RankAboveSixOnReshape) {
  expect_error([&] { W.reshape({1, 1, 1, 1, 1, 3, 4}); }, {"reshape", "[1, 1, 1, 1, 1, 3, 4]", "6"});
}
TEST_F(Errors, RankAboveSixOnExpand) {
  expect_error([&] { b.expand({1, 1, 1, 1, 1, 2, 4}); }, {"expand", "[1, 1, 1, 1, 1, 2, 4]", "6"});
}
TEST_F(Errors, ExpandIncompatible) {
  expect_error([&] { W.expand({2, 3, 5}); }, {"expand", "[3, 4]", "[2, 3, 5]"});
}
TEST_F(Errors, CopyIntoParameterWithBadShape) {
  expect_error([&] { NoGradGuard g; W.copy_(ones64({3})); }, {"copy_", "[3]", "[3, 4]"});
}
TEST_F(Errors, SetGradWithWrongShape) {
  expect_error([&] { W.set_grad(ones64({4, 3})); }, {"set_grad", "[4, 3]", "[3, 4]"});
}

// ---- autodiff misuse

TEST_F(Errors, RequiresGradOnNonLeaf) {
  expect_error([&] { tanh(W).requires_grad_(); }, {"requires_grad_", "[3, 4]", "tanh"});
}
TEST_F(Errors, RequiresGradOnIndexTensor) {
  expect_error([] { from_indices({1, 2}, {2}).requires_grad_(); }, {"requires_grad_", "i64"});
}
TEST_F(Errors, BackwardOnNonScalarWithoutGradient) {
  expect_error([&] { tanh(W).backward(); }, {"backward", "[3, 4]", "scalar"});
}
TEST_F(Errors, BackwardWithGradientOfWrongShape) {
  expect_error([&] { tanh(W).backward(ones64({4, 3})); }, {"backward", "[4, 3]", "[3, 4]"});
}
TEST_F(Errors, BackwardWithGradientOfWrongDtype) {
  expect_error([&] { tanh(W).backward(ones({3, 4}, DType::f32)); }, {"backward", "f32", "f64"});
}
TEST_F(Errors, BackwardOnTensorWithoutHistory) {
  expect_error([] { ones({}).backward(); }, {"backward", "[]", "does not require grad"});
}
TEST_F(Errors, GradOfInputThatDoesNotRequireGrad) {
  expect_error([&] { remat::grad({sum(W)}, {x}); }, {"grad", "input 0"});
}
TEST_F(Errors, BackwardTwiceWithoutRetainGraph) {
  Tensor l = sum(tanh(matmul(x, W)));
  l.backward();  // valid: its contribution is part of the state before the bad call
  expect_error([&] { l.backward(); }, {"tanh", "[2, 4]", "already freed", "retain_graph"});
}
TEST_F(Errors, SavedOutputModifiedInPlace) {
  expect_error(
      [&] {
        Tensor t = exp(W);  // exp saves its output
        t.fill_(1.0);
        sum(t).backward();
      },
      {"exp", "[3, 4]", "modified in place"});
}
TEST_F(Errors, SavedInputModifiedInPlace) {
  expect_error(
      [&] {
        Tensor h = mul_scalar(W, 2.0);
        Tensor y = mul(h, W);  // mul saves both inputs
        h.copy_(ones64({3, 4}));
        sum(y).backward();
      },
      {"mul", "[3, 4]", "modified in place"});
}
TEST_F(Errors, CustomOpBackwardReturnsWrongShape) {
  static const CustomOp bad{"bad_shape",
                            [](const TensorList& in, SaveContext&) { return TensorList{mul_scalar(in[0], 2.0)}; },
                            [](const TensorList&, const SavedValues&) { return TensorList{ones({2}, DType::f64)}; }};
  expect_error([&] { sum(bad({W})[0]).backward(); }, {"bad_shape", "[2]", "[3, 4]"});
}

// ---- indexing, losses, dropout, joining, normalisation

TEST_F(Errors, EmbeddingIdOutOfRange) {
  expect_error([&] { embedding(W, from_indices({0, 7}, {2})); }, {"embedding", "7"});
}
TEST_F(Errors, EmbeddingNegativeId) {
  expect_error([&] { embedding(W, from_indices({-1}, {1})); }, {"embedding", "-1"});
}
TEST_F(Errors, EmbeddingFloatIds) {
  expect_error([&] { embedding(W, ones({2})); }, {"embedding", "f32", "[2]"});
}
TEST_F(Errors, CrossEntropyTargetOutOfRange) {
  expect_error([&] { cross_entropy(W, from_indices({0, 9, 1}, {3})); }, {"cross_entropy", "9"});
}
TEST_F(Errors, CrossEntropyTargetsOfWrongLength) {
  expect_error([&] { cross_entropy(W, from_indices({0, 1}, {2})); }, {"cross_entropy", "[2]", "[3, 4]"});
}
TEST_F(Errors, CrossEntropyBadLabelSmoothing) {
  expect_error([&] { cross_entropy(W, from_indices({0, 1, 2}, {3}), 1.5); }, {"cross_entropy", "1.5"});
}
TEST_F(Errors, DropoutProbabilityAboveOne) {
  expect_error([&] { dropout(W, 1.5); }, {"dropout", "1.5"});
}
TEST_F(Errors, DropoutNegativeProbability) {
  expect_error([&] { dropout(W, -0.25, RngState{1, 0}); }, {"dropout", "-0.25"});
}
TEST_F(Errors, ConcatMismatchedShapes) {
  expect_error([&] { concat({W, ones64({2, 3})}, 1); }, {"concat", "[2, 3]", "[3, 4]"});
}
TEST_F(Errors, ConcatDtypeMismatch) {
  expect_error([&] { concat({W, ones({3, 4}, DType::f32)}, 0); }, {"concat", "f32", "f64"});
}
TEST_F(Errors, SplitSizesDoNotSum) {
  expect_error([&] { split(W, {1, 1}, 0); }, {"split", "[3, 4]", "2"});
}
TEST_F(Errors, SplitAxisOutOfRange) {
  expect_error([&] { split(W, {3}, 2); }, {"split", "axis 2", "[3, 4]"});
}
TEST_F(Errors, LayerNormWeightShape) {
  expect_error([&] { layer_norm(W, ones64({3}), Tensor()); }, {"layer_norm", "[3]"});
}
TEST_F(Errors, LayerNormBiasDtype) {
  expect_error([&] { layer_norm(W, b, ones({4}, DType::f32)); }, {"layer_norm", "f32", "f64"});
}
TEST_F(Errors, RmsNormWeightShape) {
  expect_error([&] { rms_norm(W, ones64({5})); }, {"rms_norm", "[5]"});
}

// ---- element access, factories, settings

TEST_F(Errors, ItemOnMultiElementTensor) {
  expect_error([&] { W.item(); }, {"item", "[3, 4]", "12"});
}
TEST_F(Errors, AtIndexOutOfRange) {
  expect_error([&] { W.at({3, 0}); }, {"at", "3", "[3, 4]"});
}
TEST_F(Errors, FromVectorWrongCount) {
  expect_error([] { from_vector(Values{1, 2, 3}, {2, 2}); }, {"from_vector", "3", "[2, 2]"});
}
TEST_F(Errors, ArangeZeroStep) {
  expect_error([] { arange(0.0, 1.0, 0.0); }, {"arange", "step"});
}
TEST_F(Errors, RandEmptyRange) {
  expect_error([] { rand({2}, DType::f32, 1.0, 1.0); }, {"rand", "[1, 1)"});
}
TEST_F(Errors, RandnNegativeStddevLeavesGeneratorAlone) {
  expect_error([] { randn({4}, DType::f64, 0.0, -1.0); }, {"randn", "-1"});
}
TEST_F(Errors, RandNegativeDimensionLeavesGeneratorAlone) {
  expect_error([] { rand({2, -3}); }, {"[2, -3]", "negative"});
}
TEST_F(Errors, SetNumThreadsZero) {
  expect_error([] { set_num_threads(0); }, {"set_num_threads", "0"});
}
TEST_F(Errors, ParseBytesGarbage) {
  expect_error([] { memory::parse_bytes("12XB"); }, {"parse_bytes", "12XB"});
}
TEST_F(Errors, ParseBytesMalformedNumber) {
  expect_error([] { memory::parse_bytes("1.2.3MiB"); }, {"parse_bytes", "1.2.3MiB"});
}

TEST(ErrorType, IsARuntimeError) {
  try {
    matmul(ones({2, 3}), ones({4, 5}));
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("matmul:", 0), 0u) << "messages start with the op name: " << e.what();
  }
}

}  // namespace
