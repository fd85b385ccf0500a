// The budget:BYTES policy on a deterministic chain: profile, plan, run; the measured peak of
// saved bytes stays within the budget; gradients equal save-all; infeasible budgets are errors.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "checkpoint_models.h"
#include "gpt_steps.h"
#include "remat/nn.h"
#include "remat/budget.h"
#include "remat/dynamic.h"
#include "remat/schedule.h"
#include "schedule/chain_internal.h"
#include "plan_checks.h"
#include "random_chain.h"
#include "temp_dir.h"

using namespace remat;
using remat::testing::bitwise_equal;
using remat::testing::TanhChain;
namespace rs = remat::schedule;

namespace {

size_t step_peak_saved(TanhChain& model, const Tensor& x, const Policy& policy, TensorList* grads = nullptr) {
  model.zero_grad();
  memory::reset_peaks();
  size_t base = memory::live_bytes(memory::Tag::saved);
  backward([&] { return mean(model.chain.forward(x)); }, GradOptions{policy});
  if (grads) {
    grads->clear();
    for (auto& p : model.params()) grads->push_back(p.grad().clone());
  }
  return memory::peak_bytes(memory::Tag::saved) - base;
}

}  // namespace

TEST(Budget, PeakSavedBytesStayWithinTheBudgetAndGradientsMatchSaveAll) {
  TanhChain model(12, 64, DType::f32, 5);
  Tensor x = randn({32, 64}, DType::f32, RngState{1, 0});
  TensorList reference, got;
  size_t save_all = step_peak_saved(model, x, Policy::save_all(), &reference);
  size_t every_layer = step_peak_saved(model, x, Policy::every_layer());
  ASSERT_LT(every_layer, save_all);
  for (double fraction : {0.25, 0.5, 0.75, 1.0}) {
    size_t budget = every_layer + static_cast<size_t>(fraction * static_cast<double>(save_all - every_layer));
    SCOPED_TRACE(budget);
    Policy policy = Policy::budget(budget);
    model.chain.set_planner(std::make_shared<BudgetPlanner>());
    for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) step_peak_saved(model, x, policy);  // profiling
    ASSERT_TRUE(model.chain.planner()->costs() == std::nullopt);
    for (int step = 0; step < 2; ++step) {
      size_t peak = step_peak_saved(model, x, policy, &got);
      EXPECT_LE(peak, budget) << "step " << step;
      ASSERT_EQ(got.size(), reference.size());
      for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], reference[i])) << i;
    }
    auto report = model.chain.planner()->report();
    ASSERT_TRUE(report.has_value());
    EXPECT_LE(report->predicted_peak_bytes, budget);
    EXPECT_EQ(report->costs.num_stages(), 12);
  }
}

TEST(Budget, LargerBudgetsRecomputeLess) {
  TanhChain model(12, 64, DType::f32, 5);
  Tensor x = randn({32, 64}, DType::f32, RngState{1, 0});
  size_t save_all = step_peak_saved(model, x, Policy::save_all());
  size_t every_layer = step_peak_saved(model, x, Policy::every_layer());
  auto recomputed = [&](size_t budget) {
    model.chain.set_planner(std::make_shared<BudgetPlanner>());
    for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) step_peak_saved(model, x, Policy::budget(budget));
    reset_counters();
    step_peak_saved(model, x, Policy::budget(budget));
    return counters().ops.recomputed_ops;
  };
  uint64_t tight = recomputed(every_layer), loose = recomputed(save_all + save_all / 2);
  EXPECT_LE(loose, tight);
  EXPECT_EQ(loose, 0u);
}

TEST(Budget, ANewInputShapeReplans) {
  TanhChain model(6, 32, DType::f32, 5);
  Tensor x1 = randn({8, 32}, DType::f32, RngState{1, 0}), x2 = randn({16, 32}, DType::f32, RngState{2, 0});
  Policy policy = Policy::budget(size_t(1) << 30);
  for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) step_peak_saved(model, x1, policy);
  step_peak_saved(model, x1, policy);
  ASSERT_TRUE(model.chain.planner()->report().has_value());
  EXPECT_EQ(model.chain.planner()->report()->input_shape, (Shape{8, 32}));
  step_peak_saved(model, x2, policy);  // profiles the new shape
  EXPECT_FALSE(model.chain.planner()->report().has_value());
  for (int i = 1; i < BudgetPlanner::kProfilingSteps; ++i) step_peak_saved(model, x2, policy);
  step_peak_saved(model, x2, policy);
  ASSERT_TRUE(model.chain.planner()->report().has_value());
  EXPECT_EQ(model.chain.planner()->report()->input_shape, (Shape{16, 32}));
}

