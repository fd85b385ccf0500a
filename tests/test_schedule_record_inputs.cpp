// An offloaded record takes the input it holds along (ChainCosts::saved_input_bytes; Note [a record
// that keeps its input] in src/schedule/simulate.cpp): simulate counts it out of memory while the
// record is away, the planners credit the offload with it, and a budget plan with an offload
// target, planned and predicted as the allocator counts, stays within its limit and never rises
// when the limit falls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "module_models.h"
#include "plan_checks.h"
#include "random_chain.h"
#include "remat/budget.h"
#include "remat/nn.h"
#include "remat/schedule.h"
#include "schedule/chain_internal.h"
#include "temp_dir.h"

using namespace remat;
namespace rs = remat::schedule;
using rs::ChainCosts;
using rs::PlanNode;
using remat::testing::falling;

namespace {

constexpr size_t K = 1000;

// Six stages: boundaries K, records 5K, each record holding its input and its output (a Linear
// then a tanh); gradients not counted.
ChainCosts linear_tanh_chain() {
  ChainCosts c = ChainCosts::uniform(6, 1.0, 2.0, K, 5 * K);
  c.gradients_counted = false;
  c.saved_output_bytes.assign(6, K);
  c.saved_input_bytes.assign(6, K);
  c.offload_seconds_per_byte = 1e-9;
  return c;
}

// a random chain whose records hold part or all of their inputs, and some their outputs
ChainCosts with_held_values(ChainCosts c, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(0, 3);
  const size_t stages = c.saved_bytes.size();
  c.saved_input_bytes.assign(stages, 0);
  c.saved_output_bytes.assign(stages, 0);
  for (size_t i = 0; i < stages; ++i) {
    const int p = pick(rng);
    c.saved_input_bytes[i] = p == 0 ? 0 : p == 1 ? c.boundary_bytes[i] / 2 : c.boundary_bytes[i];
    if (pick(rng) == 0) c.saved_output_bytes[i] = std::min(c.saved_bytes[i], c.boundary_bytes[i + 1]);
  }
  return c;
}

// The random chain of `stages` and `seed` with held values, counted as held (`held`) and as the
// planners count (`planning`, priced for an offload target where `target`).
struct HeldChain {
  ChainCosts held, planning;
};
HeldChain held_chain(int stages, unsigned seed, bool target) {
  HeldChain c;
  c.held = with_held_values(random_chain(stages, 700 + seed), seed);
  c.held.gradients_counted = seed % 2 == 1;
  c.held.boundaries_counted_when_held = true;
  c.planning = c.held;
  c.planning.boundaries_counted_when_held = false;
  c.planning.saved_output_bytes.clear();
  c.planning.saved_input_bytes.clear();
  if (target) {
    c.planning.offload_seconds_per_byte = 1e-3;
    c.planning.offload_write_seconds_per_byte = 5e-4;
    c.planning.reads_ahead = true;
  }
  return c;
}

// The plans of `candidates` at `count` limits falling from save-all's peak to the smallest: each
// prediction is the plan's held simulation and within its limit. Returns how many predictions
// rose as the limit fell; adds the plans made to `plans`.
int held_rises(const rs::ChainPlanner& candidates, const HeldChain& c, int count, int& plans) {
  const size_t smallest = candidates.smallest_limit();
  size_t previous = SIZE_MAX;
  int rises = 0;
  for (size_t limit : falling(smallest, rs::plan_save_all(c.held).predicted_peak_bytes, count)) {
    bool in_memory = false;
    const rs::ChainPlan chosen = candidates.plan(limit, &in_memory);
    const ChainCosts counted = in_memory ? c.held : rs::held_with_target(c.held, c.planning);
    EXPECT_EQ(rs::simulate(counted, chosen.plan).peak_bytes, chosen.plan.predicted_peak_bytes) << "limit " << limit;
    EXPECT_LE(chosen.plan.predicted_peak_bytes, limit);
    rises += chosen.plan.predicted_peak_bytes > previous;
    previous = chosen.plan.predicted_peak_bytes;
    ++plans;
  }
  return rises;
}

}  // namespace

// S0+o .. S4+o S5, counted as held: each offloaded record leaves with its input, so the forward
// never holds more than one stage's input and record (6K), where without the input going along
// every boundary would stay (a_0..a_5 and record 5 at the last forward: 11K).
TEST(ChainSim, AnOffloadedRecordTakesTheInputItHolds) {
  ChainCosts with = linear_tanh_chain();
  with.boundaries_counted_when_held = true;
  std::vector<PlanNode> tree;
  for (int i = 0; i < 6; ++i) {
    tree.push_back(PlanNode::stage(i));
    if (i < 5) tree.back().offload();
  }
  const rs::SimResult sim = rs::simulate(with, rs::make_plan(with, tree));
  EXPECT_EQ(sim.peak_bytes, 6 * K);
  EXPECT_EQ(sim.offloaded_bytes, 5 * (5 * K + K));
  // S1+o alone: record 0 keeps a_1 as its output, so a_1 stays (once); a_2, record 1's output,
  // is counted apart while record 1 is away (the runtime may have written it: over, never under)
  std::vector<PlanNode> one;
  for (int i = 0; i < 6; ++i) one.push_back(PlanNode::stage(i));
  one[1].offload();
  EXPECT_EQ(rs::simulate(with, rs::make_plan(with, one)).peak_bytes, 27 * K);
  EXPECT_EQ(rs::simulate(with, rs::plan_save_all(with)).peak_bytes, 31 * K);
  ChainCosts without = with;
  without.saved_input_bytes.clear();
  const rs::SimResult kept = rs::simulate(without, rs::make_plan(without, tree));
  EXPECT_EQ(kept.peak_bytes, 11 * K);
  EXPECT_EQ(kept.offloaded_bytes, 5 * 5 * K);
}

