// Helpers of the planner and budget tests: falling limits, plans checked within their limits, and
// the smallest budget a budget policy's refusal names.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <regex>
#include <string>
#include <vector>

#include "remat/error.h"
#include "remat/schedule.h"
#include "schedule/chain_internal.h"

namespace remat::testing {

// `count` limits from `high` down to `low`, evenly spaced, both included.
inline std::vector<size_t> falling(size_t low, size_t high, int count) {
  std::vector<size_t> out;
  for (int k = 0; k < count; ++k)
    out.push_back(high - (high - low) * static_cast<size_t>(k) / static_cast<size_t>(count - 1));
  return out;
}

// Plans `costs` with the exact and the grouped planner (3 top parts, groups of 3) at 6 limits from
// each one's smallest up to save-all's peak: each plan's prediction is within its limit and is its
// simulation (plan_chain also checks this and would throw). Returns how many plans it checked.
inline int expect_plans_within_their_limits(const remat::schedule::ChainCosts& costs) {
  namespace rs = remat::schedule;
  rs::ChainPlanOptions grouped;
  grouped.method = rs::RotorMethod::grouped;
  grouped.top_parts = 3;
  grouped.group = 3;
  const size_t high = rs::plan_save_all(costs).predicted_peak_bytes;
  int plans = 0;
  for (const rs::ChainPlanOptions& options : {rs::ChainPlanOptions{}, grouped})
    for (size_t limit : falling(rs::chain_min_feasible_memory(costs, options), high, 6)) {
      SCOPED_TRACE(::testing::Message() << (plans < 6 ? "automatic" : "grouped") << ", limit " << limit);
      const rs::ChainPlan chosen = rs::plan_chain(costs, limit, options);
      EXPECT_LE(chosen.plan.predicted_peak_bytes, limit);
      EXPECT_EQ(rs::simulate(costs, chosen.plan).peak_bytes, chosen.plan.predicted_peak_bytes);
      ++plans;
    }
  return plans;
}

// Runs `step`, which a budget policy should refuse: the smallest budget its refusal names (0 and
// a test failure where it ran or said something else).
inline size_t smallest_budget_refused(const std::function<void()>& step) {
  try {
    step();
  } catch (const remat::Error& e) {
    std::smatch m;
    const std::string what = e.what();
    if (std::regex_search(what, m, std::regex("smallest feasible budget for [^:]*: ([0-9]+) bytes")))
      return std::stoull(m[1].str());
    ADD_FAILURE() << what;
    return 0;
  }
  ADD_FAILURE() << "the step was not refused";
  return 0;
}

}  // namespace remat::testing
