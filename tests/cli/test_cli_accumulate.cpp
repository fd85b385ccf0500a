// `remat train --accumulate K` (src/tools/data_parallel.cpp), linked directly: the step gradient
// is the mean of the K micro-batch gradients, each computed as a lone backward pass would, added
// in order; the same bits under every policy; K = 1 is a plain backward pass.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "commands.h"
#include "corpus.h"
#include "data_parallel.h"
#include "remat/nn.h"
#include "remat/remat.h"

using namespace remat;
using namespace remat::tools;

namespace {

std::vector<int64_t> token_stream() {
  std::vector<int64_t> t;
  for (int i = 0; i < 4000; ++i) t.push_back((i * 7 + i / 13) % 11);
  return t;
}

struct MicroRun {
  std::vector<std::vector<float>> grads;
  double loss = 0;
};

std::vector<std::vector<float>> grads_of(const nn::GPT& model) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : model.parameters()) {
    Tensor g = p.grad().contiguous();
    const float* d = static_cast<const float*>(g.raw_data());
    out.emplace_back(d, d + g.numel());
  }
  return out;
}

constexpr uint64_t kSeed = 5;
constexpr int64_t kBatch = 2, kSeq = 8;

nn::GPTConfig config(double dropout) {
  return {.vocab = 11, .layers = 2, .width = 16, .heads = 2, .seq = kSeq, .dropout = dropout, .dtype = DType::f32,
          .seed = 3};
}

MicroRun accumulated(const std::string& policy, int64_t k, int64_t step, double dropout) {
  nn::GPT model(config(dropout));
  DataParallel dp;
  dp.accumulate = k;
  StepGradients s = step_gradients(model, token_stream(), kBatch, kSeq, kSeed, Policy::parse(policy), step, dp);
  return {grads_of(model), s.loss};
}

// Micro-batch `index` alone: its batch and dropout stream, a plain backward pass.
MicroRun lone(int64_t index, double dropout) {
  nn::GPT model(config(dropout));
  Batch b = sample_batch(token_stream(), kBatch, kSeq, kSeed, static_cast<uint64_t>(index));
  manual_seed(kSeed * 1000003ull + static_cast<uint64_t>(index));
  Tensor loss = backward([&] { return model.loss(b.inputs, b.targets); }, GradOptions{Policy::save_all()});
  return {grads_of(model), loss.item()};
}

}  // namespace

TEST(Accumulate, OneMicroBatchIsAPlainBackwardPass) {
  MicroRun a = accumulated("save-all", 1, 3, 0.1);
  MicroRun b = lone(3, 0.1);  // step 3 of K = 1 is micro-batch 3
  EXPECT_EQ(a.loss, b.loss);
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) EXPECT_EQ(a.grads[i], b.grads[i]) << "parameter " << i;
}

TEST(Accumulate, GradientIsTheMeanOfTheMicroBatchesAddedInOrder) {
  for (int64_t k : {2, 3}) {
    for (double dropout : {0.0, 0.1}) {
      SCOPED_TRACE(testing::Message() << "K " << k << ", dropout " << dropout);
      const int64_t step = 1;
      std::vector<MicroRun> parts;
      for (int64_t m = 0; m < k; ++m) parts.push_back(lone(step * k + m, dropout));
      MicroRun a = accumulated("save-all", k, step, dropout);
      double loss = 0;
      for (const MicroRun& p : parts) loss += p.loss;
      EXPECT_EQ(a.loss, loss / static_cast<double>(k));
      for (size_t i = 0; i < a.grads.size(); ++i) {
        std::vector<float> expected = parts[0].grads[i];
        for (int64_t m = 1; m < k; ++m)
          for (size_t j = 0; j < expected.size(); ++j) expected[j] = expected[j] + parts[static_cast<size_t>(m)].grads[i][j];
        for (float& e : expected) e *= static_cast<float>(1.0 / static_cast<double>(k));
        EXPECT_EQ(a.grads[i], expected) << "parameter " << i;
      }
      // the micro-batches differ: the accumulated gradient is not one of them
      EXPECT_NE(a.grads, parts[0].grads);
    }
  }
}