// The planners see the credit: with it, the least peak with an offload target falls, and every
// plan the exact and the grouped programmes make on random chains whose records hold their inputs
// simulates within its limit (plan_chain checks it and would throw).
TEST(ChainPlan, ThePlannersCreditAnOffloadedRecordsInput) {
  ChainCosts c = linear_tanh_chain();
  ChainCosts no_credit = c;
  no_credit.saved_input_bytes.clear();
  EXPECT_LT(rs::min_feasible_memory(c), rs::min_feasible_memory(no_credit));
  int plans = 0;
  for (int stages : {12, 40})
    for (unsigned seed = 1; seed <= 3; ++seed) {
      ChainCosts r = with_held_values(random_chain(stages, 500 + seed), seed);
      r.offload_seconds_per_byte = 2e-4;
      r.offload_write_seconds_per_byte = 1e-4;
      SCOPED_TRACE(::testing::Message() << stages << " stages, seed " << seed);
      plans += remat::testing::expect_plans_within_their_limits(r);
    }
  EXPECT_EQ(plans, 2 * 3 * 2 * 6);
}

// A budget plan with an offload target on random chains (8, 30 and 150 stages; records holding
// their inputs, some their outputs): planned and predicted as held, from its smallest limit up to
// save-all's peak. The prediction is the held simulation of the plan and within the limit, and it
// never rises as the limit falls (Note [a prediction that never rises] in chain_planner.cpp; the
// 150-stage chains are the grouped planner's); one byte below the smallest limit is refused.
TEST(ChainPlan, OffloadPlansCountedAsHeldStayWithinTheirLimits) {
  int plans = 0, rises = 0;
  for (int stages : {8, 30, 150})
    for (unsigned seed = 1; seed <= 2; ++seed) {
      const HeldChain c = held_chain(stages, seed, true);
      SCOPED_TRACE(::testing::Message() << stages << " stages, seed " << seed);
      const rs::ChainPlanner candidates = rs::ChainPlanner(c.planning, c.held);
      rises += held_rises(candidates, c, 20, plans);
      EXPECT_THROW(candidates.plan(candidates.smallest_limit() - 1), rs::InfeasibleError);
    }
  EXPECT_EQ(plans, 3 * 2 * 20);
  EXPECT_EQ(rises, 0);
}

// The property over more random chains (8 and 30 stages, the exact programme's, seeds 1-5), in
// memory (plan_chain_held) and with an offload target: at 20 limits falling from save-all's peak
// to the smallest, the held prediction never rises, and it is the plan's held simulation.
// With the plans made within each limit alone (before Note [a prediction that never rises]), 4 of
// these 200 limits rose.
TEST(ChainPlan, HeldPredictionsNeverRiseWhenTheLimitFalls) {
  int plans = 0, rises = 0;
  for (int stages : {8, 30})
    for (unsigned seed = 1; seed <= 5; ++seed)
      for (bool target : {false, true}) {
        const HeldChain c = held_chain(stages, seed, target);
        SCOPED_TRACE(::testing::Message() << stages << " stages, seed " << seed << (target ? ", target" : ""));
        rises += held_rises(target ? rs::ChainPlanner(c.planning, c.held) : rs::ChainPlanner(c.planning, c.held),
                            c, 20, plans);
      }
  EXPECT_EQ(plans, 2 * 5 * 2 * 20);
  EXPECT_EQ(rises, 0);
}

// The property above on chains longer than 8,192 stages, where the grouped planner's candidates
// are read at fewer levels of each anchor (9,000 stages, seed 1 in memory and seed 2 with a
// target, 8 limits each; 8 top-level parts and 16 units a group keep it short): the held
// prediction never rises, stays within the limit and is the plan's held simulation.
TEST(ChainPlan, HeldPredictionsNeverRiseOnLongChains) {
  rs::ChainPlanOptions options;
  options.top_parts = 8;
  options.group_slots = 16;
  int plans = 0, rises = 0;
  for (unsigned seed = 1; seed <= 2; ++seed) {
    const bool target = seed == 2;
    const HeldChain c = held_chain(9000, seed, target);
    SCOPED_TRACE(::testing::Message() << "seed " << seed << (target ? ", target" : ""));
    const rs::ChainPlanner candidates =
        target ? rs::ChainPlanner(c.planning, c.held, options) : rs::ChainPlanner(c.planning, c.held, options);
    rises += held_rises(candidates, c, 8, plans);
    EXPECT_THROW(candidates.plan(candidates.smallest_limit() - 1), rs::InfeasibleError);
  }
  EXPECT_EQ(plans, 2 * 8);
  EXPECT_EQ(rises, 0);
}