TEST(Budget, InfeasibleBudgetNamesTheSmallestFeasibleOne) {
  TanhChain model(6, 32, DType::f32, 5);
  Tensor x = randn({8, 32}, DType::f32, RngState{1, 0});
  Policy policy = Policy::budget(1024);
  for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) step_peak_saved(model, x, policy);  // profiling
  model.zero_grad();
  size_t live_before = memory::stats().live_total;
  try {
    backward([&] { return mean(model.chain.forward(x)); }, GradOptions{policy});
    FAIL() << "an infeasible budget was accepted";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("smallest feasible budget"), std::string::npos) << m;
    EXPECT_NE(m.find("bytes ("), std::string::npos) << m;
    EXPECT_NE(m.find("KiB"), std::string::npos) << m;
  }
  EXPECT_EQ(memory::stats().live_total, live_before);
}

// A chain too long for the exact programme is planned by the grouped one: the plan it runs keeps
// the measured peak within the budget, the gradients equal save-all's, and the planner reports
// its progress through the options' callback.
TEST(Budget, LongChainsArePlannedByTheGroupedPlanner) {
  TanhChain model(300, 8, DType::f32, 5);
  Tensor x = randn({4, 8}, DType::f32, RngState{1, 0});
  TensorList reference, got;
  const size_t save_all = step_peak_saved(model, x, Policy::save_all(), &reference);
  const size_t every_layer = step_peak_saved(model, x, Policy::every_layer());
  for (size_t budget : {every_layer, (every_layer + save_all) / 2}) {
    SCOPED_TRACE(budget);
    const Policy policy = Policy::budget(budget);
    auto planner = std::make_shared<BudgetPlanner>();
    std::vector<double> progress;
    schedule::ChainPlanOptions options;
    options.progress = [&](double fraction) { progress.push_back(fraction); };
    planner->set_options(options);
    model.chain.set_planner(planner);
    for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) step_peak_saved(model, x, policy);
    for (int step = 0; step < 2; ++step) {
      EXPECT_LE(step_peak_saved(model, x, policy, &got), budget) << "step " << step;
      ASSERT_EQ(got.size(), reference.size());
      for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], reference[i])) << i;
    }
    auto report = planner->report();
    ASSERT_TRUE(report.has_value());
    EXPECT_EQ(report->costs.num_stages(), 300);
    EXPECT_NE(report->planner.find("grouped"), std::string::npos) << report->planner;
    ASSERT_FALSE(progress.empty());
    EXPECT_EQ(progress.back(), 1.0);
  }
}

// feasible_range() before any plan: the smallest budget it names runs within itself, one byte
// less is the planner's error naming that smallest budget (or, under the grouped planner, a plan
// within it); save-all's peak recomputes nothing.
TEST(Budget, FeasibleRangeIsTheSmallestBudgetThatRuns) {
  for (int blocks : {12, 200}) {  // the exact programme, the grouped one
    SCOPED_TRACE(blocks);
    TanhChain model(blocks, 16, DType::f32, 5);
    Tensor x = randn({8, 16}, DType::f32, RngState{1, 0});
    TensorList reference, got;
    step_peak_saved(model, x, Policy::save_all(), &reference);
    model.chain.set_planner(std::make_shared<BudgetPlanner>());
    EXPECT_FALSE(model.chain.planner()->feasible_range().has_value());
    for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) step_peak_saved(model, x, Policy::budget(size_t(1) << 40));
    const auto range = model.chain.planner()->feasible_range();
    ASSERT_TRUE(range.has_value());
    ASSERT_LT(range->smallest_budget_bytes, range->save_all_peak_bytes);
    // the exact programme refuses one byte less; the grouped one may plan it with finer units
    try {
      const size_t peak = step_peak_saved(model, x, Policy::budget(range->smallest_budget_bytes - 1));
      EXPECT_GT(blocks, 100) << "the exact programme planned a budget below the feasible range";
      EXPECT_LE(peak, range->smallest_budget_bytes - 1);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(range->smallest_budget_bytes) + " bytes"), std::string::npos)
          << e.what();
    }
    for (int step = 0; step < 2; ++step) {
      EXPECT_LE(step_peak_saved(model, x, Policy::budget(range->smallest_budget_bytes), &got),
                range->smallest_budget_bytes);
      for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], reference[i])) << i;
    }
    reset_counters();
    step_peak_saved(model, x, Policy::budget(range->save_all_peak_bytes));
    EXPECT_EQ(counters().ops.recomputed_ops, 0u);
  }
}

