// What a region's sweep keeps besides its input (Note [what a sweep keeps] in
// src/checkpoint/budget.cpp): a value made before a region and read between its layer calls. The
// budget policy measures such values while profiling, predicts a plan with them and plans within
// the budget as they are counted (schedule::plan_chain_held).
#include <gtest/gtest.h>

#include <random>
#include <utility>
#include <vector>

#include "checkpoint_models.h"
#include "module_models.h"
#include "random_chain.h"
#include "remat/budget.h"
#include "remat/nn.h"
#include "remat/schedule.h"
#include "schedule/chain_internal.h"

using namespace remat;
using remat::testing::bitwise_equal;
namespace rs = remat::schedule;

namespace {

// Layer calls with a constant made before the first call, with no gradient path, added to (or
// multiplied into) each call's output between the calls. A region over several calls keeps it;
// a product also saves it and the call's output for its own backward, where it runs outside a
// region (Note [what the ops between calls save] in src/schedule/simulate.cpp).
class ConstantBetweenCalls : public nn::Module {
 public:
  ConstantBetweenCalls(int layers, int64_t width, bool product) : width_(width), product_(product) {
    for (int i = 0; i < layers; ++i)
      layers_.push_back(register_module("l" + std::to_string(i),
                                        std::make_shared<remat::testing::TanhBlock>(width, DType::f32)));
  }
  Tensor forward_impl(const Tensor& x) override {
    const Tensor constant = randn({x.shape()[0], width_}, DType::f32, RngState{77, 0});
    Tensor h = x;
    for (auto& layer : layers_) h = product_ ? mul(layer->forward(h), constant) : add(layer->forward(h), constant);
    return h;
  }

 private:
  int64_t width_;
  bool product_;
  std::vector<std::shared_ptr<remat::testing::TanhBlock>> layers_;
};

// Layer calls with a custom op between them that saves, through its SaveContext, a value of its
// own making (twice its input, for the gradient of the square it returns).
class CustomOpBetweenCalls : public nn::Module {
 public:
  CustomOpBetweenCalls(int layers, int64_t width) {
    for (int i = 0; i < layers; ++i)
      layers_.push_back(register_module("l" + std::to_string(i),
                                        std::make_shared<remat::testing::TanhBlock>(width, DType::f32)));
    square_ = CustomOp{"square",
                       [](const TensorList& in, SaveContext& ctx) {
                         ctx.save(mul_scalar(in[0], 2.0));
                         return TensorList{mul(in[0], in[0])};
                       },
                       [](const TensorList& grads, const SavedValues& saved) { return TensorList{mul(grads[0], saved[0])}; }};
  }
  Tensor forward_impl(const Tensor& x) override {
    Tensor h = x;
    for (auto& layer : layers_) h = square_({layer->forward(h)})[0];
    return h;
  }

 private:
  std::vector<std::shared_ptr<remat::testing::TanhBlock>> layers_;
  CustomOp square_;
};

}  // namespace

// One value read by several stages (the same `value`) is counted once while a sweep keeps it.
TEST(BudgetSweeps, OneValueReadByManyStagesCountsOnce) {
  rs::ChainCosts held = rs::ChainCosts::uniform(4, 1.0, 1.0, 100, 0);
  held.gradients_counted = false;
  held.boundaries_counted_when_held = true;
  const rs::Plan plan = rs::plan_every_k(held, 4);
  const size_t alone = rs::simulate(held, plan).peak_bytes;
  held.swept_values = {{.read_by = 2, .made_by = -1, .bytes = 50, .value = 0},
                       {.read_by = 3, .made_by = -1, .bytes = 50, .value = 0}};
  EXPECT_EQ(rs::simulate(held, plan).peak_bytes, alone + 50);
  held.swept_values[1].value = -1;  // two values of 50 bytes
  EXPECT_EQ(rs::simulate(held, plan).peak_bytes, alone + 100);
  held.swept_values[1].value = 2;  // past the entries
  EXPECT_THROW(rs::simulate(held, plan), Error);
  held.swept_values[1] = {.read_by = 3, .made_by = -1, .bytes = 60, .value = 0};  // one value, two sizes
  EXPECT_THROW(rs::simulate(held, plan), Error);
}

