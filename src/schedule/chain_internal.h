// Internal to the schedule layer's chain files.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "remat/error.h"
#include "remat/schedule.h"

namespace remat::schedule {

// Throws remat::Error "FUNCTION: WHY": an invalid argument of a chain function.
[[noreturn]] inline void invalid(const std::string& function, const std::string& why) {
  throw Error(function + ": " + why);
}

// Throws remat::Error naming the first option out of its range.
void check_options(const ChainPlanOptions& options);
// The threads options.threads asks for (0: the hardware's cores).
int planning_threads(const ChainPlanOptions& options);
// Whether plan_chain runs the exact programme (plan_rotor) for this chain and these options.
bool runs_exact(const ChainCosts& costs, const ChainPlanOptions& options);
// The levels of groups above the stages of the grouped planner's top parts (ChainPlan::levels).
int grouped_levels(int stages, const ChainPlanOptions& options);
// Whether the exact least-peak plan (plan_min_memory) is cheap next to the grouped planner.
bool least_peak_is_cheap(int stages, const ChainPlanOptions& options);

// Every plan plan_rotor's programme makes at a memory level of its table for memory_limit (the same
// units as plan_rotor(costs, memory_limit, slots)): the plan of each level whose least time differs
// from the level below's, in rising levels; with reads ahead and an offload target, those of the
// programme that prices reads in full after them. Plans within memory_limit's units, each made
// in the table's count; the caller simulates them.
std::vector<std::vector<PlanNode>> rotor_plans_below(const ChainCosts& costs, size_t memory_limit, int slots);

// The grouped planner's plans at limits that depend on the chain alone: its least-peak plans, and
// for each anchor (save-all's peak, half of it, ... down to their least peak) the plans of its
// top-level programme at every 1/64 of the anchor's levels (up to 8,192 stages; fewer above, down
// to every 1/8), from the anchor's down, where the least time changes. Its group menus are built
// once. Each plan goes to `sink` as it is made (those of a long chain would not all fit in memory
// at once).
void grouped_plans_at_anchors(const ChainCosts& costs, const ChainPlanOptions& options,
                              const std::function<void(std::vector<PlanNode>)>& sink);

}  // namespace remat::schedule
