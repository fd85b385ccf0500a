// The examples of include/remat/schedule.h: Revolve, the rotor plan of a 3-stage chain (with the
// numbers the comments state), the chain planner with a held count and online checkpointing.
#include <gtest/gtest.h>

#include <cassert>
#include <iostream>

#include "remat/schedule.h"

TEST(ScheduleH, Examples) {
REMAT_EXAMPLE(include/remat/schedule.h: namespace rs = remat::schedule;)
REMAT_EXAMPLE(include/remat/schedule.h: // Uniform loop of n = 100 steps)
  EXPECT_EQ(replay.forward_steps, rs::revolve_optimal_forward_steps(100, 5));  // the assert, in Release too
REMAT_EXAMPLE(include/remat/schedule.h: // Heterogeneous chain of 3 stages)
  EXPECT_EQ(planner.smallest_limit(), 4928u);
  EXPECT_EQ(planner.least_planned_peak(), 4928u);
  EXPECT_EQ(rs::simulate(costs, planner.plan(1 << 20).plan).peak_bytes, 6480u);  // save-all
  EXPECT_THROW(planner.plan(4927), rs::InfeasibleError);
  EXPECT_EQ(check.peak_bytes, 5440u);
  EXPECT_EQ(regions, 1);
  EXPECT_EQ(rs::format_tree(plan.tree), "S0 R[1..1](S1) S2");
  EXPECT_EQ(rs::format_actions(plan.actions), "Fa0 Fn1 Fa2 L B2 D2 Fa1 D2 B1 D1 B0");
  {
REMAT_EXAMPLE(include/remat/schedule.h: rs::ChainCosts held = costs;)
  EXPECT_LE(least, 4928u);  // the held count of a boundary is never above the planners'
  EXPECT_LE(chosen.plan.predicted_peak_bytes, least + 512);
  EXPECT_EQ(rs::simulate(held, chosen.plan).peak_bytes, chosen.plan.predicted_peak_bytes);
  EXPECT_THROW(planner.plan(least - 1), rs::InfeasibleError);
  }

  // a loop that ends after 20 steps, its state a number; save() keeps it in a slot
  bool done = false;
  int64_t state = 0;
  std::vector<int64_t> slots(4, -1);
  auto save = [&](int64_t value, int slot) { slots.at(static_cast<size_t>(slot)) = value; };
  auto step = [&] { done = ++state == 20; };
REMAT_EXAMPLE(include/remat/schedule.h: // Loop of unknown length with 4 slots)
  EXPECT_EQ(online.steps(), 20);
  for (const auto& [index, slot] : online.snapshots()) EXPECT_EQ(slots.at(static_cast<size_t>(slot)), index);
  const rs::RevolveReplay replay_online = rs::replay_revolve(online.full_schedule(), 20, 4);  // validates it
  EXPECT_FALSE(reverse.empty());
  EXPECT_GE(replay_online.forward_steps, 20);
}