// budget:B+offload:DIR. A plan offloads only the nodes it chose (the rest of the chain keeps its
// saved values in memory), stays within B, and its gradients are bitwise save-all's. The cost per
// offloaded byte is set, so that the choice does not depend on the machine's speed.
TEST(Budget, OffloadIsAPlanChoiceWithinTheBudget) {
  TanhChain model(8, 64, DType::f32, 5);
  Tensor x = randn({32, 64}, DType::f32, RngState{1, 0});
  TensorList reference, got;
  const size_t save_all = step_peak_saved(model, x, Policy::save_all(), &reference);
  const size_t every_layer = step_peak_saved(model, x, Policy::every_layer());
  const size_t budget = every_layer + (save_all - every_layer) / 3;
  const std::string dir = remat::testing::fresh_dir("budget-offload");
  const Policy policy = Policy::budget(budget).with_offload(OffloadTarget{dir, 1024, 0});
  const auto run = [&](double seconds_per_byte) {
    model.chain.set_planner(std::make_shared<BudgetPlanner>());
    schedule::ChainPlanOptions options;
    options.offload_seconds_per_byte = seconds_per_byte;
    model.chain.planner()->set_options(options);
    ScopedPolicy scope(policy);  // the offload runtime for the whole run, as remat train has it
    for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) step_peak_saved(model, x, policy);
    reset_counters();
    const size_t peak = step_peak_saved(model, x, policy, &got);
    const BudgetPlanner::Report report = *model.chain.planner()->report();
    EXPECT_LE(peak, budget);
    // offloaded nodes' writes run behind the next nodes, capped at the prediction
    EXPECT_LE(peak, report.predicted_peak_bytes) << report.tree;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], reference[i])) << i;
    return report;
  };
  // Free offload: the plan offloads instead of recomputing.
  const BudgetPlanner::Report cheap = run(0.0);
  EXPECT_NE(cheap.tree.find("+o"), std::string::npos) << cheap.tree;
  EXPECT_EQ(counters().ops.recomputed_ops, 0u) << cheap.tree;
  EXPECT_GT(counters().dynamic.bytes_offloaded, 0u);
  EXPECT_GT(cheap.predicted_offloaded_bytes, 0u);
  EXPECT_EQ(cheap.offload_target, policy.saved.offload->to_string());
  EXPECT_GT(cheap.offload_write_bytes_per_second, 0.0);
  // Dear offload: the plan recomputes instead, and nothing in the chain is written (its values,
  // above the threshold, stay in memory: only offloaded nodes open the gate).
  const BudgetPlanner::Report dear = run(1.0);
  EXPECT_EQ(dear.tree.find("+o"), std::string::npos) << dear.tree;
  EXPECT_GT(counters().ops.recomputed_ops, 0u);
  EXPECT_EQ(counters().dynamic.bytes_offloaded, 0u);
  EXPECT_EQ(dear.predicted_offloaded_bytes, 0u);
}

// The grouped planner offloads too, at any depth of its groups: forced on a short chain (2
// top-level parts of 8 layer calls, groups of 4), the top-level programme alone could offload one
// node (the second part's input; the first's is the chain's). The plan offloads more, runs within
// the budget and its prediction, writes bytes, and its gradients are bitwise save-all's.
TEST(Budget, TheGroupedPlannerOffloadsInsideItsGroups) {
  TanhChain model(16, 64, DType::f32, 5);
  Tensor x = randn({32, 64}, DType::f32, RngState{1, 0});
  TensorList reference, got;
  const size_t save_all = step_peak_saved(model, x, Policy::save_all(), &reference);
  const size_t every_layer = step_peak_saved(model, x, Policy::every_layer());
  const size_t budget = every_layer + (save_all - every_layer) / 3;
  const std::string dir = remat::testing::fresh_dir("budget-grouped-offload");
  const Policy policy = Policy::budget(budget).with_offload(OffloadTarget{dir, 1024, 0});
  model.chain.set_planner(std::make_shared<BudgetPlanner>());
  schedule::ChainPlanOptions options;
  options.method = schedule::RotorMethod::grouped;
  options.top_parts = 2;
  options.group = 4;
  options.offload_seconds_per_byte = 0;
  model.chain.planner()->set_options(options);
  ScopedPolicy scope(policy);
  for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) step_peak_saved(model, x, policy);
  reset_counters();
  const size_t peak = step_peak_saved(model, x, policy, &got);
  const BudgetPlanner::Report report = *model.chain.planner()->report();
  EXPECT_NE(report.planner.find("grouped"), std::string::npos) << report.planner;
  size_t offloaded = 0;
  for (size_t at = report.tree.find("+o"); at != std::string::npos; at = report.tree.find("+o", at + 1)) ++offloaded;
  EXPECT_GE(offloaded, 2u) << report.tree;
  EXPECT_GT(counters().dynamic.bytes_offloaded, 0u);
  EXPECT_GT(report.predicted_offloaded_bytes, 0u);
  EXPECT_LE(peak, budget);
  EXPECT_LE(peak, report.predicted_peak_bytes) << report.tree;
  ASSERT_EQ(got.size(), reference.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], reference[i])) << i;
}

