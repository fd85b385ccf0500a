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

// ---- The planners behind ChainPlanner (remat/schedule.h), for the schedule layer, its tests and
// benchmarks; the library and the command line plan through ChainPlanner.

// The least-time plan within memory_limit bytes, by the rotor dynamic programme over sizes
// rounded up to units of about memory_limit / slots bytes (slots >= 1). The plan never exceeds
// memory_limit, and is exactly optimal when the unit is one byte (docs/planners.md, "rotor": the
// bound otherwise, and the cost, O(L^2 * slots) memory and O(L^3 * slots) time).
// When costs.can_offload(), each top-level node may also be offloaded, at its kept bytes' read
// and the stall of its queued write ("the cost of a transfer" in docs/planners.md: with queued
// writes the programme prices every plan exactly but may miss the optimum); the least peak then
// counts offloading too. The read is priced in full, or with reads_ahead at its stall behind the
// next top-level node's backward where that node is a stage and the loss's live bytes leave room
// for the read during it: never below simulate's stall (which may find a longer window). With
// reads_ahead it also plans with full reads and returns whichever plan simulate prices lower.
// The returned plan's predicted_time is simulate's.
// Throws InfeasibleError if memory_limit < min_feasible_memory(costs).
Plan plan_rotor(const ChainCosts& costs, size_t memory_limit, int slots = 500);
// The least peak (exact bytes, a_0 included) of any plan, and a plan that attains it (least
// time among the least-peak choices of each subproblem).
size_t min_feasible_memory(const ChainCosts& costs);
Plan plan_min_memory(const ChainCosts& costs);

// plan_chain: rotor for chains of any length. Below a work threshold it is plan_rotor itself
// (method exact); above it, the grouped planner: the chain is cut into top_parts parts, grouped
// recursively into groups of at most `group` parts; each group offers a few sub-plans (time,
// bytes kept, peaks) from a rotor-like programme over its parts, and the top-level programme
// chooses among them under the limit (docs/planners.md, "Long chains": the algorithm,
// O(L * group^2 * group_slots) time, and its measured cost in optimality). Both return a plan
// that simulate() keeps within memory_limit. With costs.can_offload(), both offload: the grouped
// planner offers keep, recompute and offload for every stage and region of its top-level
// sequences at any depth of its groups (a group's top-level plan spliced in), with the exact
// programme's cost model (a read with reads_ahead as plan_rotor prices it, the loss's bytes it
// counts on inside a group being the group's own); an offload target never raises its least peak.
// The grouped planner throws InfeasibleError only when memory_limit is below the least peak it
// can reach (carried in the error; at least min_feasible_memory, and above it on some chains).
// Below its own least peak it returns the exact least-peak plan (plan_min_memory) when that
// fits and L^3 / 6 is at most exact_max_work (then method is exact): the least peak of
// such chains is min_feasible_memory.
ChainPlan plan_chain(const ChainCosts& costs, size_t memory_limit, const ChainPlanOptions& options = {});
// The least memory_limit from which plan_chain plans with these options: min_feasible_memory(costs)
// when it runs the exact programme or the chain's least peak is cheap (one byte less is refused),
// else the least peak of the grouped planner's fixed-scale programme, which it plans once to find
// (progress as plan_chain reports it). Every limit from it up is planned; a slightly smaller one may be too (finer units).
size_t chain_min_feasible_memory(const ChainCosts& costs, const ChainPlanOptions& options = {});
// plan_chain within memory_limit as `held` counts the peak: the same chain with
// boundaries_counted_when_held, swept_values and gap_saved, as an allocator counts saved bytes (the
// planners ignore them; held's chain output x[L] may be smaller than planning's, where the
// planning costs count what the ops between stages save with it, on the safe side). The fastest,
// as held, of the planners' plans for a set of limits that depends on the chain alone (save-all's
// peak, half of it, ... down to the least, and memory levels below each) whose held peak fits, so
// at any length the prediction never rises as the limit falls. The returned plan's predictions
// are held's. InfeasibleError below chain_min_feasible_memory_held (the least held peak of those
// plans), from which every limit is planned. For a budget plan in memory (remat/budget.h).
ChainPlan plan_chain_held(const ChainCosts& planning, const ChainCosts& held, size_t memory_limit,
                          const ChainPlanOptions& options = {});
// `held` with `offload`'s target: its price per byte, its writes' share and its reads ahead.
ChainCosts held_with_target(const ChainCosts& held, const ChainCosts& offload);
// A budget plan with an offload target: plan_chain_held with `offload` (the costs priced for the
// target) and held_with_target(held, offload), so its predictions count as an allocator does, an
// offloaded record's input included; below its smallest limit, plan_chain_held in memory (the
// same chain without the target, its output as `held` counts it), which offloads nothing, where
// that fits; `in_memory` says which. InfeasibleError names the smaller of the two smallest limits.
ChainPlan plan_chain_offload_or_held(const ChainCosts& offload, const ChainCosts& held, size_t memory_limit,
                                     const ChainPlanOptions& options, bool& in_memory);
size_t chain_min_feasible_memory_held(const ChainCosts& planning, const ChainCosts& held,
                                      const ChainPlanOptions& options = {});
// The least limit from which plan_chain_offload_or_held plans (the smaller of its two floors).
size_t chain_min_feasible_memory_offload_or_held(const ChainCosts& offload, const ChainCosts& held,
                                                 const ChainPlanOptions& options = {});

}  // namespace remat::schedule