// What the ops between stages save (a product with a mask) counts from the forward where its stage
// starts a node until that stage's backward: every gap at once under save-all, or in a region's
// re-run (never in its sweep); one gap at a time when nested regions re-run one stage each.
TEST(BudgetSweeps, WhatTheOpsBetweenStagesSaveCountsWhileTheyAreRecorded) {
  rs::ChainCosts costs = rs::ChainCosts::uniform(4, 1.0, 1.0, 100, 1000);
  costs.gradients_counted = false;
  costs.boundaries_counted_when_held = true;
  const auto peaks = [&](const rs::Plan& plan) {  // without gaps; one value in gaps 1..3; three values
    rs::ChainCosts held = costs;
    const size_t none = rs::simulate(held, plan).peak_bytes;
    for (int stage = 1; stage < 4; ++stage) held.gap_saved.push_back({stage, 10000, 0});
    const size_t shared = rs::simulate(held, plan).peak_bytes;
    for (auto& g : held.gap_saved) g.value = -1;
    return std::vector<size_t>{none, shared, rs::simulate(held, plan).peak_bytes};
  };
  EXPECT_EQ(peaks(rs::plan_save_all(costs)), (std::vector<size_t>{4500, 14500, 34500}));
  EXPECT_EQ(peaks(rs::plan_every_k(costs, 4)), (std::vector<size_t>{4400, 14400, 34400}));
  using N = rs::PlanNode;
  const rs::Plan nested = rs::make_plan(
      costs, {N::region(0, 2, {N::region(0, 1, {N::region(0, 0, {N::stage(0)}), N::stage(1)}), N::stage(2)}), N::stage(3)});
  EXPECT_EQ(peaks(nested), (std::vector<size_t>{1300, 11300, 11300}));
  costs.gap_saved = {{.stage = 4, .bytes = 1}};
  EXPECT_THROW(rs::simulate(costs, nested), Error);  // past the last stage
  costs.gap_saved = {{.stage = 1, .bytes = 1, .value = 0}, {.stage = 2, .bytes = 2, .value = 0}};
  EXPECT_THROW(rs::simulate(costs, nested), Error);  // one value, two sizes
}

// On random chains with random swept values and values saved between stages, plan_chain_held's
// plan keeps its held peak within the limit at every limit from its smallest, is refused below it
// with that smallest named or planned within the limit, and its prediction is simulate's with the
// held costs; without those values the smallest may lie below the planners' least peak.
TEST(BudgetSweeps, PlansStayWithinTheLimitAsHeldCountsThem) {
  int replanned = 0, below_least = 0;
  for (unsigned seed = 1; seed <= 12; ++seed) {
    const rs::ChainCosts costs = random_chain(24, seed);
    rs::ChainCosts held = costs;
    held.boundaries_counted_when_held = true;
    std::mt19937 rng(seed);
    for (int v = 0; v < 6; ++v) {
      const int read_by = 2 + static_cast<int>(rng() % 22);
      held.swept_values.push_back({read_by, static_cast<int>(rng() % static_cast<unsigned>(read_by)) - 1,
                                   1000 + rng() % 3000, -1});
    }
    const size_t shared = 500 + rng() % 2000;  // one value three gaps save, and one of its own
    for (int g = 0; g < 3; ++g) held.gap_saved.push_back({static_cast<int>(rng() % 24), shared, 0});
    held.gap_saved.push_back({static_cast<int>(rng() % 24), 500 + rng() % 2000, -1});
    const rs::ChainPlanner plans(costs, held);
    const size_t smallest = plans.smallest_limit();
    const size_t save_all = rs::plan_save_all(costs).predicted_peak_bytes;
    for (int k = 0; k <= 6; ++k) {
      const size_t limit = smallest + (save_all - smallest) * static_cast<size_t>(k) / 6;
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " limit " << limit);
      const rs::ChainPlan chosen = plans.plan(limit);
      EXPECT_LE(chosen.plan.predicted_peak_bytes, limit);
      EXPECT_EQ(chosen.plan.predicted_peak_bytes, rs::simulate(held, chosen.plan).peak_bytes);
      const rs::ChainPlan plain = rs::plan_chain(costs, limit);
      replanned += rs::simulate(held, plain.plan).peak_bytes > limit;
      rs::ChainCosts unswept = held;  // without swept and gap values the held count is never above the planners'
      unswept.swept_values.clear();
      unswept.gap_saved.clear();
      EXPECT_LE(rs::simulate(unswept, plain.plan).peak_bytes, plain.plan.predicted_peak_bytes);
    }
    // below it a limit may be planned (another plan's held peak may fit it), never above itself
    const auto refused_or_within = [&](size_t limit) {
      try {
        EXPECT_LE(plans.plan(limit).plan.predicted_peak_bytes, limit);
      } catch (const rs::InfeasibleError& e) {
        EXPECT_EQ(e.min_feasible_bytes, smallest);
      }
    };
    refused_or_within(smallest - 1);
    refused_or_within(rs::chain_min_feasible_memory(costs) - 1);
    // without swept and gap values, limits below the planners' least peak are planned down to the
    // held peak of their least plan
    rs::ChainCosts unswept = held;
    unswept.swept_values.clear();
    unswept.gap_saved.clear();
    const rs::ChainPlanner unswept_plans(costs, unswept);
    const size_t least = rs::chain_min_feasible_memory(costs), least_held = unswept_plans.smallest_limit();
    EXPECT_LE(least_held, least);
    below_least += least_held < least;
    EXPECT_LE(unswept_plans.plan(least_held).plan.predicted_peak_bytes, least_held);
    EXPECT_THROW(unswept_plans.plan(least_held - 1), rs::InfeasibleError);
  }
  EXPECT_GT(below_least, 0);  // the held count ran below the planners' least peak somewhere
  EXPECT_GT(replanned, 0);  // some limits needed a plan made again: the planners alone went above them
}

