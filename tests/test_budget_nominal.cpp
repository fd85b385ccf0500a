// ChainPlanOptions::times_from_flops: a budget plan priced by the layer calls' FLOP estimates is
// the same on every run, whatever the machine's load, and its costs are the nominal times.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpt_steps.h"
#include "remat/budget.h"
#include "remat/nn.h"
#include "remat/schedule.h"

using namespace remat;
namespace rs = remat::schedule;

namespace {

// A fresh GPT, profiled and planned at each budget (fractions of its save-all peak): the plans.
std::vector<std::string> plans_of_a_fresh_gpt(bool from_flops, std::vector<double>* forward_times = nullptr,
                                              std::vector<double>* backward_times = nullptr,
                                              std::vector<double>* flops = nullptr) {
  nn::GPTConfig config{.vocab = 13, .layers = 6, .width = 32, .heads = 2, .seq = 16, .dropout = 0.0,
                       .dtype = DType::f32, .seed = 9};
  nn::GPT model(config);
  const Tensor ids = remat::testing::token_ids(4, 16, 13, 51), targets = remat::testing::token_ids(4, 16, 13, 52);
  rs::ChainPlanOptions options;
  options.times_from_flops = from_flops;
  model.planner()->set_options(options);
  const auto step = [&](size_t budget) {
    ScopedPolicy scope(Policy::budget(budget));
    model.zero_grad();
    model.loss(ids, targets).backward();
  };
  for (int i = 0; i <= BudgetPlanner::kProfilingSteps; ++i) step(size_t{1} << 40);
  const auto range = model.planner()->feasible_range();
  EXPECT_TRUE(range.has_value());
  if (forward_times) *forward_times = model.planner()->costs()->forward_time;
  if (backward_times) *backward_times = model.planner()->costs()->backward_time;
  if (flops) *flops = model.planner()->report()->stage_forward_flops;
  std::vector<std::string> trees;
  for (double f : {0.2, 0.4, 0.6}) {
    const size_t budget = range->smallest_budget_bytes +
                          static_cast<size_t>(f * static_cast<double>(range->save_all_peak_bytes - range->smallest_budget_bytes));
    step(budget);
    trees.push_back(model.planner()->report()->tree);
  }
  return trees;
}

}  // namespace

// Five fresh models plan alike at three budgets; each layer call is priced at its profiled FLOP
// estimate over 1e9 FLOP/s, its backward at twice that.
TEST(BudgetNominal, PlansPricedByFlopsAreTheSameOnEveryRun) {
  std::vector<double> forward, backward, flops;
  const std::vector<std::string> first = plans_of_a_fresh_gpt(true, &forward, &backward, &flops);
  for (int run = 0; run < 4; ++run) EXPECT_EQ(plans_of_a_fresh_gpt(true), first) << "run " << run;
  ASSERT_EQ(forward.size(), flops.size());
  ASSERT_EQ(backward.size(), flops.size());
  double total = 0;
  for (size_t i = 0; i < flops.size(); ++i) {
    EXPECT_DOUBLE_EQ(forward[i], flops[i] * 1e-9) << i;
    EXPECT_DOUBLE_EQ(backward[i], 2 * flops[i] * 1e-9) << i;
    total += flops[i];
  }
  EXPECT_GT(total, 0.0);
}