// The peak guarantee of budget plans (BudgetPeaks), as properties over budgets: the measured peak
// of saved bytes (the allocator's counters) never exceeds the plan's prediction, which never exceeds the
// budget and never rises when the budget falls; in memory the measured peak never rises either.
// On random chains, the predicted peak of plan_chain (exact and grouped, with and without an
// offload target) never rises when the limit falls.
namespace {

// Budgets from save-all's peak down to the smallest feasible one, `count` of them.
std::vector<size_t> falling(size_t smallest, size_t largest, int count) {
  std::vector<size_t> out;
  for (int k = count - 1; k >= 0; --k) out.push_back(smallest + (largest - smallest) * static_cast<size_t>(k) / static_cast<size_t>(count - 1));
  return out;
}

// A real model, profiled once, then run at falling budgets under the exact programme and the
// grouped one, in memory and with an offload target (at a fixed cost per byte, so that the plans
// do not depend on the disk's speed).
void expect_peaks_fall_with_the_budget(rs::RotorMethod method, bool offload) {
  TanhChain model(12, 64, DType::f32, 5);
  Tensor x = randn({32, 64}, DType::f32, RngState{1, 0});
  TensorList reference, got;
  step_peak_saved(model, x, Policy::save_all(), &reference);
  const std::string dir = remat::testing::fresh_dir("budget-peaks");
  const auto policy_for = [&](size_t budget) {
    const Policy p = Policy::budget(budget);
    return offload ? p.with_offload(OffloadTarget{dir, 1024, 0}) : p;
  };
  model.chain.set_planner(std::make_shared<BudgetPlanner>());
  rs::ChainPlanOptions options;
  options.method = method;
  options.top_parts = 3;
  options.group = 2;
  options.offload_seconds_per_byte = 1e-10;
  model.chain.planner()->set_options(options);
  std::optional<ScopedPolicy> scope;
  if (offload) scope.emplace(policy_for(size_t{1} << 40));  // the offload runtime for the whole run
  for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) step_peak_saved(model, x, policy_for(size_t{1} << 40));
  const auto range = model.chain.planner()->feasible_range();
  ASSERT_TRUE(range.has_value());
  size_t previous = SIZE_MAX, previous_predicted = SIZE_MAX;
  for (size_t budget : falling(range->smallest_budget_bytes, range->save_all_peak_bytes, 8)) {
    SCOPED_TRACE(::testing::Message() << "budget " << budget);
    const size_t peak = step_peak_saved(model, x, policy_for(budget), &got);
    const BudgetPlanner::Report report = *model.chain.planner()->report();
    EXPECT_LE(peak, report.predicted_peak_bytes) << report.tree;
    EXPECT_LE(report.predicted_peak_bytes, budget);
    EXPECT_LE(report.predicted_peak_bytes, previous_predicted) << report.tree;
    // In memory the measured peak itself never rises. With an offload target the writes run
    // behind the next layer calls, capped at the prediction (Note [writes behind a plan's peak]),
    // so how far below the prediction a step stays depends on the disk: the guarantee is the
    // prediction's, which never rises.
    if (!offload) EXPECT_LE(peak, previous) << report.tree;
    previous = peak;
    previous_predicted = report.predicted_peak_bytes;
    ASSERT_EQ(got.size(), reference.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], reference[i])) << i;
  }
}

}  // namespace

