// A record sent to the offload target is written value by value as its forward saves them and read
// back value by value as its backward reads them (ChainCosts::streamed_bytes; Note [a streamed
// record] in src/schedule/simulate.cpp): simulate and the planners count what it keeps in memory at
// once, the profile measures it, and a budget with an offload target then runs below the smallest
// budget in memory, within its prediction and with save-all's gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "checkpoint_models.h"
#include "gpt_steps.h"
#include "module_models.h"
#include "plan_checks.h"
#include "random_chain.h"
#include "remat/budget.h"
#include "remat/nn.h"
#include "remat/schedule.h"
#include "schedule/chain_internal.h"
#include "temp_dir.h"

using namespace remat;
using remat::testing::bitwise_equal;
using remat::testing::expect_plans_within_their_limits;
using remat::testing::smallest_budget_refused;
namespace rs = remat::schedule;
using rs::ChainCosts;
using rs::PlanNode;

namespace {

constexpr size_t K = 1000;

// One step of `model` under `policy`: its gradients, and the peak of saved bytes above what was
// saved before it.
TensorList gpt_grads(nn::GPT& model, const Tensor& ids, const Tensor& targets, const Policy& policy, size_t* peak) {
  ScopedPolicy scope(policy);
  model.zero_grad();
  memory::reset_peaks();
  const size_t base = memory::live_bytes(memory::Tag::saved);
  model.loss(ids, targets).backward();
  *peak = memory::peak_bytes(memory::Tag::saved) - base;
  TensorList grads;
  for (auto& p : model.parameters()) grads.push_back(p.grad().clone());
  return grads;
}

}  // namespace

// Four stages, boundaries K, records 5K (the last K) of which 2K at once when streamed; gradients
// not counted. S0+o S1+o S2+o S3: the forward of S2 holds a_0..a_3 and 2K of its record (6K), the
// forward of S3 a_0..a_4 and its record (6K), and S2's backward a_0..a_3 and 2K again: 6K, where
// the whole records would make it 9K. The reads cannot start ahead whole (9K > 6K).
TEST(ChainSim, AnOffloadedRecordCountsWhatItStreams) {
  ChainCosts c = ChainCosts::uniform(4, 1.0, 2.0, K, 5 * K);
  c.saved_bytes[3] = K;
  c.gradients_counted = false;
  c.offload_seconds_per_byte = 1e-9;
  c.offload_write_seconds_per_byte = 5e-10;
  c.reads_ahead = true;
  std::vector<PlanNode> tree;
  for (int i = 0; i < 4; ++i) {
    tree.push_back(PlanNode::stage(i));
    if (i < 3) tree.back().offload();
  }
  ChainCosts streamed = c;
  streamed.streamed_bytes = {2 * K, 2 * K, 2 * K, K};
  const rs::SimResult sim = rs::simulate(streamed, rs::make_plan(streamed, tree));
  EXPECT_EQ(sim.peak_bytes, 6 * K);
  EXPECT_EQ(sim.offloaded_bytes, 3 * 5 * K);
  ASSERT_EQ(sim.reads.size(), 3u);
  for (const rs::ReadAhead& read : sim.reads) {
    EXPECT_EQ(read.bytes, 5 * K);  // the whole record comes back
    EXPECT_EQ(read.start_action, read.fetch_action);
  }
  EXPECT_EQ(rs::simulate(c, rs::make_plan(c, tree)).peak_bytes, 9 * K);
  // what a plan in memory counts does not change
  EXPECT_EQ(rs::simulate(streamed, rs::plan_save_all(streamed)).peak_bytes,
            rs::simulate(c, rs::plan_save_all(c)).peak_bytes);
  // the least peak with the target falls to it; without a target nothing streams
  EXPECT_EQ(rs::min_feasible_memory(streamed), 6 * K);
  ChainCosts memory = streamed;
  memory.offload_seconds_per_byte = -1;
  ChainCosts memory_whole = c;
  memory_whole.offload_seconds_per_byte = -1;
  EXPECT_EQ(rs::min_feasible_memory(memory), rs::min_feasible_memory(memory_whole));
}

// streamed_bytes must have one entry per stage, or none.
TEST(ChainSim, StreamedBytesOfTheWrongLengthAreRefused) {
  ChainCosts c = ChainCosts::uniform(4, 1.0, 2.0, K, 5 * K);
  c.streamed_bytes = {K, K};
  EXPECT_THROW(c.validate(), Error);
}

