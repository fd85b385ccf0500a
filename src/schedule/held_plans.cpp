// Budget plans counted as an allocator counts saved bytes: plan_chain_held, in memory and with an
// offload target, and their smallest limits.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "chain_internal.h"
#include "remat/error.h"
#include "remat/schedule.h"

namespace remat::schedule {

namespace {

// plan_chain_held's two costs must describe one chain.
void check_held(const ChainCosts& planning, const ChainCosts& held) {
  held.validate();
  planning.validate();
  const size_t n = planning.boundary_bytes.size();
  if (held.boundary_bytes.size() != n || held.saved_bytes != planning.saved_bytes ||
      held.forward_time != planning.forward_time || held.backward_time != planning.backward_time ||
      !std::equal(held.boundary_bytes.begin(), held.boundary_bytes.end() - 1, planning.boundary_bytes.begin()) ||
      held.boundary_bytes.back() > planning.boundary_bytes.back())
    throw Error("plan_chain_held: the held costs are not the planning costs' chain (their sizes or times differ, or "
                "the held chain output is larger)");
}

// The planning costs with the input each offloaded record takes along (Note [a record that keeps
// its input] in simulate.cpp). The planners count a record's output apart from the next boundary (the
// same bytes, twice), so crediting the whole input is exact where record i - 1 keeps it in memory.
ChainCosts with_input_credits(const ChainCosts& planning, const ChainCosts& held) {
  ChainCosts out = planning;
  out.saved_input_bytes = held.saved_input_bytes;
  return out;
}

// The same chain without the target, its output as `held` counts it (an in-memory budget plan's).
ChainCosts without_target(const ChainCosts& offload, const ChainCosts& held) {
  ChainCosts memory = offload;
  memory.offload_seconds_per_byte = -1;
  memory.offload_write_seconds_per_byte = 0;
  memory.reads_ahead = false;
  memory.saved_input_bytes.clear();
  memory.boundary_bytes.back() = held.boundary_bytes.back();
  return memory;
}

// Note [a prediction that never rises]. The planners count a boundary from the forward that makes
// it and a record's output again as the next stage's input; the held count does neither (Note
// [plans within the allocator's count] below). So a plan made within a larger limit can fit a
// smaller one as held although the planners would not make it there, and the plan they do make
// there can hold more: the prediction would rise as the limit falls. So plan_chain_held chooses
// from candidates that do not depend on the limit, each simulated as held: save-all, the
// least-peak plan (where plan_chain would reach for it), and plans made at anchors: save-all's
// peak, half of it, a quarter, ... down to the chain's least peak. Where plan_chain runs the exact
// programme, the anchors' tables give a plan for every memory level below them (rotor_plans_below);
// on the grouped planner's chains, its top-level programme gives one at every 1/64 of each
// anchor's levels, over group menus built once (grouped_plans_at_anchors). It takes the fastest
// candidate whose held peak fits the limit, the one of least held peak among equally fast ones. A
// smaller limit has fewer candidates to choose from, so its choice is slower, or as fast and of no
// larger peak: the prediction never rises as the limit falls. The table whose limit is the least
// anchor at or above L has units at most about twice those of a plan made at L (an anchor's bytes
// over the slots), and the plans of its levels above L are candidates where their held peak fits
// it. Above kFixedCandidatesMaxStages stages (the grouped planner's candidates cost about 9-11
// plans' time, about 1 s a limit at 2,000 stages) plan_chain_held keeps the plans made within the
// limit; there the property is observed, not guaranteed.
constexpr int kFixedCandidatesMaxStages = 4096;

struct Candidate {
  std::vector<PlanNode> tree;
  double time = 0;
  size_t peak = 0;
  bool grouped = false;  // made by the grouped planner
};

size_t least_peak(const std::vector<Candidate>& candidates) {
  size_t least = SIZE_MAX;
  for (const Candidate& c : candidates) least = std::min(least, c.peak);
  return least;
}

std::vector<Candidate> held_candidates(const ChainCosts& planning, const ChainCosts& held,
                                       const ChainPlanOptions& options) {
  std::vector<Candidate> out;
  const auto add = [&](std::vector<PlanNode> tree, bool grouped = false) {
    Plan plan = make_plan(held, std::move(tree));
    out.push_back(Candidate{std::move(plan.tree), plan.predicted_time, plan.predicted_peak_bytes, grouped});
  };
  const Plan save_all = plan_save_all(planning);
  add(save_all.tree);
  if (!runs_exact(planning, options)) {
    for (std::vector<PlanNode>& tree : grouped_plans_at_anchors(planning, options)) add(std::move(tree), true);
    // as plan_grouped: the exact least-peak plan, where it is cheap, only below the grouped least
    if (least_peak_is_cheap(planning.num_stages(), options)) {
      const size_t grouped_least = least_peak(out);
      add(plan_min_memory(planning).tree);
      if (out.back().peak >= grouped_least) out.pop_back();
    }
    return out;
  }
  const Plan least_plan = plan_min_memory(planning);  // its peak is min_feasible_memory's
  add(least_plan.tree);
  const size_t least = least_plan.predicted_peak_bytes;
  for (size_t anchor = save_all.predicted_peak_bytes;; anchor /= 2) {
    for (std::vector<PlanNode>& tree : rotor_plans_below(planning, std::max(anchor, least), options.slots))
      add(std::move(tree));
    if (anchor <= least) break;
  }
  return out;
}

// Whether plan_chain_held chooses from fixed candidates (Note [a prediction that never rises]).
bool fixed_candidates(const ChainCosts& planning, const ChainPlanOptions& options) {
  return runs_exact(planning, options) || planning.num_stages() <= kFixedCandidatesMaxStages;
}

// The fastest candidate whose held peak fits `limit`, of least peak among equally fast ones.
const Candidate* fastest_within(const std::vector<Candidate>& candidates, size_t limit) {
  const Candidate* best = nullptr;
  for (const Candidate& c : candidates)
    if (c.peak <= limit && (!best || c.time < best->time || (c.time == best->time && c.peak < best->peak)))
      best = &c;
  return best;
}

ChainPlan plan_fixed_held(const ChainCosts& planning, const ChainCosts& held, size_t limit,
                          const ChainPlanOptions& options) {
  const std::vector<Candidate> candidates = held_candidates(planning, held, options);
  const Candidate* best = fastest_within(candidates, limit);
  if (!best) {
    const size_t least = least_peak(candidates);
    throw InfeasibleError("plan_chain: memory limit " + std::to_string(limit) + " bytes is below the least peak " +
                              std::to_string(least) + " bytes of any plan, counted as held",
                          least);
  }
  ChainPlan chosen;
  chosen.plan = make_plan(held, best->tree);
  if (best->grouped) {
    chosen.method = RotorMethod::grouped;
    chosen.levels = grouped_levels(planning.num_stages(), options);
  }
  return chosen;
}

}  // namespace

// Note [plans within the allocator's count]. The planners count every boundary from the forward
// that makes it, and nothing a region's sweep keeps (ChainCosts::swept_values). An allocator
// counts a boundary only while a saved value holds it (Note [boundaries counted while held] in
// simulate.cpp: a region's forward sweep and a re-run's last output are temporaries) and a record's
// output once (Note [a record that keeps its output]), but it also counts what a sweep keeps: the
// token ids, a position embedding, a constant bias (measured by the budget policy: Note [what a
// sweep keeps] in src/checkpoint/budget.cpp). So plan_chain_held predicts a plan with the held
// costs, which count as an allocator does. Up to kFixedCandidatesMaxStages stages it chooses
// among fixed candidates, each simulated as held (Note [a prediction that never rises] above), from
// the least held peak among them up. On longer chains it makes a plan whose held peak is above the
// limit again within the limit less the excess, at most three more times, the last within the
// chain's least peak. A limit below the least peak gets the plan made within the least peak where
// its held peak fits. So the smallest limit it plans from is that plan's held peak
// (chain_min_feasible_memory_held): below the least peak where the planners count more than is
// held (a boundary made and dropped in a re-run). Every limit from it up is planned; where swept
// values lift that plan above the least peak, a limit between the two may be planned too (another
// plan's held peak may fit it). Without swept and gap values the held count is never above the
// planners', so the first plan made within a limit stands.
ChainPlan plan_chain_held(const ChainCosts& planning, const ChainCosts& held, size_t limit,
                          const ChainPlanOptions& options) {
  check_held(planning, held);
  if (fixed_candidates(planning, options)) return plan_fixed_held(planning, held, limit, options);
  ChainPlan chosen;
  std::optional<size_t> least;
  try {
    chosen = plan_chain(planning, limit, options);
  } catch (const InfeasibleError&) {  // below the planners' least peak: their least plan, if held fits it
    least = chain_min_feasible_memory(planning, options);
    chosen = plan_chain(planning, *least, options);
  }
  chosen.plan = make_plan(held, std::move(chosen.plan.tree));
  size_t within = least ? *least : limit;
  for (int tries = 0; chosen.plan.predicted_peak_bytes > limit; ++tries) {
    if (!least) least = chain_min_feasible_memory(planning, options);
    if (within <= *least)
      throw InfeasibleError("plan_chain: memory limit " + std::to_string(limit) + " bytes is below the least peak " +
                                std::to_string(chosen.plan.predicted_peak_bytes) + " bytes of any plan, counted as held",
                            chosen.plan.predicted_peak_bytes);
    const size_t over = chosen.plan.predicted_peak_bytes - limit;
    within = tries >= 2 || within - *least <= over ? *least : within - over;
    chosen = plan_chain(planning, within, options);
    chosen.plan = make_plan(held, std::move(chosen.plan.tree));
  }
  return chosen;
}

ChainCosts held_with_target(const ChainCosts& held, const ChainCosts& offload) {
  ChainCosts out = held;
  out.offload_seconds_per_byte = offload.offload_seconds_per_byte;
  out.offload_write_seconds_per_byte = offload.offload_write_seconds_per_byte;
  out.reads_ahead = offload.reads_ahead;
  return out;
}

ChainPlan plan_chain_offload_or_held(const ChainCosts& offload, const ChainCosts& held, size_t limit,
                                     const ChainPlanOptions& options, bool& in_memory) {
  in_memory = false;
  try {
    return plan_chain_held(with_input_credits(offload, held), held_with_target(held, offload), limit, options);
  } catch (const InfeasibleError& e) {
    try {
      ChainPlan chosen = plan_chain_held(without_target(offload, held), held, limit, options);
      in_memory = true;
      return chosen;
    } catch (const InfeasibleError& f) {
      throw InfeasibleError(e.what(), std::min(e.min_feasible_bytes, f.min_feasible_bytes));
    }
  }
}

size_t chain_min_feasible_memory_offload_or_held(const ChainCosts& offload, const ChainCosts& held,
                                                 const ChainPlanOptions& options) {
  return std::min(chain_min_feasible_memory_held(with_input_credits(offload, held), held_with_target(held, offload), options),
                  chain_min_feasible_memory_held(without_target(offload, held), held, options));
}

size_t chain_min_feasible_memory_held(const ChainCosts& planning, const ChainCosts& held, const ChainPlanOptions& options) {
  check_held(planning, held);
  if (fixed_candidates(planning, options)) return least_peak(held_candidates(planning, held, options));
  const size_t least = chain_min_feasible_memory(planning, options);
  return make_plan(held, plan_chain(planning, least, options).plan.tree).predicted_peak_bytes;
}

}  // namespace remat::schedule