TEST(BudgetPeaks, ExactPlansInMemory) { expect_peaks_fall_with_the_budget(rs::RotorMethod::exact, false); }
TEST(BudgetPeaks, ExactPlansWithOffload) { expect_peaks_fall_with_the_budget(rs::RotorMethod::exact, true); }
TEST(BudgetPeaks, GroupedPlansInMemory) { expect_peaks_fall_with_the_budget(rs::RotorMethod::grouped, false); }
TEST(BudgetPeaks, GroupedPlansWithOffload) { expect_peaks_fall_with_the_budget(rs::RotorMethod::grouped, true); }

// A tanh layer saves its output, and the next layer call keeps that output as its input: one
// storage, which the prediction counts once (Note [records that keep their outputs] in
// src/checkpoint/budget.cpp), where the planners count it twice. A 12-layer tanh chain (width 64,
// batch 32: every boundary and every record is b = 8 KiB), in memory, at budgets from save-all's
// peak down to the smallest one: measured <= predicted <= measured + b (a region's forward sweep
// holds an unsaved temporary, which the model counts as a boundary; the plans of this chain meet
// the measured peak exactly). Counting the output twice over-predicted save-all's peak by 12 b.
// (With an offload target the prediction still counts the output twice: budget.cpp says why.)
TEST(BudgetPeaks, ATanhChainsPredictionCountsEachRecordedOutputOnce) {
  TanhChain model(12, 64, DType::f32, 5);
  Tensor x = randn({32, 64}, DType::f32, RngState{1, 0});
  const size_t b = 32 * 64 * sizeof(float);
  model.chain.set_planner(std::make_shared<BudgetPlanner>());
  for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) step_peak_saved(model, x, Policy::budget(size_t{1} << 40));
  const auto range = model.chain.planner()->feasible_range();
  ASSERT_TRUE(range.has_value());
  for (size_t budget : falling(range->smallest_budget_bytes, range->save_all_peak_bytes, 8)) {
    SCOPED_TRACE(::testing::Message() << "budget " << budget);
    const size_t peak = step_peak_saved(model, x, Policy::budget(budget));
    const BudgetPlanner::Report report = *model.chain.planner()->report();
    EXPECT_LE(peak, report.predicted_peak_bytes) << report.tree;
    EXPECT_LE(report.predicted_peak_bytes, peak + b) << report.tree << ": measured " << peak;
  }
  const size_t save_all = step_peak_saved(model, x, Policy::save_all());
  const rs::ChainCosts costs = *model.chain.planner()->costs();
  EXPECT_EQ(rs::plan_save_all(costs).predicted_peak_bytes, save_all);
  rs::ChainCosts twice = costs;
  twice.saved_output_bytes.clear();
  EXPECT_EQ(rs::plan_save_all(twice).predicted_peak_bytes, save_all + 12 * b);
}

// Random chains: 8 and 30 stages (the exact programme) and 150 (the grouped one), gradients
// counted or not, no offload target, free offload and a dear one; 25 limits from save-all's peak
// down to the least feasible one. The predicted peak equals the simulated one and never rises; a
// plan's peak with boundaries counted only while held is never above it.
TEST(BudgetPeaks, PredictedPeaksNeverRiseWhenTheLimitFalls) {
  int plans = 0;
  for (int stages : {8, 30, 150}) {
    for (unsigned seed = 1; seed <= 2; ++seed) {
      for (double per_byte : {-1.0, 0.0, 1e-3}) {
        rs::ChainCosts c = random_chain(stages, 300 + seed);
        c.gradients_counted = seed % 2 == 1;
        c.offload_seconds_per_byte = per_byte;
        SCOPED_TRACE(::testing::Message() << stages << " stages, seed " << seed << ", " << per_byte << " s a byte");
        const size_t smallest = rs::chain_min_feasible_memory(c);
        size_t previous = SIZE_MAX;
        for (size_t limit : falling(smallest, rs::plan_save_all(c).predicted_peak_bytes, 25)) {
          const rs::Plan plan = rs::plan_chain(c, limit).plan;
          EXPECT_EQ(rs::simulate(c, plan).peak_bytes, plan.predicted_peak_bytes);
          rs::ChainCosts held = c;
          held.boundaries_counted_when_held = true;
          EXPECT_LE(rs::simulate(held, plan).peak_bytes, plan.predicted_peak_bytes);
          EXPECT_LE(plan.predicted_peak_bytes, limit);
          EXPECT_LE(plan.predicted_peak_bytes, previous) << "limit " << limit;
          previous = plan.predicted_peak_bytes;
          ++plans;
        }
      }
    }
  }
  EXPECT_EQ(plans, 3 * 2 * 3 * 25);
}