// Every plan the exact and the grouped programmes make on random chains whose records stream
// part of themselves simulates within its limit (plan_chain checks it and would throw), and the
// least peak with the target is no higher than with whole records.
TEST(ChainPlan, PlansOfStreamedRecordsStayWithinTheirLimits) {
  int plans = 0;
  for (int stages : {12, 40})
    for (unsigned seed = 1; seed <= 3; ++seed) {
      ChainCosts whole = random_chain(stages, 900 + seed);
      whole.offload_seconds_per_byte = 2e-4;
      whole.offload_write_seconds_per_byte = 1e-4;
      whole.reads_ahead = seed % 2 == 0;
      ChainCosts r = whole;
      std::mt19937 rng(seed);
      std::uniform_int_distribution<int> percent(10, 100);
      for (size_t bytes : r.saved_bytes) r.streamed_bytes.push_back(bytes * static_cast<size_t>(percent(rng)) / 100);
      EXPECT_LE(rs::min_feasible_memory(r), rs::min_feasible_memory(whole));
      SCOPED_TRACE(::testing::Message() << stages << " stages, seed " << seed);
      plans += expect_plans_within_their_limits(r);
    }
  EXPECT_EQ(plans, 2 * 3 * 2 * 6);
}

// Linear w->4w, tanh, Linear 4w->w, tanh: the record is h1 (4w values a row; the first tanh's
// output, which the second Linear saves too) and h2 (w; the second tanh's), not the block's input
// (the region keeps it) nor the weights.
class TwoTanhBlock : public nn::Module {
 public:
  TwoTanhBlock(int64_t width, DType dtype) {
    up = register_module("up", std::make_shared<nn::Linear>(width, 4 * width, true, dtype));
    down = register_module("down", std::make_shared<nn::Linear>(4 * width, width, true, dtype));
  }
  Tensor forward_impl(const Tensor& x) override { return tanh(down->forward(tanh(up->forward(x)))); }
  std::string type_name() const override { return "TwoTanhBlock"; }
  std::shared_ptr<nn::Linear> up, down;
};

// Three Linear+tanh layers whose first tanh's output is added at the end: the forward keeps it (and
// the function's locals) alive while the later layers run, while the backward reads them one after
// the other.
class LateAddBlock : public nn::Module {
 public:
  LateAddBlock(int64_t width, DType dtype) {
    for (int k = 0; k < 3; ++k)
      fc.push_back(register_module("fc" + std::to_string(k), std::make_shared<nn::Linear>(width, width, true, dtype)));
  }
  Tensor forward_impl(const Tensor& x) override {
    const Tensor y1 = tanh(fc[0]->forward(x));
    const Tensor y2 = tanh(fc[1]->forward(y1));
    const Tensor y3 = tanh(fc[2]->forward(y2));
    return add(y3, y1);
  }
  std::string type_name() const override { return "LateAddBlock"; }
  std::vector<std::shared_ptr<nn::Linear>> fc;
};

// The profile measures what a record keeps at once when read back value by value: the backward
// reads h2 (the second tanh) and releases it before it reads h1 (the second Linear, then the first
// tanh), so at most h1 is in memory at once, of a record of h1 + h2.
TEST(BudgetStreamed, TheProfileMeasuresWhatARecordKeepsAtOnce) {
  const int64_t width = 16, rows = 8;
  nn::Sequential model;
  for (int i = 0; i < 4; ++i) model.add(std::make_shared<TwoTanhBlock>(width, DType::f32));
  model.reset_parameters(3);
  const Tensor x = randn({rows, width}, DType::f32, RngState{4, 0});
  for (int i = 0; i < BudgetPlanner::kProfilingSteps + 1; ++i)
    remat::testing::measure_step(model, x, Policy::budget(size_t{1} << 40));
  const std::optional<rs::ChainCosts> costs = model.planner()->costs();
  ASSERT_TRUE(costs.has_value());
  const size_t h2 = static_cast<size_t>(rows * width) * sizeof(float), h1 = 4 * h2;
  ASSERT_EQ(costs->streamed_bytes.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(costs->streamed_bytes[i], h1);
    EXPECT_EQ(costs->saved_bytes[i], h1 + h2);
  }
}

