// A region's recomputation runs only the ops whose results the backward pass reads (Note
// [skipping dead ops] in src/checkpoint/dead_ops.cpp): the rest are recorded but not run, their
// values computed only if something reads them after all, and gradients stay bitwise equal to
// save-all's.
#include <gtest/gtest.h>

#include "checkpoint_models.h"
#include "gpt_steps.h"
#include "remat/nn.h"

using namespace remat;
using remat::testing::bitwise_equal;
using remat::testing::gpt_gradients;
using remat::testing::token_ids;

namespace {

// x + tanh(x W1) W2: the backward reads x, W1, tanh's output and W2, never the second matmul's
// output or the sum's.
struct Block {
  Tensor w1 = randn({32, 32}, DType::f32, RngState{1, 0}, 0.0, 0.2).requires_grad_();
  Tensor w2 = randn({32, 32}, DType::f32, RngState{2, 0}, 0.0, 0.2).requires_grad_();
  std::function<void(const Tensor&)> peek;  // reads the dead value on every run, if set
  Tensor operator()(const Tensor& x) const {
    Tensor y = matmul(tanh(matmul(x, w1)), w2);
    if (peek) peek(y);
    return add(x, y);
  }
};

TensorList step(const Block& block, const Tensor& x, const Policy& policy) {
  ScopedPolicy scope(policy);
  Tensor h = checkpoint([&](const Tensor& in) { return block(in); }, x);
  Tensor loss = mean(square(h));
  return remat::grad(TensorList{loss}, {block.w1, block.w2});
}

}  // namespace

TEST(DeadOps, ARegionDoesNotRecomputeWhatItsBackwardDoesNotRead) {
  Block block;
  Tensor x = randn({16, 32}, DType::f32, RngState{3, 0});
  const TensorList reference = step(block, x, Policy::save_all());
  reset_counters();
  const TensorList got = step(block, x, Policy::every_layer());
  const Counters c = counters();
  // the first matmul and tanh run again; the second matmul and the residual add do not
  EXPECT_EQ(c.ops.recomputed_ops, 2u);
  EXPECT_EQ(c.ops.skipped_ops, 2u);
  EXPECT_DOUBLE_EQ(c.ops.skipped_flops, 2.0 * 16 * 32 * 32 + 16 * 32);
  ASSERT_EQ(c.regions.size(), 1u);
  EXPECT_DOUBLE_EQ(c.regions[0].skipped_flops, c.ops.skipped_flops);
  EXPECT_DOUBLE_EQ(c.regions[0].recomputed_flops, c.ops.recomputed_flops);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], reference[i])) << i;
}

TEST(DeadOps, ASkippedValueThatTheModelReadsIsComputedAsOnTheFirstRun) {
  Block block;
  std::vector<double> seen;
  block.peek = [&](const Tensor& y) { seen.push_back(y.at({3, 5})); };  // not an op: the analysis cannot see it
  Tensor x = randn({16, 32}, DType::f32, RngState{3, 0});
  const TensorList reference = step(block, x, Policy::save_all());
  seen.clear();
  reset_counters();
  const TensorList got = step(block, x, Policy::every_layer());
  ASSERT_EQ(seen.size(), 2u);  // the first run and the recomputation
  EXPECT_EQ(seen[0], seen[1]);
  EXPECT_EQ(counters().ops.skipped_ops, 2u);  // skipped, then computed when read
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], reference[i])) << i;
}

TEST(DeadOps, ASkippedValueReadAfterItsInputWasWrittenInPlaceRaises) {
  Block block;
  Tensor x = randn({16, 32}, DType::f32, RngState{3, 0});
  block.peek = [&](const Tensor& y) {
    if (autodiff::recompute_depth() == 0) return;
    block.w2.storage()->bump_version();  // as an in-place write of the weight would
    (void)y.at({0, 0});
  };
  try {
    step(block, x, Policy::every_layer());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("written in place"), std::string::npos) << e.what();
  }
}

// A GPT block's last projection (the MLP's second linear layer) and the residual add after it are
// not recomputed, whose backward formulas read the projection's input and weight only; the
// attention's projection feeds the first residual sum, which the second layer norm saves, so it
// runs. Under dropout the projections would run too (dropout draws random numbers, so it always
// runs, and reads its input; test_attention.cpp covers dropout under every policy). Gradients are
// save-all's.
TEST(DeadOps, AGptBlockSkipsItsLastProjection) {
  nn::GPTConfig config{.vocab = 13, .layers = 2, .width = 32, .heads = 2, .seq = 16, .dropout = 0.0,
                       .dtype = DType::f32, .seed = 4};
  nn::GPT model(config);
  Tensor ids = token_ids(2, 16, 13, 31);
  Tensor targets = token_ids(2, 16, 13, 32);
  auto grads_under = [&](const Policy& policy) { return gpt_gradients(model, ids, targets, policy, 33); };
  const TensorList reference = grads_under(Policy::save_all());
  reset_counters();
  const TensorList got = grads_under(Policy::every_layer());
  const Counters c = counters();
  const double tokens = 2 * 16, width = 32;
  const double last_projection = 2 * tokens * (4 * width) * width, residual_add = tokens * width;
  int blocks = 0;
  double region_skipped = 0;
  for (const auto& r : c.regions) {
    region_skipped += r.skipped_flops;
    if (r.label.rfind("blocks.", 0) != 0) continue;
    ++blocks;
    EXPECT_DOUBLE_EQ(r.skipped_flops, last_projection + residual_add) << r.label << "\n" << memory_report(c, 0);
    EXPECT_GT(r.recomputed_flops, 0.0) << r.label;
  }
  EXPECT_EQ(blocks, config.layers);
  EXPECT_DOUBLE_EQ(region_skipped, c.ops.skipped_flops);
  ASSERT_EQ(got.size(), reference.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], reference[i])) << i;
}