TEST(Accumulate, EveryPolicyGivesTheSameBits) {
  MicroRun reference = accumulated("save-all", 2, 0, 0.1);
  for (const char* policy : {"every-layer", "every-k:2", "selective:matmul", "budget:1MiB"}) {
    SCOPED_TRACE(policy);
    MicroRun r = accumulated(policy, 2, 0, 0.1);
    EXPECT_EQ(r.loss, reference.loss);
    EXPECT_EQ(r.grads, reference.grads);
  }
}

// --fuse-optimizer: AdamW inside the last micro-batch's backward gives the parameters of the
// unfused step (step_gradients, then AdamW::step) bit for bit, and frees every gradient.
TEST(Accumulate, FusedOptimizerStepEqualsTheUnfusedStep) {
  for (int64_t k : {1, 2, 3}) {
    for (const char* policy : {"save-all", "every-layer", "dynamic:64KiB"}) {
      SCOPED_TRACE(::testing::Message() << "K " << k << ", " << policy);
      nn::GPT plain(config(0.1)), fused(config(0.1));
      const nn::AdamWOptions adam{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.01};
      nn::AdamW a(plain.parameters(), adam), b(fused.parameters(), adam);
      DataParallel dp;
      dp.accumulate = k;
      size_t reported = 0;
      FusedUpdate update{&b, [&](const Tensor& p) {
                           EXPECT_TRUE(p.grad().defined());
                           ++reported;
                         }};
      for (int64_t step = 0; step < 2; ++step) {
        const StepGradients sa = step_gradients(plain, token_stream(), kBatch, kSeq, kSeed, Policy::parse(policy), step, dp);
        a.step();
        const StepGradients sb =
            step_gradients(fused, token_stream(), kBatch, kSeq, kSeed, Policy::parse(policy), step, dp, &update);
        EXPECT_EQ(sa.loss, sb.loss);
        const TensorList pa = plain.parameters(), pb = fused.parameters();
        for (size_t i = 0; i < pa.size(); ++i) {
          Tensor x = pa[i].contiguous(), y = pb[i].contiguous();
          EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0) << "step " << step << ", " << pa[i].name();
          EXPECT_FALSE(pb[i].grad().defined()) << pb[i].name();
        }
      }
      EXPECT_EQ(reported, 2 * plain.parameters().size());
    }
  }
}

TEST(Accumulate, BadOptionsAreErrorsBeforeTraining) {
  auto expect_error = [](TrainOptions o, const std::string& fragment) {
    o.data = "/nonexistent-corpus-never-read";  // the option checks come first
    try {
      run_train(o);
      ADD_FAILURE() << "no error; expected " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  TrainOptions o;
  o.accumulate = 0;
  expect_error(o, "--accumulate must be from 1 to 1000000, got 0");
  o.accumulate = kMaxAccumulate + 1;
  expect_error(o, "--accumulate must be from 1 to");
  o.steps = kMaxSteps;  // each is allowed, but steps x accumulate is over the bound on micro-batches
  o.accumulate = kMaxAccumulate;
  expect_error(o, "micro-batches");
  o = TrainOptions{};
  o.reduce = "sum";
  expect_error(o, "train --reduce: expected ordered or native, got \"sum\"");
  o = TrainOptions{};
  o.fuse_optimizer = true;  // with the default --clip 1
  expect_error(o, "--fuse-optimizer updates each parameter as soon as its gradient is final, but clipping by the global "
                  "gradient norm (--clip 1) needs every gradient");
  o.clip = -1;
  expect_error(o, "--clip must be a finite number >= 0, got -1");
  o = TrainOptions{};
  o.bucket_bytes = "lots";
  expect_error(o, "train --bucket-bytes:");
}