// The threads that build group menus and simulate candidates change no plan: on 1 thread and on
// 3, plan_chain and ChainPlanner give the same trees.
TEST(ChainPlan, ThreadsChangeNoPlan) {
  const auto [held, planning] = held_chain(3000, 4, true);
  rs::ChainPlanOptions one;
  one.top_parts = 8;
  one.group_slots = 50;
  one.threads = 1;
  rs::ChainPlanOptions three = one;
  three.threads = 3;
  const size_t limit = rs::plan_every_layer(held).predicted_peak_bytes / 3;
  EXPECT_EQ(rs::plan_chain(planning, limit, one).plan.tree, rs::plan_chain(planning, limit, three).plan.tree);
  const rs::ChainPlanner a = rs::ChainPlanner(planning, held, one);
  const rs::ChainPlanner b = rs::ChainPlanner(planning, held, three);
  EXPECT_EQ(a.smallest_limit(), b.smallest_limit());
  for (size_t at : {limit, a.smallest_limit()}) EXPECT_EQ(a.plan(at).plan.tree, b.plan(at).plan.tree);
}

// ChainPlanner answers as the functions that each build it do: the same smallest limit and, at limits
// from it up, the same plan, in memory and with a target (where below the target's smallest limit
// the plan is in memory).
TEST(ChainPlan, ChainPlannerAnswerAsThePlanFunctions) {
  for (int stages : {8, 30})
    for (bool target : {false, true}) {
      const auto [held, planning] = held_chain(stages, 3, target);
      SCOPED_TRACE(::testing::Message() << stages << " stages" << (target ? ", target" : ""));
      const rs::ChainPlanner plans = target ? rs::ChainPlanner(planning, held) : rs::ChainPlanner(planning, held);
      const size_t smallest = plans.smallest_limit();
      EXPECT_EQ(smallest, target ? rs::chain_min_feasible_memory_offload_or_held(planning, held)
                                 : rs::chain_min_feasible_memory_held(planning, held));
      for (size_t limit : falling(smallest, rs::plan_save_all(held).predicted_peak_bytes, 3)) {
        bool in_memory = false, function_in_memory = !target;
        const rs::ChainPlan got = plans.plan(limit, &in_memory);
        const rs::ChainPlan want = target ? rs::plan_chain_offload_or_held(planning, held, limit, {}, function_in_memory)
                                          : rs::plan_chain_held(planning, held, limit);
        EXPECT_EQ(got.plan.tree, want.plan.tree) << "limit " << limit;
        EXPECT_EQ(got.plan.predicted_peak_bytes, want.plan.predicted_peak_bytes);
        EXPECT_EQ(got.describe(), want.describe());
        EXPECT_EQ(in_memory, function_in_memory);
      }
    }
}

// The budget policy measures, per layer call, what its record holds of its input: all of it for a
// layer that begins with a Linear (which saves its input), nothing for a tanh (which saves its
// output only). An offload plan of the model stays within its prediction, with save-all's
// gradients.
TEST(BudgetRecordInputs, TheProfileMeasuresWhatEachRecordHoldsOfItsInput) {
  nn::Sequential model;
  model.add(std::make_shared<remat::testing::TanhBlock>(32, DType::f32));
  model.add(std::make_shared<nn::Tanh>());
  model.add(std::make_shared<remat::testing::TanhBlock>(32, DType::f32));
  model.add(std::make_shared<remat::testing::TanhBlock>(32, DType::f32));
  model.reset_parameters(5);
  const Tensor x = randn({8, 32}, DType::f32, RngState{6, 0});
  const TensorList reference = remat::testing::module_grads(model, x, Policy::save_all());
  for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) remat::testing::measure_step(model, x, Policy::budget(size_t{1} << 40));
  remat::testing::measure_step(model, x, Policy::budget(size_t{1} << 40));
  const std::optional<rs::ChainCosts> costs = model.planner()->costs();
  ASSERT_TRUE(costs.has_value());
  const size_t value = 8 * 32 * sizeof(float);
  EXPECT_EQ(costs->saved_input_bytes, (std::vector<size_t>{value, 0, value, value}));
  const std::string dir = remat::testing::fresh_dir("record-inputs");
  const auto range = model.planner()->feasible_range();
  ASSERT_TRUE(range.has_value());
  const Policy offload = Policy::budget(range->smallest_budget_bytes).with_offload(OffloadTarget{dir, 0, 0});
  const size_t peak = remat::testing::measure_step(model, x, offload).peak_saved;
  const BudgetPlanner::Report report = *model.planner()->report();
  EXPECT_LE(peak, report.predicted_peak_bytes) << report.tree;
  EXPECT_LE(report.predicted_peak_bytes, range->smallest_budget_bytes) << report.tree;
  const TensorList got = remat::testing::module_grads(model, x, offload);
  ASSERT_EQ(got.size(), reference.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(remat::testing::bitwise_equal(got[i], reference[i])) << i;
}