// A scalar the model captured and changed between the passes, read by an op the recomputation
// skips: the skipped op is recorded as its first run made it, so the gradient is save-all's.
TEST(DeadOps, ASkippedOpKeepsItsFirstRunsScalars) {
  Tensor w = randn({8, 8}, DType::f32, RngState{5, 0}, 0.0, 0.3).requires_grad_();
  Tensor x = randn({4, 8}, DType::f32, RngState{6, 0});
  auto gradient = [&](const Policy& policy) {
    double scale = 1.5;
    ScopedPolicy scope(policy);
    Tensor h = tanh(matmul(x, w));
    Tensor y = checkpoint([&](const Tensor& in) { return mul_scalar(in, scale); }, h);  // nothing to recompute
    Tensor loss = sum(square(y));
    scale = 2.5;
    reset_counters();
    return remat::grad(TensorList{loss}, {w})[0];
  };
  const Tensor reference = gradient(Policy::save_all());
  const Tensor got = gradient(Policy::every_layer());
  EXPECT_EQ(counters().ops.recomputed_ops, 0u);
  EXPECT_EQ(counters().ops.skipped_ops, 1u);
  EXPECT_TRUE(bitwise_equal(got, reference));
}

// The recomputation check looks at the values the skipped ops read: a captured scalar changed in
// an op that runs (its output is read by the skipped last matmul) is an error naming the region,
// as it was when the region's outputs were recomputed and compared.
TEST(DeadOps, ARecomputedValueThatASkippedOpReadsIsChecked) {
  Tensor w = randn({8, 8}, DType::f32, RngState{5, 0}, 0.0, 0.3).requires_grad_();
  Tensor x = randn({4, 8}, DType::f32, RngState{6, 0}).requires_grad_();
  double scale = 1.5;
  ScopedPolicy scope(Policy::every_layer());
  CheckpointOptions options;
  options.label = "scaled projection";
  Tensor y = checkpoint([&](const TensorList& in) { return TensorList{add(in[0], matmul(mul_scalar(in[0], scale), w))}; },
                        {x}, options)[0];
  Tensor loss = sum(square(y));
  scale = 2.5;
  try {
    loss.backward();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'scaled projection'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("skips"), std::string::npos) << e.what();
  }
}

// Once the recomputation has built its sub-tape, a skipped op lets go of its inputs, so the
// backward frees each value when its last reader is done, as without skipping: the GELU output,
// which only the skipped last matmul reads, is gone when the backward reaches the op before it.
TEST(DeadOps, ASkippedOpsInputsAreFreedWhenTheirLastReaderIsDone) {
  Tensor w1 = randn({32, 32}, DType::f32, RngState{1, 0}, 0.0, 0.2).requires_grad_();
  Tensor w2 = randn({32, 32}, DType::f32, RngState{2, 0}, 0.0, 0.2).requires_grad_();
  Tensor x = randn({16, 32}, DType::f32, RngState{3, 0});
  std::weak_ptr<Storage> gelu_output;  // the recomputation's
  int probes = 0;
  bool freed = false;
  // identity whose backward looks whether the GELU output is still held
  CustomOp probe{"probe", [](const TensorList& in, SaveContext&) { return TensorList{mul_scalar(in[0], 1.0)}; },
                 [&](const TensorList& grads, const SavedValues&) {
                   freed = gelu_output.expired();
                   ++probes;
                   return TensorList{grads[0]};
                 }};
  auto layer = [&](const Tensor& in) {
    Tensor g = gelu(probe({matmul(in, w1)})[0]);
    if (autodiff::recompute_depth() > 0) gelu_output = g.storage();
    return add(in, matmul(g, w2));
  };
  ScopedPolicy scope(Policy::every_layer());
  reset_counters();
  Tensor loss = mean(square(checkpoint(layer, x)));
  remat::grad(TensorList{loss}, {w1, w2});
  EXPECT_EQ(counters().ops.skipped_ops, 2u);  // the last matmul and the add
  EXPECT_EQ(probes, 1);
  EXPECT_TRUE(freed);
}
