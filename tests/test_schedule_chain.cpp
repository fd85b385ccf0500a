// Tests of the schedule layer's heterogeneous chains: rotor against exhaustive search over all
// plan trees (with and without offload), the discretisation bound, the simulator's memory
// formulas and its rejection of invalid plans (docs/planners.md). Uniform chains (Revolve,
// online checkpointing): test_schedule.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <functional>
#include <limits>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "remat/schedule.h"
#include "schedule/chain_internal.h"

namespace rs = remat::schedule;
using rs::Action;
using rs::ActionKind;
using rs::ChainCosts;
using rs::Plan;
using rs::PlanNode;

namespace {

// ---------------------------------------------------------------- chain plans: helpers

ChainCosts random_costs(std::mt19937& rng, int stages, size_t max_bytes, bool allow_zero) {
  std::uniform_int_distribution<int> time(allow_zero ? 0 : 1, 10);
  std::uniform_int_distribution<size_t> bytes(allow_zero ? 0 : 1, max_bytes);
  ChainCosts costs;
  for (int i = 0; i < stages; ++i) {
    costs.forward_time.push_back(time(rng));
    costs.backward_time.push_back(time(rng));
    costs.saved_bytes.push_back(bytes(rng));
  }
  for (int i = 0; i <= stages; ++i) costs.boundary_bytes.push_back(bytes(rng));
  return costs;
}

// Calls emit with every valid sequence over stages [first, last]; in_region: the sequence is a
// region's children (then a single region over [first, last] is not allowed).
void enumerate_sequences(int first, int last, bool in_region, std::vector<PlanNode>& current, int position,
                         const std::function<void(const std::vector<PlanNode>&)>& emit) {
  if (position > last) {
    emit(current);
    return;
  }
  current.push_back(PlanNode::stage(position));
  enumerate_sequences(first, last, in_region, current, position + 1, emit);
  current.pop_back();
  for (int end = position; end <= last; ++end) {
    if (in_region && position == first && end == last) continue;
    std::vector<PlanNode> inner;
    enumerate_sequences(position, end, true, inner, position, [&](const std::vector<PlanNode>& children) {
      current.push_back(PlanNode::region(position, end, children));
      enumerate_sequences(first, last, in_region, current, end + 1, emit);
      current.pop_back();
    });
  }
}

struct Outcome {
  size_t peak;
  double time;
};

// The action list of every valid tree over `stages` stages (they do not depend on the costs),
// built once per stage count.
const std::vector<std::vector<Action>>& all_action_lists(int stages) {
  static std::vector<std::vector<std::vector<Action>>> cache(7);
  std::vector<std::vector<Action>>& lists = cache.at(static_cast<size_t>(stages));
  if (lists.empty()) {
    std::vector<PlanNode> current;
    enumerate_sequences(0, stages - 1, false, current, 0, [&](const std::vector<PlanNode>& tree) {
      lists.push_back(rs::plan_actions(tree, stages));
    });
  }
  return lists;
}

// (peak, time) of every valid plan tree, each run through the simulator. Up to 6 stages the
// action lists are cached; above, trees are streamed.
std::vector<Outcome> all_outcomes(const ChainCosts& costs) {
  std::vector<Outcome> outcomes;
  const int stages = costs.num_stages();
  const auto add = [&](const std::vector<Action>& actions) {
    const rs::SimResult result = rs::simulate_actions(costs, actions);
    outcomes.push_back({result.peak_bytes, result.total_time});
  };
  if (stages <= 6) {
    for (const std::vector<Action>& actions : all_action_lists(stages)) add(actions);
  } else {
    std::vector<PlanNode> current;
    enumerate_sequences(0, stages - 1, false, current, 0,
                        [&](const std::vector<PlanNode>& tree) { add(rs::plan_actions(tree, stages)); });
  }
  return outcomes;
}

double best_time_within(const std::vector<Outcome>& outcomes, double limit) {
  double best = std::numeric_limits<double>::infinity();
  for (const Outcome& outcome : outcomes)
    if (static_cast<double>(outcome.peak) <= limit) best = std::min(best, outcome.time);
  return best;
}

size_t least_peak(const std::vector<Outcome>& outcomes) {
  size_t best = std::numeric_limits<size_t>::max();
  for (const Outcome& outcome : outcomes) best = std::min(best, outcome.peak);
  return best;
}

// ---------------------------------------------------------------- chain plans: tests

TEST(ChainPlan, EnumeratorCountsEveryTree) {
  // Sequences S(l) = 2 A(l), A(l) = S(l-1) + sum_{j<l} A(j) S(l-j): A(j) kinds of region over j
  // stages (all child sequences but the A(j) made of one such region), and the top level may be
  // a single region. plan_actions validated each tree while the lists were built.
  const std::vector<size_t> expected = {2, 8, 48, 352, 2880, 25216};
  for (int stages = 1; stages <= 6; ++stages)
    EXPECT_EQ(all_action_lists(stages).size(), expected[static_cast<size_t>(stages - 1)]) << stages << " stages";
}

TEST(ChainPlan, HeaderExample) {
  ChainCosts costs;
  costs.forward_time = {1.0, 4.0, 2.0};
  costs.backward_time = {2.0, 8.0, 4.0};
  costs.boundary_bytes = {64, 256, 256, 16};
  costs.saved_bytes = {512, 4096, 1024};
  EXPECT_EQ(rs::min_feasible_memory(costs), 4928u);
  EXPECT_EQ(rs::plan_save_all(costs).predicted_peak_bytes, 6480u);
  const Plan plan = rs::plan_rotor(costs, 5600);
  EXPECT_EQ(rs::simulate(costs, plan).peak_bytes, 5440u);
  EXPECT_EQ(rs::format_tree(plan.tree), "S0 R[1..1](S1) S2");
  EXPECT_EQ(rs::format_actions(plan.actions), "Fa0 Fn1 Fa2 L B2 D2 Fa1 D2 B1 D1 B0");
  EXPECT_THROW(rs::plan_rotor(costs, 4927), rs::InfeasibleError);
}

TEST(ChainPlan, ActionsOfATree) {
  const std::vector<PlanNode> tree = {PlanNode::stage(0),
                                      PlanNode::region(1, 2, {PlanNode::stage(1), PlanNode::stage(2)}),
                                      PlanNode::stage(3)};
  EXPECT_EQ(rs::format_tree(tree), "S0 R[1..2](S1 S2) S3");
  EXPECT_EQ(rs::format_actions(rs::plan_actions(tree, 4)),
            "Fa0 Fn1 Fn2 D2 Fa3 L B3 D3 Fa1 Fa2 D3 B2 D2 B1 D1 B0");
}

TEST(ChainPlan, MemoryFormulasOfFixedPlans) {
  // Uniform chain: boundaries b, records r. Save-all peaks at the loss or the last backward:
  // (L + 2) b + L r. Every-layer keeps L + 1 boundaries, then one record: (L + 2) b + r.
  for (int stages : {1, 2, 5, 16}) {
    const size_t b = 100, r = 1000;
    const ChainCosts costs = ChainCosts::uniform(stages, 1.0, 2.0, b, r);
    const Plan save_all = rs::plan_save_all(costs);
    const Plan every_layer = rs::plan_every_layer(costs);
    EXPECT_EQ(save_all.predicted_peak_bytes, (stages + 2) * b + stages * r);
    EXPECT_EQ(save_all.predicted_time, 3.0 * stages);
    EXPECT_EQ(every_layer.predicted_peak_bytes, (stages + 2) * b + r);
    EXPECT_EQ(every_layer.predicted_time, 4.0 * stages);
    const rs::SimResult simulated = rs::simulate(costs, every_layer);
    EXPECT_EQ(simulated.recomputed_forwards, stages);
    EXPECT_EQ(simulated.peak_bytes, every_layer.predicted_peak_bytes);
  }
}

TEST(ChainPlan, UniformSegmentsFollowCheckpointSequential) {
  const ChainCosts costs = ChainCosts::uniform(10, 1.0, 2.0, 8, 64);
  EXPECT_EQ(rs::format_tree(rs::plan_uniform_segments(costs, 3).tree),
            "R[0..2](S0 S1 S2) R[3..5](S3 S4 S5) S6 S7 S8 S9");
  EXPECT_EQ(rs::format_tree(rs::plan_uniform_segments(costs, 1).tree), rs::format_tree(rs::plan_save_all(costs).tree));
  EXPECT_EQ(rs::format_tree(rs::plan_every_k(costs, 4).tree),
            "R[0..3](S0 S1 S2 S3) R[4..7](S4 S5 S6 S7) R[8..9](S8 S9)");
  EXPECT_THROW(rs::plan_uniform_segments(costs, 11), remat::Error);
  EXPECT_THROW(rs::plan_uniform_segments(costs, 0), remat::Error);
}

// plan_rotor at several limits against the best simulated plan among all trees; limits below the
// least peak must throw InfeasibleError carrying it.
void check_rotor_against_exhaustive_search(const ChainCosts& costs, std::mt19937& rng) {
  const std::vector<Outcome> outcomes = all_outcomes(costs);
  const size_t minimal = least_peak(outcomes);
  ASSERT_EQ(rs::min_feasible_memory(costs), minimal);
  ASSERT_EQ(rs::plan_min_memory(costs).predicted_peak_bytes, minimal);
  const size_t most = rs::plan_save_all(costs).predicted_peak_bytes;
  std::vector<size_t> limits = {minimal, most, most + 7, minimal + (most - minimal) / 2};
  std::uniform_int_distribution<size_t> between(minimal, most);
  for (int k = 0; k < 4; ++k) limits.push_back(between(rng));
  for (size_t limit : limits) {
    // Sizes <= 20 and limits < 500 + x[0]: the unit is one byte, so the DP is exact.
    const Plan plan = rs::plan_rotor(costs, limit);
    const rs::SimResult simulated = rs::simulate(costs, plan);
    ASSERT_LE(simulated.peak_bytes, limit);
    ASSERT_EQ(simulated.peak_bytes, plan.predicted_peak_bytes);
    ASSERT_EQ(simulated.total_time, plan.predicted_time);
    ASSERT_EQ(plan.predicted_time, best_time_within(outcomes, static_cast<double>(limit)))
        << costs.num_stages() << " stages, limit " << limit << ", plan " << rs::format_tree(plan.tree);
  }
  try {
    rs::plan_rotor(costs, minimal - 1);
    FAIL() << "expected InfeasibleError";
  } catch (const rs::InfeasibleError& error) {
    EXPECT_EQ(error.min_feasible_bytes, minimal);
    EXPECT_NE(std::string(error.what()).find(std::to_string(minimal) + " bytes"), std::string::npos) << error.what();
  }
}

// Sanitizer builds run the exhaustive searches on fewer and smaller instances (< 10 s in all).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

TEST(ChainPlan, RotorEqualsExhaustiveSearch) {
  // Instances per stage count 1..7 (6 stages: 25216 trees, 7 stages: 231168, each simulated).
  const std::vector<int> instances =
      kSanitized ? std::vector<int>{10, 10, 10, 6, 4, 1, 0} : std::vector<int>{10, 10, 10, 8, 6, 3, 1};
  std::mt19937 rng(12345);
  for (int stages = 1; stages <= 7; ++stages)
    for (int instance = 0; instance < instances[static_cast<size_t>(stages - 1)]; ++instance) {
      SCOPED_TRACE(std::to_string(stages) + " stages, instance " + std::to_string(instance));
      check_rotor_against_exhaustive_search(random_costs(rng, stages, 20, instance % 3 == 2), rng);
    }
}

// 8 stages: 2190848 trees, about 8 s in a Release build (skipped under sanitizers, where the
// tests above still cover 1..6 stages).
TEST(ChainPlan, RotorEqualsExhaustiveSearchEightStages) {
  if (kSanitized) GTEST_SKIP() << "too slow under sanitizers";
  std::mt19937 rng(8);
  check_rotor_against_exhaustive_search(random_costs(rng, 8, 20, false), rng);
}

// (peak, time) of every tree with every subset of its top-level nodes offloaded (but a region
// whose input is a_0), each run through the simulator.
std::vector<Outcome> all_outcomes_with_offload(const ChainCosts& costs) {
  std::vector<Outcome> outcomes;
  const int stages = costs.num_stages();
  std::vector<PlanNode> current;
  enumerate_sequences(0, stages - 1, false, current, 0, [&](const std::vector<PlanNode>& tree) {
    std::vector<size_t> may;
    for (size_t k = 0; k < tree.size(); ++k)
      if (tree[k].kind == PlanNode::Kind::stage || tree[k].first > 0) may.push_back(k);
    for (size_t mask = 0; mask < (size_t{1} << may.size()); ++mask) {
      std::vector<PlanNode> variant = tree;
      for (size_t j = 0; j < may.size(); ++j)
        if (mask >> j & 1) variant[may[j]].offload();
      const rs::SimResult result = rs::simulate_actions(costs, rs::plan_actions(variant, stages));
      outcomes.push_back({result.peak_bytes, result.total_time});
    }
  });
  return outcomes;
}

TEST(ChainPlan, RotorWithOffloadEqualsExhaustiveSearch) {
  // Offload costs per byte that are exact in binary (times and sizes are small integers), from
  // free to dearer than any recomputation; with and without the gradient buffers counted.
  const std::vector<double> per_byte = {0.0, 0.25, 0.5, 2.0};
  const int largest = kSanitized ? 4 : 5;
  std::mt19937 rng(2026);
  for (int stages = 1; stages <= largest; ++stages)
    for (int instance = 0; instance < 8; ++instance) {
      ChainCosts costs = random_costs(rng, stages, 20, instance % 4 == 3);
      costs.offload_seconds_per_byte = per_byte[static_cast<size_t>(instance) % per_byte.size()];
      costs.gradients_counted = instance < 4;  // the second half: peaks of boundaries and records only
      SCOPED_TRACE(std::to_string(stages) + " stages, instance " + std::to_string(instance));
      const std::vector<Outcome> outcomes = all_outcomes_with_offload(costs);
      const size_t minimal = least_peak(outcomes);
      ASSERT_EQ(rs::min_feasible_memory(costs), minimal);
      ASSERT_EQ(rs::plan_min_memory(costs).predicted_peak_bytes, minimal);
      const size_t most = rs::plan_save_all(costs).predicted_peak_bytes;
      for (size_t limit = minimal; limit <= most; ++limit) {
        const Plan plan = rs::plan_rotor(costs, limit);  // sizes <= 20: the unit is one byte
        const rs::SimResult simulated = rs::simulate(costs, plan);
        ASSERT_LE(simulated.peak_bytes, limit);
        ASSERT_EQ(simulated.total_time, plan.predicted_time);
        ASSERT_EQ(plan.predicted_time, best_time_within(outcomes, static_cast<double>(limit)))
            << "limit " << limit << ", plan " << rs::format_tree(plan.tree);
      }
      if (minimal > costs.boundary_bytes[0]) EXPECT_THROW(rs::plan_rotor(costs, minimal - 1), rs::InfeasibleError);
    }
}

// With the writes queued behind the forward pass (costs.offload_write_seconds_per_byte), the
// programme prices each plan it builds exactly but keeps one plan per entry, so it is not always
// optimal (docs/planners.md, "the cost of a transfer"): its plans are never slower than the
// optimum of serial charging, never faster than the true optimum, and mostly the optimum.
TEST(ChainPlan, RotorWithQueuedWritesAgainstExhaustiveSearch) {
  const std::vector<double> per_byte = {0.25, 0.5, 1.0, 2.0};
  const int largest = kSanitized ? 4 : 5;
  std::mt19937 rng(4242);
  int limits = 0, optimal = 0, below_serial = 0;
  for (int stages = 1; stages <= largest; ++stages)
    for (int instance = 0; instance < 8; ++instance) {
      ChainCosts costs = random_costs(rng, stages, 20, instance % 4 == 3);
      costs.offload_seconds_per_byte = per_byte[static_cast<size_t>(instance) % per_byte.size()];
      costs.gradients_counted = instance < 4;
      SCOPED_TRACE(std::to_string(stages) + " stages, instance " + std::to_string(instance));
      const std::vector<Outcome> serial = all_outcomes_with_offload(costs);
      costs.offload_write_seconds_per_byte = costs.offload_seconds_per_byte * (instance % 2 == 0 ? 0.5 : 0.75);
      const std::vector<Outcome> queued = all_outcomes_with_offload(costs);
      const size_t minimal = least_peak(queued);
      ASSERT_EQ(rs::min_feasible_memory(costs), minimal);  // the peaks do not depend on the charge
      for (size_t limit = minimal; limit <= rs::plan_save_all(costs).predicted_peak_bytes; ++limit) {
        const Plan plan = rs::plan_rotor(costs, limit);
        const rs::SimResult simulated = rs::simulate(costs, plan);
        ASSERT_LE(simulated.peak_bytes, limit);
        const double best = best_time_within(queued, static_cast<double>(limit));
        const double best_serial = best_time_within(serial, static_cast<double>(limit));
        ASSERT_GE(plan.predicted_time, best) << rs::format_tree(plan.tree);
        ASSERT_LE(plan.predicted_time, best_serial) << rs::format_tree(plan.tree);
        ++limits;
        optimal += plan.predicted_time == best;
        below_serial += plan.predicted_time < best_serial;
      }
    }
  EXPECT_GT(below_serial, 0) << "no plan gained from its writes' window: the test would prove nothing";
  EXPECT_GE(optimal, limits * 95 / 100) << optimal << " of " << limits << " plans optimal";
  std::cout << optimal << " of " << limits << " plans optimal, " << below_serial << " faster than serial charging\n";
}

TEST(ChainPlan, OffloadCheaperThanRecomputingMakesFasterPlansAndIsPrintedAndSimulated) {
  // Four equal stages: every record is 100 bytes, boundaries 10; a limit halfway to save-all's.
  ChainCosts costs = ChainCosts::uniform(4, 1.0, 2.0, 10, 100);
  const size_t limit = (rs::min_feasible_memory(costs) + rs::plan_save_all(costs).predicted_peak_bytes) / 2;
  const Plan recomputing = rs::plan_rotor(costs, limit);
  EXPECT_GT(rs::simulate(costs, recomputing).recomputed_forwards, 0);
  costs.offload_seconds_per_byte = 0.001;  // 0.1 s per record: cheaper than recomputing one (1 s)
  const Plan plan = rs::plan_rotor(costs, limit);
  EXPECT_LT(plan.predicted_time, recomputing.predicted_time);
  EXPECT_LE(plan.predicted_peak_bytes, limit);
  EXPECT_NE(rs::format_tree(plan.tree).find("+o"), std::string::npos) << rs::format_tree(plan.tree);
  EXPECT_GT(rs::simulate(costs, plan).offloaded_bytes, 0u);
  costs.offload_seconds_per_byte = 10.0;  // dearer than recomputing: the same plan as without
  EXPECT_EQ(rs::plan_rotor(costs, limit).tree, recomputing.tree);
  costs.offload_seconds_per_byte = 0.001;
  // Fa0 O0 (record 0 leaves), ... I0 B0 (back before its backward): 210 bytes at Fa0, then 10.
  const std::vector<PlanNode> tree = {PlanNode::stage(0).offload(), PlanNode::stage(1), PlanNode::stage(2),
                                      PlanNode::stage(3)};
  EXPECT_EQ(rs::format_tree(tree), "S0+o S1 S2 S3");
  const std::vector<Action> actions = rs::plan_actions(tree, 4);
  EXPECT_EQ(rs::format_actions(actions), "Fa0 O0 Fa1 Fa2 Fa3 L B3 D3 B2 D2 B1 D1 I0 B0");
  const rs::SimResult offloaded = rs::simulate_actions(costs, actions);
  const rs::SimResult kept = rs::simulate(costs, rs::plan_save_all(costs));
  EXPECT_EQ(offloaded.peak_bytes, kept.peak_bytes - 100);
  EXPECT_DOUBLE_EQ(offloaded.total_time, kept.total_time + 0.1);
  EXPECT_EQ(offloaded.offloaded_bytes, 100u);
  // Offloading what is not there, twice, inside a region, a_0, or with no target, is refused.
  const auto refuses = [&](const std::vector<Action>& bad, const char* why) {
    try {
      rs::simulate_actions(costs, bad);
      ADD_FAILURE() << "accepted " << rs::format_actions(bad);
    } catch (const remat::Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refuses({{ActionKind::forward_save_all, 0}, {ActionKind::offload, 0}, {ActionKind::offload, 0}}, "offloaded already");
  refuses({{ActionKind::forward_save_all, 0}, {ActionKind::fetch, 0}}, "is not offloaded");
  refuses({{ActionKind::forward_no_save, 0}, {ActionKind::offload, 0}}, "a_0 is the caller's");
  refuses({{ActionKind::forward_no_save, 0}, {ActionKind::forward_no_save, 1}, {ActionKind::offload, 1},
           {ActionKind::forward_no_save, 1}},
          "offloaded (not fetched)");
  EXPECT_THROW(rs::validate_tree({PlanNode::region(0, 1, {PlanNode::stage(0).offload(), PlanNode::stage(1)}),
                                  PlanNode::stage(2), PlanNode::stage(3)}, 4),
               remat::Error);
  EXPECT_THROW(rs::validate_tree({PlanNode::region(0, 1, {PlanNode::stage(0), PlanNode::stage(1)}).offload(),
                                  PlanNode::stage(2), PlanNode::stage(3)}, 4),
               remat::Error);
  costs.offload_seconds_per_byte = -1;
  EXPECT_THROW(rs::simulate_actions(costs, actions), remat::Error);
  costs.offload_seconds_per_byte = std::nan("");
  EXPECT_THROW(costs.validate(), remat::Error);
}

TEST(ChainPlan, DiscretisationNeverExceedsTheLimitAndMeetsItsBound) {
  std::mt19937 rng(777);
  for (int instance = 0; instance < 40; ++instance) {
    const int stages = 1 + instance % 5;
    const ChainCosts costs = random_costs(rng, stages, 1000000000, false);
    const std::vector<Outcome> outcomes = all_outcomes(costs);
    const size_t minimal = least_peak(outcomes);
    const size_t most = rs::plan_save_all(costs).predicted_peak_bytes;
    std::uniform_int_distribution<size_t> between(minimal, most + most / 10);
    for (int slots : {2, 5, 17, 60}) {
      const size_t limit = between(rng);
      const Plan plan = rs::plan_rotor(costs, limit, slots);
      ASSERT_LE(rs::simulate(costs, plan).peak_bytes, limit);
      ASSERT_GE(plan.predicted_time, best_time_within(outcomes, static_cast<double>(limit)));
      // Proven: time <= OPT(limit - (2L + 2) * unit).
      const size_t available = limit - costs.boundary_bytes[0];
      const size_t unit = std::max<size_t>(1, (available + static_cast<size_t>(slots) - 1) / static_cast<size_t>(slots));
      const double reduced = static_cast<double>(limit) - static_cast<double>((2 * stages + 2) * unit);
      ASSERT_LE(plan.predicted_time, best_time_within(outcomes, reduced))
          << stages << " stages, limit " << limit << ", slots " << slots;
    }
  }
}

TEST(ChainPlan, LargerChainsStayWithinTheirLimits) {
  std::mt19937 rng(99);
  for (int instance = 0; instance < 8; ++instance) {
    const int stages = 10 + 3 * instance;
    const ChainCosts costs = random_costs(rng, stages, 1 << 20, false);
    const Plan save_all = rs::plan_save_all(costs);
    const Plan every_layer = rs::plan_every_layer(costs);
    const Plan segments = rs::plan_uniform_segments(costs, std::max(1, static_cast<int>(std::sqrt(stages))));
    for (const Plan* fixed : {&save_all, &every_layer, &segments}) {
      const rs::SimResult simulated = rs::simulate(costs, *fixed);
      ASSERT_EQ(simulated.peak_bytes, fixed->predicted_peak_bytes);
      // The planner given a fixed plan's peak does at least as well as that plan (up to the
      // discretisation: it may fall back to less memory, never to more).
      const Plan plan = rs::plan_rotor(costs, fixed->predicted_peak_bytes);
      ASSERT_LE(rs::simulate(costs, plan).peak_bytes, fixed->predicted_peak_bytes);
    }
    const size_t minimal = rs::min_feasible_memory(costs);
    std::uniform_int_distribution<size_t> between(minimal, save_all.predicted_peak_bytes);
    double previous = std::numeric_limits<double>::infinity();
    std::vector<size_t> limits = {minimal, between(rng), between(rng), save_all.predicted_peak_bytes};
    std::sort(limits.begin(), limits.end());
    for (size_t limit : limits) {
      const Plan plan = rs::plan_rotor(costs, limit);
      ASSERT_LE(rs::simulate(costs, plan).peak_bytes, limit);
      ASSERT_LE(plan.predicted_time, previous + 1e-9);  // more memory never costs time
      previous = plan.predicted_time;
    }
    // With twice the save-all peak nothing is recomputed: by the discretisation bound the time is
    // at most OPT(2P - (2L + 2) * unit) <= OPT(P) with unit ~ 2P / 500 and 4L + 4 <= 500.
    EXPECT_EQ(rs::plan_rotor(costs, 2 * save_all.predicted_peak_bytes).predicted_time, save_all.predicted_time);
  }
}

TEST(ChainPlan, InvalidInputsAreRejected) {
  ChainCosts costs = ChainCosts::uniform(3, 1.0, 1.0, 4, 4);
  ChainCosts broken = costs;
  broken.boundary_bytes.pop_back();
  EXPECT_THROW(rs::plan_rotor(broken, 1000), remat::Error);
  broken = costs;
  broken.forward_time[1] = -1;
  EXPECT_THROW(rs::plan_save_all(broken), remat::Error);
  EXPECT_THROW(rs::plan_rotor(costs, 1000, 0), remat::Error);

  // Trees: a gap, an overlap, a region whose only child is the same region, a wrong stage node.
  EXPECT_THROW(rs::validate_tree({PlanNode::stage(0), PlanNode::stage(2)}, 3), remat::Error);
  EXPECT_THROW(rs::validate_tree({PlanNode::stage(0), PlanNode::stage(1)}, 3), remat::Error);
  EXPECT_THROW(rs::validate_tree({PlanNode::region(0, 1, {PlanNode::stage(0), PlanNode::stage(1)}),
                                  PlanNode::stage(1), PlanNode::stage(2)},
                                 3),
               remat::Error);
  EXPECT_THROW(rs::validate_tree({PlanNode::region(0, 2, {PlanNode::region(0, 2, {PlanNode::stage(0), PlanNode::stage(1),
                                                                                  PlanNode::stage(2)})})},
                                 3),
               remat::Error);
  EXPECT_THROW(rs::validate_tree({PlanNode{PlanNode::Kind::stage, 0, 2, {}}}, 3), remat::Error);

  // Action lists.
  const auto rejects = [&](const std::string& why, std::vector<Action> actions) {
    EXPECT_THROW(rs::simulate_actions(costs, actions), remat::Error) << why;
  };
  using K = ActionKind;
  const std::vector<Action> good = rs::plan_save_all(costs).actions;
  EXPECT_NO_THROW(rs::simulate_actions(costs, good));
  rejects("no loss", {{K::forward_save_all, 0}, {K::forward_save_all, 1}, {K::forward_save_all, 2}, {K::backward, 2}});
  rejects("input dropped", {{K::forward_no_save, 0}, {K::drop, 1}, {K::forward_save_all, 1}});
  rejects("drop a_0", {{K::drop, 0}});
  rejects("backward out of order", {{K::forward_save_all, 0}, {K::forward_save_all, 1}, {K::forward_save_all, 2},
                                    {K::loss, 3}, {K::backward, 1}});
  rejects("backward without record", {{K::forward_no_save, 0}, {K::forward_no_save, 1}, {K::forward_save_all, 2},
                                      {K::loss, 3}, {K::backward, 2}, {K::backward, 1}});
  std::vector<Action> leaked = good;
  leaked.erase(std::find(leaked.begin(), leaked.end(), Action{K::drop, 1}));
  rejects("a boundary left live", leaked);
  std::vector<Action> truncated(good.begin(), good.end() - 1);
  rejects("missing the last backward", truncated);

  Plan mismatched = rs::plan_save_all(costs);
  mismatched.actions = rs::plan_every_layer(costs).actions;
  EXPECT_THROW(rs::simulate(costs, mismatched), remat::Error);
}

}  // namespace

// A record that holds its stage's output (saved_output_bytes) shares those bytes with the
// boundary while both are in memory (Note [a record that keeps its output], simulate.cpp). Three
// stages, every boundary and record 100 bytes, each record being its stage's output: save-all
// holds a_0 and the three outputs, 400 bytes (700 when counted twice). Offloading record 1 frees
// nothing while a_2 holds the same bytes; a region's input offloaded while the record before it
// is in memory frees nothing either. Sizes above the record or the output are refused.
TEST(ChainSim, ARecordThatHoldsItsOutputIsCountedOnce) {
  ChainCosts c = ChainCosts::uniform(3, 1.0, 1.0, 100, 100);
  c.gradients_counted = false;
  EXPECT_EQ(rs::plan_save_all(c).predicted_peak_bytes, 700u);
  c.saved_output_bytes = {100, 100, 100};
  EXPECT_EQ(rs::plan_save_all(c).predicted_peak_bytes, 400u);
  c.offload_seconds_per_byte = 0;
  std::vector<PlanNode> tree = {PlanNode::stage(0), PlanNode::stage(1), PlanNode::stage(2)};
  tree[1].offloaded = true;
  EXPECT_EQ(rs::make_plan(c, tree).predicted_peak_bytes, 400u);
  // S0 R[1..2](S1 S2)+o: a_1 goes out, but record 0 still holds it (re-run: a_0, a_1, two outputs)
  std::vector<PlanNode> region = {PlanNode::stage(0),
                                  PlanNode::region(1, 2, {PlanNode::stage(1), PlanNode::stage(2)})};
  region[1].offloaded = true;
  EXPECT_EQ(rs::make_plan(c, region).predicted_peak_bytes, 400u);
  c.saved_output_bytes = {100, 101, 100};
  EXPECT_THROW(c.validate(), remat::Error);
  c.saved_output_bytes = {100, 100};
  EXPECT_THROW(c.validate(), remat::Error);
}
