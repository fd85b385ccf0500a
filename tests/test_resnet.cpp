// The CIFAR ResNet (remat/nn/resnet.h): structure and names, the synthetic images, gradients
// bitwise equal under every policy (on shapes whose convolutions run on oneDNN's primitives),
// training reduces the loss, and the deep variant's saved memory under the budget planner grows
// as O(sqrt(N)) blocks (Chen et al. 2016), while every-layer's grows as O(N).
#include <gtest/gtest.h>

#include <cmath>

#include "checkpoint_models.h"
#include "remat/nn.h"
#include "schedule/chain_internal.h"

using namespace remat;
using remat::testing::bitwise_equal;

namespace {

TEST(ResNet, StructureAndParameterNames) {
  nn::ResNet model({.stages = 3, .blocks_per_stage = 2, .width = 4, .classes = 7});
  EXPECT_EQ(model.config().depth(), 14);
  EXPECT_EQ(model.layers->size(), 8u);  // stem, 6 blocks, head
  EXPECT_EQ(model.batch_norms().size(), 13u);
  auto names = model.named_parameters();
  EXPECT_EQ(names.front().first, "layers.0.weight");
  EXPECT_EQ(names.front().second.shape(), (Shape{4, 3, 3, 3}));
  EXPECT_NO_THROW(model.parameter("layers.1.fn.bn1.weight"));
  EXPECT_NO_THROW(model.parameter("layers.2.fn.conv2.weight"));
  EXPECT_EQ(model.parameter("layers.3.shortcut.weight").shape(), (Shape{8, 4, 1, 1}));
  EXPECT_EQ(model.parameter("layers.5.conv1.weight").shape(), (Shape{16, 8, 3, 3}));
  EXPECT_EQ(model.parameter("layers.7.fc.weight").shape(), (Shape{7, 16}));
  Tensor logits = model.forward(zeros({2, 3, 8, 8}));
  EXPECT_EQ(logits.shape(), (Shape{2, 7}));
  EXPECT_EQ(model.forward(zeros({2, 3, 7, 5})).shape(), (Shape{2, 7}));  // odd sizes round up
  EXPECT_THROW(model.forward(zeros({2, 3, 0, 8})), Error);
  EXPECT_THROW(model.forward(zeros({2, 1, 8, 8})), Error);
  EXPECT_THROW(model.loss(zeros({2, 3, 8, 8}), from_indices({0, 1, 2}, {3})), Error);
}

TEST(ResNet, SyntheticImagesAreSeededAndBalanced) {
  auto a = nn::make_synthetic_images({.count = 20, .classes = 5, .size = 8, .seed = 4});
  auto b = nn::make_synthetic_images({.count = 20, .classes = 5, .size = 8, .seed = 4});
  auto c = nn::make_synthetic_images({.count = 20, .classes = 5, .size = 8, .seed = 5});
  EXPECT_EQ(a.images.shape(), (Shape{20, 3, 8, 8}));
  EXPECT_TRUE(bitwise_equal(a.images, b.images));
  EXPECT_FALSE(bitwise_equal(a.images, c.images));
  auto labels = a.labels.to_vector();
  for (size_t i = 0; i < labels.size(); ++i) EXPECT_EQ(labels[i], static_cast<double>(i % 5));
  EXPECT_THROW(nn::make_synthetic_images({.count = 0}), Error);
}

// Big enough that the block convolutions exceed the small-problem threshold of
// src/tensor/cpu/conv.cpp (2 MFLOP) and run on oneDNN's primitives in float32.
nn::ResNetConfig medium_config() { return {.stages = 1, .blocks_per_stage = 2, .width = 8, .seed = 11}; }

struct PolicyRun {
  TensorList grads;
  size_t peak_saved = 0;  // of the last step
};

PolicyRun run_under(const Policy& policy, int steps) {
  auto model = std::make_shared<nn::ResNet>(medium_config());
  auto data = nn::make_synthetic_images({.count = 8, .size = 16, .seed = 3});
  ScopedPolicy scoped(policy);
  PolicyRun r;
  for (int s = 0; s < steps; ++s) {
    model->zero_grad();
    memory::reset_peaks();
    const size_t base = memory::live_bytes(memory::Tag::saved);
    model->loss(data.images, data.labels).backward();
    r.peak_saved = memory::peak_bytes(memory::Tag::saved) - base;
  }
  for (const auto& p : model->parameters()) r.grads.push_back(p.grad());
  return r;
}

TEST(ResNet, GradientsAreBitwiseEqualUnderEveryPolicy) {
  const int steps = 3;  // budget: two profiling steps, then the plan
  const PolicyRun save_all = run_under(Policy::save_all(), steps);
  const PolicyRun every_layer = run_under(Policy::every_layer(), 1);
  ASSERT_LT(every_layer.peak_saved, save_all.peak_saved);
  const TensorList& reference = save_all.grads;
  for (const Policy& policy : {Policy::every_layer(), Policy::every_k(2), Policy::selective({"conv2d"}),
                               Policy::budget((save_all.peak_saved + every_layer.peak_saved) / 2)}) {
    SCOPED_TRACE(policy.to_string());
    reset_counters();
    const TensorList grads = run_under(policy, steps).grads;
    EXPECT_GT(counters().regions_recomputed, 0u);
    ASSERT_EQ(grads.size(), reference.size());
    for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(bitwise_equal(grads[i], reference[i])) << "parameter " << i;
  }
}

TEST(ResNet, TrainingReducesTheLoss) {
  auto model = std::make_shared<nn::ResNet>(nn::ResNetConfig{.stages = 2, .blocks_per_stage = 1, .width = 4, .seed = 1});
  auto data = nn::make_synthetic_images({.count = 20, .size = 8, .noise = 0.3, .seed = 9});
  nn::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    opt.zero_grad();
    Tensor loss = model->loss(data.images, data.labels);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item();
  }
  EXPECT_LT(last, 0.7 * first) << "loss " << first << " -> " << last;
}

