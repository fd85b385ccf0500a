// The peak guarantee of budget plans, as properties over budgets: the measured peak of saved
// bytes (the allocator's counters) never exceeds the plan's prediction, which never exceeds the
// budget and never rises when the budget falls; in memory the measured peak never rises either.
// On random chains, the predicted peak of plan_chain (exact and grouped, with and without an
// offload target) never rises when the limit falls.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "checkpoint_models.h"
#include "random_chain.h"
#include "remat/budget.h"
#include "remat/schedule.h"
#include "temp_dir.h"

using namespace remat;
using remat::testing::bitwise_equal;
using remat::testing::TanhChain;
namespace rs = remat::schedule;

namespace {

size_t step_peak_saved(TanhChain& model, const Tensor& x, const Policy& policy, TensorList* grads = nullptr) {
  model.zero_grad();
  memory::reset_peaks();
  const size_t base = memory::live_bytes(memory::Tag::saved);
  backward([&] { return mean(model.chain.forward(x)); }, GradOptions{policy});
  if (grads) {
    grads->clear();
    for (auto& p : model.params()) grads->push_back(p.grad().clone());
  }
  return memory::peak_bytes(memory::Tag::saved) - base;
}

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

// Random chains: 8 and 30 stages (the exact programme) and 150 (the grouped one), gradients
// counted or not, no offload target, free offload and a dear one; 25 limits from save-all's peak
// down to the least feasible one. The predicted peak equals the simulated one and never rises.
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