namespace {

// One GPT step under `policy` (its scope spans forward and backward, as the offload runtime's
// must): the peak of saved bytes above those live at the start, and the parameters' gradients.
// settle: between the forward and the backward, wait until the offload runtime has written out
// every value the forward gave it.
size_t gpt_step_peak_saved(nn::GPT& model, const Tensor& ids, const Tensor& targets, const Policy& policy,
                           TensorList* grads, bool settle = false) {
  ScopedPolicy scope(policy);
  model.zero_grad();
  memory::reset_peaks();
  const size_t base = memory::live_bytes(memory::Tag::saved);
  Tensor loss = model.loss(ids, targets);
  if (settle) scope.wait_for_offload_writes();
  loss.backward();
  if (grads) {
    grads->clear();
    for (auto& p : model.parameters()) grads->push_back(p.grad().clone());
  }
  return memory::peak_bytes(memory::Tag::saved) - base;
}

}  // namespace

// A GPT under budget plans with an offload target (free offload, so that the plans offload
// stages and regions side by side), at budgets from the smallest feasible one up: the measured
// saved peak never exceeds the plan's prediction and gradients are save-all's. An offloaded
// region's re-run is the step's peak there: the backward of a planned step reads ahead only from
// where its plan says the value fits (values of the stages before the region, read a few nodes
// early by the engine, were counted during the re-run and lifted the peak a boundary above the
// prediction), and what the loss saves after the chain is counted with the chain's output, not
// during the re-runs. The plans' reads ahead do bring values back early.
TEST(BudgetPeaks, AGptWithOffloadedRegionsStaysWithinItsPrediction) {
  nn::GPTConfig config{.vocab = 13, .layers = 4, .width = 64, .heads = 2, .seq = 32, .dropout = 0.0,
                       .dtype = DType::f32, .seed = 4};
  nn::GPT model(config);
  const Tensor ids = remat::testing::token_ids(6, 32, 13, 31), targets = remat::testing::token_ids(6, 32, 13, 32);
  // settle: the forward's values written out before the backward (on a loaded machine the offload
  // worker may not have written them yet, and a value still being written is in memory when the
  // plan's read point comes: nothing is read ahead, correctly, but the check that reads ahead
  // happen would then depend on the machine's load)
  const auto step = [&](const Policy& policy, TensorList* grads, bool settle = false) {
    return gpt_step_peak_saved(model, ids, targets, policy, grads, settle);
  };
  TensorList reference, got;
  step(Policy::save_all(), &reference);
  const std::string dir = remat::testing::fresh_dir("budget-gpt-peaks");
  const auto policy_for = [&](size_t budget) { return Policy::budget(budget).with_offload(OffloadTarget{dir, 0, 0}); };
  rs::ChainPlanOptions options;
  options.offload_seconds_per_byte = 0;
  options.times_from_flops = true;  // the same plans on every run, whatever the machine's load
  model.planner()->set_options(options);
  for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) step(policy_for(size_t{1} << 40), nullptr);
  // a transfer as dear as recomputing the bytes: at no cost,
  // offloading every record (with the input it holds) wins at every budget, and no region is offloaded
  step(policy_for(size_t{1} << 40), nullptr);  // the costs come with the first plan
  const std::optional<rs::ChainCosts> profiled = model.planner()->costs();
  ASSERT_TRUE(profiled.has_value());
  double forward = 0, bytes = 0;
  for (size_t i = 0; i < profiled->saved_bytes.size(); ++i) forward += profiled->forward_time[i], bytes += profiled->saved_bytes[i];
  options.offload_seconds_per_byte = forward / bytes;
  model.planner()->set_options(options);
  const auto range = model.planner()->feasible_range();
  ASSERT_TRUE(range.has_value());
  int offloaded_regions = 0;
  uint64_t read_ahead = 0;  // bytes the plans' reads ahead brought back before their nodes ran
  const size_t smallest = range->least_planned_peak_bytes;  // from which offload plans offload
  for (size_t budget : falling(smallest, smallest + (range->save_all_peak_bytes - smallest) / 3, 8)) {
    SCOPED_TRACE(::testing::Message() << "budget " << budget);
    reset_counters();
    const size_t peak = step(policy_for(budget), &got, true);
    read_ahead += counters().dynamic.bytes_prefetched;
    const BudgetPlanner::Report report = *model.planner()->report();
    EXPECT_LE(peak, report.predicted_peak_bytes) << report.tree;
    EXPECT_LE(report.predicted_peak_bytes, budget);
    if (report.tree.find(")+o") != std::string::npos) ++offloaded_regions;
    ASSERT_EQ(got.size(), reference.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], reference[i])) << i;
  }
  EXPECT_GT(offloaded_regions, 0);
  EXPECT_GT(read_ahead, 0u);  // Note [reads ahead of a plan's nodes]: within the prediction
}