// At budgets from the smallest to save-all's peak: the measured peak of saved bytes is within the
// prediction, which is within the budget, and gradients are save-all's. Returns the costs of the
// smallest budget's plan and how many plans swept over several calls.
std::pair<rs::ChainCosts, int> expect_within_every_budget(nn::Module& model, const Tensor& x) {
  const TensorList reference = remat::testing::module_grads(model, x, Policy::save_all());
  for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) remat::testing::measure_step(model, x, Policy::budget(size_t{1} << 40));
  const auto range = model.planner()->feasible_range();
  if (!range) {
    ADD_FAILURE() << "no feasible range";
    return {};
  }
  std::pair<rs::ChainCosts, int> out{{}, 0};
  for (int k = 0; k <= 10; ++k) {
    const size_t budget = range->smallest_budget_bytes + (range->save_all_peak_bytes - range->smallest_budget_bytes) * static_cast<size_t>(k) / 10;
    SCOPED_TRACE(::testing::Message() << "budget " << budget);
    const size_t peak = remat::testing::measure_step(model, x, Policy::budget(budget)).peak_saved;
    const BudgetPlanner::Report report = *model.planner()->report();
    EXPECT_LE(peak, report.predicted_peak_bytes) << report.tree;
    EXPECT_LE(report.predicted_peak_bytes, budget) << report.tree;
    const TensorList got = remat::testing::module_grads(model, x, Policy::budget(budget));
    EXPECT_EQ(got.size(), reference.size());
    for (size_t i = 0; i < got.size() && i < reference.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], reference[i])) << i;
    for (const auto& node : report.plan.tree) out.second += node.last > node.first;
    if (k == 0) out.first = report.costs;
  }
  return out;
}

// A bias added between the calls: the profile finds it, with no gradient path, as one value that
// each of the 11 sweeps between the 12 calls reads (the last sum is the scope's output).
TEST(BudgetSweeps, ABiasWithoutAGradientPathIsCountedWhereARegionKeepsIt) {
  ConstantBetweenCalls model(12, 64, /*product=*/false);
  model.reset_parameters(3);
  const Tensor x = randn({16, 64}, DType::f32, RngState{13, 0}).requires_grad_();
  const auto [costs, swept_regions] = expect_within_every_budget(model, x);
  ASSERT_EQ(costs.swept_values.size(), 11u);
  for (const auto& v : costs.swept_values) {
    EXPECT_EQ(v.bytes, 16u * 64u * sizeof(float));
    EXPECT_EQ(v.made_by, -1);
    EXPECT_EQ(v.value, costs.swept_values.front().value);
  }
  EXPECT_TRUE(costs.gap_saved.empty());  // an add saves nothing
  EXPECT_GT(swept_regions, 0);  // some plan swept over several calls, past the bias
}

// A mask multiplied in between the calls: each product saves the mask (one value) and the call's
// output, and the plans count both where the products run recorded.
TEST(BudgetSweeps, WhatAProductBetweenCallsSavesIsCounted) {
  ConstantBetweenCalls model(12, 64, /*product=*/true);
  model.reset_parameters(3);
  const Tensor x = randn({16, 64}, DType::f32, RngState{13, 0}).requires_grad_();
  const auto [costs, swept_regions] = expect_within_every_budget(model, x);
  ASSERT_EQ(costs.gap_saved.size(), 22u);  // the mask and the output, before stages 1..11
  int mask = -1;
  for (const auto& g : costs.gap_saved) {
    EXPECT_EQ(g.bytes, 16u * 64u * sizeof(float));
    EXPECT_GE(g.stage, 1);
  }
  for (size_t i = 0; i < costs.gap_saved.size(); ++i)
    for (size_t j = 0; j < i; ++j) mask = costs.gap_saved[i].value == costs.gap_saved[j].value ? costs.gap_saved[i].value : mask;
  EXPECT_GE(mask, 0);  // one value saved by several products
  EXPECT_GT(swept_regions, 0);
}

// What a custom op saves through its SaveContext between the calls (a value of its own making) is
// counted as what the ops between calls save: one value before each of the stages 1..11.
TEST(BudgetSweeps, WhatACustomOpSavesBetweenCallsIsCounted) {
  CustomOpBetweenCalls model(12, 64);
  model.reset_parameters(3);
  const Tensor x = randn({16, 64}, DType::f32, RngState{13, 0}).requires_grad_();
  const auto [costs, swept_regions] = expect_within_every_budget(model, x);
  ASSERT_EQ(costs.gap_saved.size(), 11u);
  for (const auto& g : costs.gap_saved) EXPECT_EQ(g.bytes, 16u * 64u * sizeof(float));
}