// ---- O(sqrt(N)) under the budget planner

struct DeepRun {
  size_t every_layer_peak = 0;  // saved bytes
  size_t limit = 0;             // the smallest chain limit with at most one recomputation per stage
  size_t budget = 0;            // limit + the saved bytes outside the chain
  size_t budget_peak = 0;       // measured under budget:`budget`
};

// The smallest chain memory limit whose rotor plan computes every stage at most twice, with
// equal stage times so that the planner minimises recomputation (Chen's "one extra forward").
size_t one_recomputation_limit(schedule::ChainCosts costs) {
  const int stages = costs.num_stages();
  for (int i = 0; i < stages; ++i) {
    costs.forward_time[static_cast<size_t>(i)] = 1.0;
    costs.backward_time[static_cast<size_t>(i)] = 2.0;
  }
  auto fits = [&](size_t m) {
    return schedule::simulate(costs, schedule::plan_rotor(costs, m, 200)).recomputed_forwards <= stages;
  };
  size_t lo = schedule::min_feasible_memory(costs), hi = schedule::plan_save_all(costs).predicted_peak_bytes;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (fits(mid)) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

size_t peak_saved_step(nn::ResNet& model, const nn::SyntheticImages& data) {
  memory::reset_peaks();
  const size_t base = memory::live_bytes(memory::Tag::saved);
  model.zero_grad();
  model.loss(data.images, data.labels).backward();
  return memory::peak_bytes(memory::Tag::saved) - base;
}

DeepRun deep_run(int64_t blocks) {
  // one stage: every block has the same boundary, as in the uniform chains of the analysis
  nn::ResNet model({.stages = 1, .blocks_per_stage = blocks, .width = 2, .classes = 2, .seed = 1});
  auto data = nn::make_synthetic_images({.count = 2, .classes = 2, .channels = 3, .size = 4, .seed = 1});
  DeepRun r;
  size_t save_all_peak = 0;
  {
    ScopedPolicy scoped(Policy::every_layer());
    r.every_layer_peak = peak_saved_step(model, data);
  }
  {
    ScopedPolicy scoped(Policy::save_all());
    save_all_peak = peak_saved_step(model, data);
  }
  // profile under a budget between the two (its plan has regions), then plan from the kept
  // profile for the threshold budget
  ScopedPolicy generous(Policy::budget((r.every_layer_peak + save_all_peak) / 2));
  for (int i = 0; i <= BudgetPlanner::kProfilingSteps; ++i) peak_saved_step(model, data);
  auto report = model.planner()->report();
  EXPECT_TRUE(report.has_value());
  if (!report) return r;
  r.limit = one_recomputation_limit(report->costs);
  r.budget = r.limit + report->outside_bytes;
  ScopedPolicy tight(Policy::budget(r.budget));
  peak_saved_step(model, data);  // plans for the new budget
  r.budget_peak = peak_saved_step(model, data);
  return r;
}

TEST(DeepResNet, SavedMemoryUnderTheBudgetPlannerGrowsAsSqrtN) {
  const DeepRun small = deep_run(16), large = deep_run(64);
  // the planner's budget is met
  EXPECT_LE(small.budget_peak, small.budget);
  EXPECT_LE(large.budget_peak, large.budget);
  // 4x the blocks: every-layer keeps ~4x (one boundary per block), the one-recomputation
  // budget ~2x (sqrt(4)); the bounds leave room for the constant parts (the loss, the head)
  const double linear = static_cast<double>(large.every_layer_peak) / static_cast<double>(small.every_layer_peak);
  const double sqrt_like = static_cast<double>(large.limit) / static_cast<double>(small.limit);
  EXPECT_GT(linear, 2.8) << small.every_layer_peak << " -> " << large.every_layer_peak;
  EXPECT_LT(sqrt_like, 2.2) << small.limit << " -> " << large.limit;
  EXPECT_LT(static_cast<double>(large.limit), 0.6 * static_cast<double>(large.every_layer_peak));
  EXPECT_GT(sqrt_like, 1.4) << small.limit << " -> " << large.limit;
  EXPECT_LT(large.budget_peak, large.every_layer_peak);
}

}  // namespace