// The smallest budget of a grouped plan is the exact least peak where that is cheap to find: a
// chain planned by the grouped planner (forced: 2 top-level parts, groups of 4) runs at the exact
// least peak, below the grouped planner's own, with an offload target: within the budget and the
// prediction, gradients save-all's, and with offloaded bytes (among the least-peak plans the
// fastest offloads). The smallest budget with the target, the one a refusal names, runs and one
// byte less is refused, with the exact least peak and without it (where it is no lower).
TEST(Budget, TheSmallestGroupedBudgetIsTheExactLeastPeakAndItOffloads) {
  TanhChain model(16, 64, DType::f32, 5);
  Tensor x = randn({32, 64}, DType::f32, RngState{1, 0});
  TensorList reference, got;
  step_peak_saved(model, x, Policy::save_all(), &reference);
  const std::string dir = remat::testing::fresh_dir("budget-least-peak");
  const auto policy_for = [&](size_t budget) { return Policy::budget(budget).with_offload(OffloadTarget{dir, 0, 0}); };
  model.chain.set_planner(std::make_shared<BudgetPlanner>());
  rs::ChainPlanOptions options;
  options.method = rs::RotorMethod::grouped;
  options.top_parts = 2;
  options.group = 4;
  options.offload_seconds_per_byte = 1e-12;
  model.chain.planner()->set_options(options);
  ScopedPolicy scope(policy_for(size_t{1} << 40));
  for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) step_peak_saved(model, x, policy_for(size_t{1} << 40));
  const size_t smallest = model.chain.planner()->feasible_range()->least_planned_peak_bytes;  // offload plans offload from it
  rs::ChainPlanOptions grouped_only = options;
  grouped_only.exact_max_work = 0;
  model.chain.planner()->set_options(grouped_only);
  const size_t grouped_smallest = model.chain.planner()->feasible_range()->least_planned_peak_bytes;
  ASSERT_LT(smallest, grouped_smallest);
  const auto refused_down_to = [&](size_t budget) {  // the smallest budget the refusal names
    return remat::testing::smallest_budget_refused([&] { step_peak_saved(model, x, policy_for(budget)); });
  };
  const size_t grouped_floor = refused_down_to(1);
  EXPECT_NO_THROW(step_peak_saved(model, x, policy_for(grouped_floor)));
  EXPECT_EQ(refused_down_to(grouped_floor - 1), grouped_floor);
  model.chain.planner()->set_options(options);
  const size_t floor = refused_down_to(1);
  EXPECT_LE(floor, grouped_floor);
  EXPECT_LE(floor, smallest);
  EXPECT_EQ(refused_down_to(floor - 1), floor);
  reset_counters();
  const size_t peak = step_peak_saved(model, x, policy_for(floor), &got);
  const BudgetPlanner::Report report = *model.chain.planner()->report();
  EXPECT_LE(peak, report.predicted_peak_bytes) << report.tree;
  EXPECT_LE(report.predicted_peak_bytes, floor);
  EXPECT_GT(report.predicted_offloaded_bytes, 0u) << report.tree;
  EXPECT_GT(counters().dynamic.bytes_offloaded, 0u);
  ASSERT_EQ(got.size(), reference.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], reference[i])) << i;
}