// A 12-block GPT with an offload target runs at 0.8x the smallest budget in memory (its floor
// there is one block's re-run; streamed records bring it lower): within the budget and the
// prediction (never over the plan's cap), with values offloaded and save-all's gradients. One
// byte below the smallest budget with the target is refused.
TEST(BudgetStreamed, AGptWithATargetRunsBelowTheSmallestBudgetInMemory) {
  nn::GPTConfig config{.vocab = 13, .layers = 12, .width = 32, .heads = 4, .seq = 16, .dropout = 0.0,
                       .dtype = DType::f32, .seed = 7};
  nn::GPT model(config);
  const Tensor ids = remat::testing::token_ids(2, 16, 13, 41), targets = remat::testing::token_ids(2, 16, 13, 42);
  const auto grads_under = [&](const Policy& policy, size_t* peak) { return gpt_grads(model, ids, targets, policy, peak); };
  size_t peak = 0;
  const TensorList reference = grads_under(Policy::save_all(), &peak);
  const std::string dir = remat::testing::fresh_dir("budget-streamed-gpt");
  const auto with_target = [&](size_t budget) { return Policy::budget(budget).with_offload(OffloadTarget{dir, 0, 0}); };
  for (int i = 0; i < BudgetPlanner::kProfilingSteps + 1; ++i) grads_under(with_target(size_t{1} << 40), &peak);
  const auto range = model.planner()->feasible_range();
  ASSERT_TRUE(range.has_value());
  const size_t budget = range->smallest_budget_bytes * 8 / 10;
  reset_counters();
  const TensorList got = grads_under(with_target(budget), &peak);
  const BudgetPlanner::Report report = *model.planner()->report();
  EXPECT_LE(peak, report.predicted_peak_bytes) << report.tree;
  EXPECT_LE(report.predicted_peak_bytes, budget) << report.tree;
  EXPECT_GT(counters().dynamic.bytes_offloaded, 0u);
  EXPECT_EQ(counters().dynamic.bytes_over_plan, 0u);
  ASSERT_EQ(got.size(), reference.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], reference[i])) << i;
  const size_t smallest = smallest_budget_refused([&] { grads_under(with_target(1), &peak); });
  ASSERT_GT(smallest, 0u);
  EXPECT_LE(smallest, budget);
  EXPECT_NO_THROW(grads_under(with_target(smallest), &peak));
  EXPECT_THROW(grads_under(with_target(smallest - 1), &peak), Error);
}

// A layer whose forward keeps saved values alive longer than its backward reads them at once
// (LateAddBlock) is streamed at the backward's count all the same: once written, a value that is
// still an activation is no longer a saved value the store holds, and is not in the saved bytes.
// At the smallest budget with a target the step stays within its prediction, the saved bytes never
// went over the plan's cap (DynamicCounters::bytes_over_plan), and the gradients are save-all's.
TEST(BudgetStreamed, ALayerWhoseForwardKeepsItsValuesLongerStaysWithinItsPrediction) {
  const int64_t width = 32, rows = 16;
  nn::Sequential model;
  for (int i = 0; i < 6; ++i) model.add(std::make_shared<LateAddBlock>(width, DType::f32));
  model.reset_parameters(8);
  const Tensor x = randn({rows, width}, DType::f32, RngState{9, 0});
  const TensorList reference = remat::testing::module_grads(model, x, Policy::save_all());
  const std::string dir = remat::testing::fresh_dir("streamed-late-add");
  const auto with_target = [&](size_t budget) { return Policy::budget(budget).with_offload(OffloadTarget{dir, 0, 0}); };
  for (int i = 0; i < BudgetPlanner::kProfilingSteps + 1; ++i) remat::testing::measure_step(model, x, with_target(size_t{1} << 40));
  const size_t value = static_cast<size_t>(rows * width) * sizeof(float);
  const std::optional<rs::ChainCosts> costs = model.planner()->costs();
  ASSERT_TRUE(costs.has_value());
  for (size_t i = 0; i < costs->saved_bytes.size(); ++i) {
    EXPECT_EQ(costs->saved_bytes[i], 3 * value) << i;  // y1, y2, y3
    EXPECT_LT(costs->streamed_bytes[i], costs->saved_bytes[i]) << i;
  }
  const size_t smallest = smallest_budget_refused([&] { remat::testing::measure_step(model, x, with_target(1)); });
  ASSERT_GT(smallest, 0u);
  const remat::testing::StepMeasure step = remat::testing::measure_step(model, x, with_target(smallest));
  const BudgetPlanner::Report report = *model.planner()->report();
  EXPECT_LE(step.peak_saved, report.predicted_peak_bytes) << report.tree;
  EXPECT_EQ(step.counters.dynamic.bytes_over_plan, 0u) << report.tree;
  EXPECT_GT(step.counters.dynamic.bytes_offloaded, 0u) << report.tree;
  const TensorList got = remat::testing::module_grads(model, x, with_target(smallest));
  ASSERT_EQ(got.size(), reference.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], reference[i])) << i;
}
