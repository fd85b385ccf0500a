// Tests of the schedule layer's uniform chains: Revolve against its closed form and Griewank's
// recurrence, and the online checkpointer against its bound (docs/planners.md). Heterogeneous
// chains: test_schedule_chain.cpp.
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

namespace rs = remat::schedule;
using rs::RevolveAction;

namespace {

// ---------------------------------------------------------------- Revolve

// Griewank's recurrence for the least forward-step count, independent of the closed form:
// t(0 or 1, s) = 0, t(l, 1) = l(l-1)/2, t(l, s) = min_{0<m<l} m + t(l-m, s-1) + t(m, s).
std::vector<std::vector<int64_t>> recurrence_table(int max_steps, int max_slots) {
  std::vector<std::vector<int64_t>> t(static_cast<size_t>(max_slots) + 1,
                                      std::vector<int64_t>(static_cast<size_t>(max_steps) + 1, 0));
  for (int s = 1; s <= max_slots; ++s)
    for (int l = 2; l <= max_steps; ++l) {
      if (s == 1) {
        t[1][l] = int64_t{l} * (l - 1) / 2;
        continue;
      }
      int64_t best = std::numeric_limits<int64_t>::max();
      for (int m = 1; m < l; ++m) best = std::min(best, m + t[s - 1][l - m] + t[s][m]);
      t[s][l] = best;
    }
  return t;
}

TEST(Revolve, BinomialBeta) {
  EXPECT_EQ(rs::binomial_beta(0, 0), 1u);
  EXPECT_EQ(rs::binomial_beta(3, 0), 1u);
  EXPECT_EQ(rs::binomial_beta(1, 4), 5u);
  EXPECT_EQ(rs::binomial_beta(2, 3), 10u);
  EXPECT_EQ(rs::binomial_beta(5, 5), 252u);
  EXPECT_EQ(rs::binomial_beta(3, -1), 0u);
  EXPECT_EQ(rs::binomial_beta(30, 30), 118264581564861424u);
  EXPECT_EQ(rs::binomial_beta(100, 100), UINT64_MAX);  // saturates
}

TEST(Revolve, RepetitionNumberAndClosedForm) {
  EXPECT_EQ(rs::revolve_repetition_number(0, 3), 0);
  EXPECT_EQ(rs::revolve_repetition_number(1, 3), 0);
  EXPECT_EQ(rs::revolve_repetition_number(4, 3), 1);   // beta(3, 1) = 4
  EXPECT_EQ(rs::revolve_repetition_number(5, 3), 2);   // beta(3, 2) = 10
  EXPECT_EQ(rs::revolve_repetition_number(10, 3), 2);
  EXPECT_EQ(rs::revolve_repetition_number(11, 3), 3);
  EXPECT_EQ(rs::revolve_repetition_number(7, 1), 6);
  EXPECT_EQ(rs::revolve_optimal_forward_steps(7, 1), 21);     // n(n-1)/2
  EXPECT_EQ(rs::revolve_optimal_forward_steps(10, 9), 9);     // store-all: n - 1
  EXPECT_EQ(rs::revolve_optimal_forward_steps(10, 3), 2 * 10 - 5);  // r = 2, beta(4, 1) = 5
  EXPECT_EQ(rs::revolve_optimal_forward_steps(1000000, 20), 8 * 1000000 - 1184040);  // r = 8, beta(21, 7) = C(28, 7)
  EXPECT_THROW(rs::revolve_optimal_forward_steps(5, 0), remat::Error);
  EXPECT_THROW(rs::revolve_optimal_forward_steps(-1, 2), remat::Error);

  // The closed form equals the recurrence over the grid.
  const auto t = recurrence_table(200, 10);
  for (int s = 1; s <= 10; ++s)
    for (int n = 0; n <= 200; ++n)
      ASSERT_EQ(rs::revolve_optimal_forward_steps(n, s), t[s][n]) << "n=" << n << " s=" << s;
}

TEST(Revolve, SchedulesAreValidAndOptimalOnTheGrid) {
  for (int s = 1; s <= 10; ++s)
    for (int n = 0; n <= 200; ++n) {
      const std::vector<RevolveAction> schedule = rs::revolve_schedule(n, s);
      const rs::RevolveReplay replay = rs::replay_revolve(schedule, n, s);
      ASSERT_EQ(replay.forward_steps, rs::revolve_optimal_forward_steps(n, s)) << "n=" << n << " s=" << s;
      ASSERT_LE(replay.slots_used, s);
      if (n > 0) {
        ASSERT_EQ(schedule.front(), (RevolveAction{RevolveAction::Kind::takeshot, 0, 0}));
        ASSERT_EQ(schedule.back(), (RevolveAction{n == 1 ? RevolveAction::Kind::firsturn : RevolveAction::Kind::youturn, 0, -1}));
      }
    }
}

TEST(Revolve, SmallScheduleIsTheTextbookOne) {
  // n = 3, s = 1: walk from x0 each time.
  const std::vector<RevolveAction> schedule = rs::revolve_schedule(3, 1);
  std::string text;
  for (const RevolveAction& action : schedule) text += rs::to_string(action) + "; ";
  EXPECT_EQ(text,
            "takeshot(x0 -> slot 0); advance(2); firsturn(2); restore(slot 0 = x0); advance(1); youturn(1); "
            "restore(slot 0 = x0); youturn(0); ");
}

TEST(Revolve, ReplayerRejectsInvalidSchedules) {
  using K = RevolveAction::Kind;
  const auto rejects = [](std::vector<RevolveAction> schedule, int64_t n, int s) {
    EXPECT_THROW(rs::replay_revolve(schedule, n, s), remat::Error);
  };
  rejects({{K::restore, 0, 0}, {K::firsturn, 0, -1}}, 1, 1);                    // empty slot
  rejects({{K::takeshot, 0, 1}, {K::firsturn, 0, -1}}, 1, 1);                   // slot out of range
  rejects({{K::takeshot, 0, 0}, {K::advance, 1, -1}, {K::firsturn, 1, -1}}, 3, 1);  // wrong first turn
  rejects({{K::takeshot, 0, 0}, {K::advance, 1, -1}, {K::firsturn, 1, -1}}, 2, 1);  // step 0 never reversed
  rejects({{K::takeshot, 0, 0}, {K::advance, 3, -1}}, 2, 1);                    // beyond x_n
  rejects({{K::takeshot, 0, 0}, {K::advance, 1, -1}, {K::firsturn, 1, -1}, {K::youturn, 0, -1}}, 2, 1);  // not at x0
  rejects({{K::takeshot, 0, 0}, {K::youturn, 0, -1}}, 1, 1);                    // first turn must be firsturn
  EXPECT_NO_THROW(rs::replay_revolve({{K::takeshot, 0, 0}, {K::firsturn, 0, -1}}, 1, 1));
}

// ---------------------------------------------------------------- online

TEST(Online, WithinBoundForAllLengthsUpTo2000) {
  for (int s : {1, 2, 3, 4, 6, 10}) {
    rs::OnlineCheckpointer online(s);
    double worst_ratio = 0;
    for (int64_t n = 1; n <= 2000; ++n) {
      const rs::OnlineCheckpointer::Decision decision = online.on_step();
      if (decision.take_snapshot) ASSERT_TRUE(decision.slot >= 0 && decision.slot < s);
      ASSERT_EQ(online.steps(), n);
      ASSERT_LE(online.snapshots().size(), static_cast<size_t>(s));
      if (n > 300 && n % 7 != 0 && n != 2000) continue;  // every length up to 300, then a sample
      const rs::RevolveReplay replay = rs::replay_revolve(online.full_schedule(), n, s);
      const int64_t offline = rs::revolve_optimal_forward_steps(n, s);
      ASSERT_LE(replay.forward_steps, n + offline) << "n=" << n << " s=" << s;   // the stated bound
      ASSERT_GE(replay.forward_steps, offline + 1) << "n=" << n << " s=" << s;   // sanity: offline is optimal
      ASSERT_LE(replay.slots_used, s);
      if (n <= s) ASSERT_EQ(replay.forward_steps, n);
      if (offline > 0) worst_ratio = std::max(worst_ratio, static_cast<double>(replay.forward_steps) / offline);
    }
    std::printf("online s=%d: worst forward steps / offline optimum over sampled n <= 2000: %.3f\n", s,
                worst_ratio);
  }
}

TEST(Online, ReverseStartsFromHeldSnapshots) {
  rs::OnlineCheckpointer online(3);
  std::vector<int64_t> taken;
  for (int i = 0; i < 9; ++i)
    if (online.on_step().take_snapshot) taken.push_back(online.steps() - 1);
  // Spacing 1 holds 0, 1, 2; at 3 it doubles to 2 (keeps 0, 2) and 4 is taken; at 6 it doubles
  // to 4 (keeps 0, 4) and 8 is taken.
  EXPECT_EQ(taken, (std::vector<int64_t>{0, 1, 2, 4, 8}));
  const auto held = online.snapshots();
  ASSERT_EQ(held.size(), 3u);
  EXPECT_EQ(held[0].first, 0);
  EXPECT_EQ(held[1].first, 4);
  EXPECT_EQ(held[2].first, 8);
  const rs::RevolveReplay replay = rs::replay_revolve(online.full_schedule(), 9, 3);
  EXPECT_LE(replay.forward_steps, 9 + rs::revolve_optimal_forward_steps(9, 3));
  EXPECT_THROW(rs::OnlineCheckpointer(0), remat::Error);
}

}  // namespace