// Note [boundaries counted while held] (src/schedule/simulate.cpp): one region over 4 stages
// (boundaries 100 bytes, records 1,000), re-run with every stage recorded. Counted from the forward
// that makes it, the re-run's last output a_4 adds a boundary to the peak; held, it is a temporary
// (the re-run drops it unused), as are the values of the region's forward sweep.
TEST(BudgetPeaks, ABoundaryCountsOnlyWhileItIsHeld) {
  rs::ChainCosts costs = rs::ChainCosts::uniform(4, 1.0, 1.0, 100, 1000);
  costs.gradients_counted = false;
  const rs::Plan plan = rs::plan_every_k(costs, 4);
  EXPECT_EQ(plan.predicted_peak_bytes, 5 * 100u + 4 * 1000u);  // a_0..a_4 and the 4 records
  rs::ChainCosts held = costs;
  held.boundaries_counted_when_held = true;
  EXPECT_EQ(rs::simulate(held, plan).peak_bytes, 4 * 100u + 4 * 1000u);
  // without records the forward sweep (a_0, a_1 and a_2 counted at stage 1) no longer is the peak
  costs.saved_bytes.assign(4, 0);
  held.saved_bytes.assign(4, 0);
  EXPECT_EQ(rs::simulate(costs, plan).peak_bytes, 5 * 100u);
  EXPECT_EQ(rs::simulate(held, plan).peak_bytes, 4 * 100u);
  held.boundary_bytes[3] = 1000;  // a_3, held by stage 3's record in the re-run, still counts
  EXPECT_EQ(rs::simulate(held, plan).peak_bytes, 3 * 100u + 1000u);
  // a value made before the chain and read by stage 2 (token ids): the region keeps it from its
  // sweep on, once however often its re-run reads it again; one that stage 0 made, inside the
  // region, is a temporary of the sweep
  held.swept_values = {{.read_by = 2, .made_by = -1, .bytes = 50}, {.read_by = 2, .made_by = 0, .bytes = 70}};
  EXPECT_EQ(rs::simulate(held, plan).peak_bytes, 3 * 100u + 1000u + 50u);
  costs.swept_values = held.swept_values;  // without the flag they are not counted
  EXPECT_EQ(rs::simulate(costs, plan).peak_bytes, 5 * 100u);
  held.swept_values[1].made_by = 1;
  EXPECT_THROW(rs::simulate(held, plan), Error);  // made by the stage ahead: that is a_2 itself
}

// The 120-layer GPT (width 32, 4 heads, seq 16, batch 2) in memory: at its smallest budget the
// measured peak of saved bytes is the prediction. The peak is a block's re-run, whose last output
// is a temporary that no saved value holds, beside the token ids that the regions over the
// embeddings keep (they come from outside the chain). Counting boundaries from the forward that
// makes them, the model counted the block output (2 x 16 x 32 floats, 4,096 bytes) and missed the
// ids (2 x 16 x 8 bytes): 3,840 bytes over. At larger budgets the prediction stays a bound.
TEST(BudgetPeaks, A120LayerGptIsPredictedExactlyAtItsSmallestBudget) {
  nn::GPTConfig config{.vocab = 13, .layers = 120, .width = 32, .heads = 4, .seq = 16, .dropout = 0.0,
                       .dtype = DType::f32, .seed = 4};
  nn::GPT model(config);
  const Tensor ids = remat::testing::token_ids(2, 16, 13, 31), targets = remat::testing::token_ids(2, 16, 13, 32);
  const auto step = [&](const Policy& policy, TensorList* grads) {
    return gpt_step_peak_saved(model, ids, targets, policy, grads);
  };
  TensorList reference, got;
  step(Policy::save_all(), &reference);
  for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) step(Policy::budget(size_t{1} << 40), nullptr);
  const auto range = model.planner()->feasible_range();
  ASSERT_TRUE(range.has_value());
  const size_t smallest = range->smallest_budget_bytes;
  for (size_t budget : falling(smallest, smallest + (range->save_all_peak_bytes - smallest) / 4, 3)) {
    SCOPED_TRACE(::testing::Message() << "budget " << budget);
    const size_t peak = step(Policy::budget(budget), &got);
    const BudgetPlanner::Report report = *model.planner()->report();
    EXPECT_LE(peak, report.predicted_peak_bytes) << report.tree;
    EXPECT_LE(report.predicted_peak_bytes, budget);
    ASSERT_EQ(got.size(), reference.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], reference[i])) << i;
    if (budget != smallest) continue;
    EXPECT_EQ(peak, report.predicted_peak_bytes) << report.tree;
    rs::ChainCosts counted = report.costs;
    counted.boundaries_counted_when_held = false;
    EXPECT_EQ(rs::simulate(counted, report.plan).peak_bytes + report.outside_bytes,
              peak + 2 * 16 * 32 * sizeof(float) - 2 * 16 * sizeof(int64_t));
  }
}
