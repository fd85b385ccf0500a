// What a region's sweep keeps besides its input (Note [what a sweep keeps] in
// src/checkpoint/budget.cpp): a value made before a region and read between its layer calls. The
// budget policy measures such values while profiling, predicts a plan with them and plans within
// the budget as they are counted (schedule::plan_chain_held).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "checkpoint_models.h"
#include "module_models.h"
#include "random_chain.h"
#include "remat/budget.h"
#include "remat/nn.h"
#include "remat/schedule.h"

using namespace remat;
using remat::testing::bitwise_equal;
namespace rs = remat::schedule;

namespace {

// Layer calls with a constant bias added to each call's output between the calls. The bias is made
// before the first call and has no gradient path; a region over several calls keeps it. (An add
// saves nothing: a product would also save the bias and the call's output in a record of its own,
// outside the layer calls, which the chain model does not count: docs/checkpointing.md, "Budgets".)
class BiasedTanhModel : public nn::Module {
 public:
  BiasedTanhModel(int layers, int64_t width) : width_(width) {
    for (int i = 0; i < layers; ++i)
      layers_.push_back(register_module("l" + std::to_string(i),
                                        std::make_shared<remat::testing::TanhBlock>(width, DType::f32)));
  }
  Tensor forward_impl(const Tensor& x) override {
    const Tensor bias = randn({x.shape()[0], width_}, DType::f32, RngState{77, 0});
    Tensor h = x;
    for (auto& layer : layers_) h = add(layer->forward(h), bias);
    return h;
  }

 private:
  int64_t width_;
  std::vector<std::shared_ptr<remat::testing::TanhBlock>> layers_;
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

// On random chains with random swept values, plan_chain_held's plan keeps its held peak within
// the limit at every limit from its smallest, is refused below it with that smallest named, and
// its prediction is simulate's with the held costs.
TEST(BudgetSweeps, PlansStayWithinTheLimitAsHeldCountsThem) {
  int replanned = 0;
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
    const size_t smallest = rs::chain_min_feasible_memory_held(costs, held);
    const size_t save_all = rs::plan_save_all(costs).predicted_peak_bytes;
    for (int k = 0; k <= 6; ++k) {
      const size_t limit = smallest + (save_all - smallest) * static_cast<size_t>(k) / 6;
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " limit " << limit);
      const rs::ChainPlan chosen = rs::plan_chain_held(costs, held, limit);
      EXPECT_LE(chosen.plan.predicted_peak_bytes, limit);
      EXPECT_EQ(chosen.plan.predicted_peak_bytes, rs::simulate(held, chosen.plan).peak_bytes);
      const rs::ChainPlan plain = rs::plan_chain(costs, limit);
      replanned += rs::simulate(held, plain.plan).peak_bytes > limit;
      rs::ChainCosts unswept = held;  // without swept values the held count is never above the planners'
      unswept.swept_values.clear();
      EXPECT_LE(rs::simulate(unswept, plain.plan).peak_bytes, plain.plan.predicted_peak_bytes);
    }
    // below it a limit may still be planned (another plan's held peak may fit it), never above
    // itself; below the planners' least peak it is refused, naming the smallest
    try {
      EXPECT_LE(rs::plan_chain_held(costs, held, smallest - 1).plan.predicted_peak_bytes, smallest - 1);
    } catch (const rs::InfeasibleError& e) {
      EXPECT_EQ(e.min_feasible_bytes, smallest);
    }
    try {
      rs::plan_chain_held(costs, held, rs::chain_min_feasible_memory(costs) - 1);
      ADD_FAILURE() << "seed " << seed << ": a limit below the planners' least peak was planned";
    } catch (const rs::InfeasibleError& e) {
      EXPECT_EQ(e.min_feasible_bytes, smallest);
    }
  }
  EXPECT_GT(replanned, 0);  // some limits needed a plan made again: the planners alone went above them
}

// A model whose ops between layer calls read a constant bias made before them: at every budget
// from the smallest to save-all's peak the measured peak of saved bytes is within the prediction,
// which is within the budget; gradients are save-all's. The profile finds the bias, with no
// gradient path, once for every call that reads it.
TEST(BudgetSweeps, ABiasWithoutAGradientPathIsCountedWhereARegionKeepsIt) {
  BiasedTanhModel model(12, 64);
  model.reset_parameters(3);
  const Tensor x = randn({16, 64}, DType::f32, RngState{13, 0}).requires_grad_();
  const TensorList reference = remat::testing::module_grads(model, x, Policy::save_all());
  for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) remat::testing::measure_step(model, x, Policy::budget(size_t{1} << 40));
  const auto range = model.planner()->feasible_range();
  ASSERT_TRUE(range.has_value());
  int swept_regions = 0;
  for (int k = 0; k <= 10; ++k) {
    const size_t budget = range->smallest_budget_bytes + (range->save_all_peak_bytes - range->smallest_budget_bytes) * static_cast<size_t>(k) / 10;
    SCOPED_TRACE(::testing::Message() << "budget " << budget);
    const size_t peak = remat::testing::measure_step(model, x, Policy::budget(budget)).peak_saved;
    const BudgetPlanner::Report report = *model.planner()->report();
    EXPECT_LE(peak, report.predicted_peak_bytes) << report.tree;
    EXPECT_LE(report.predicted_peak_bytes, budget) << report.tree;
    const TensorList got = remat::testing::module_grads(model, x, Policy::budget(budget));
    ASSERT_EQ(got.size(), reference.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], reference[i])) << i;
    for (const auto& node : report.plan.tree) swept_regions += node.last > node.first;
    if (k > 0) continue;
    // the bias, read between every two of the 12 calls (the last sum is the scope's output)
    const auto& swept = report.costs.swept_values;
    ASSERT_EQ(swept.size(), 11u);
    for (const auto& v : swept) {
      EXPECT_EQ(v.bytes, 16u * 64u * sizeof(float));
      EXPECT_EQ(v.made_by, -1);
      EXPECT_EQ(v.value, swept.front().value);
    }
  }
  EXPECT_GT(swept_regions, 0);  // some plan swept over several calls, past the bias
}
