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
// larger peak: the prediction never rises as the limit falls. Only the candidates that some limit
// chooses are kept (choosable: by rising held peak, each faster than all before it), once per
// chain in a HeldPlans, which then answers any limit with a search. The table whose limit is the least
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

// Of the candidates, those that some limit chooses, by rising held peak, each faster than every
// one before it. plan_chain_held takes the fastest candidate whose held peak fits, the one of least
// held peak among equally fast ones (the first made among equal ones); that is the last of these
// whose peak fits.
std::vector<Candidate> choosable(std::vector<Candidate> all) {
  std::vector<size_t> order(all.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return all[a].peak != all[b].peak ? all[a].peak < all[b].peak : all[a].time < all[b].time;
  });
  std::vector<Candidate> out;
  for (size_t k : order)
    if (out.empty() || all[k].time < out.back().time) out.push_back(std::move(all[k]));
  return out;
}

// The chosen candidate's plan, as held predicts it; InfeasibleError below the least held peak.
ChainPlan plan_fixed_held(const std::vector<Candidate>& choices, const ChainCosts& planning, const ChainCosts& held,
                          size_t limit, const ChainPlanOptions& options) {
  const auto above = std::upper_bound(choices.begin(), choices.end(), limit,
                                      [](size_t l, const Candidate& c) { return l < c.peak; });
  if (above == choices.begin())
    throw InfeasibleError("plan_chain: memory limit " + std::to_string(limit) + " bytes is below the least peak " +
                              std::to_string(choices.front().peak) + " bytes of any plan, counted as held",
                          choices.front().peak);
  const Candidate& best = *(above - 1);
  ChainPlan chosen;
  chosen.plan = make_plan(held, best.tree);
  if (best.grouped) {
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

// One chain's plans (HeldPlans): up to kFixedCandidatesMaxStages stages, the candidates that some
// limit chooses, made once; on longer chains, the costs each limit is planned with, and the
// chain's least peak once found.
struct HeldPlans::Set {
  ChainCosts planning, held;
  ChainPlanOptions options;
  mutable std::optional<std::vector<Candidate>> choices;  // fixed candidates
  mutable std::optional<size_t> least, smallest;          // longer chains

  Set(ChainCosts p, ChainCosts h, const ChainPlanOptions& o) : planning(std::move(p)), held(std::move(h)), options(o) {
    check_held(planning, held);
  }
  bool fixed() const { return fixed_candidates(planning, options); }
  const std::vector<Candidate>& candidates() const {
    if (!choices) choices = choosable(held_candidates(planning, held, options));
    return *choices;
  }
  size_t least_peak() const {
    if (!least) least = chain_min_feasible_memory(planning, options);
    return *least;
  }
  ChainPlan plan(size_t limit) const;
  size_t smallest_limit() const {
    if (fixed()) return candidates().front().peak;
    if (!smallest) smallest = make_plan(held, plan_chain(planning, least_peak(), options).plan.tree).predicted_peak_bytes;
    return *smallest;
  }
};

ChainPlan HeldPlans::Set::plan(size_t limit) const {
  if (fixed()) return plan_fixed_held(candidates(), planning, held, limit, options);
  ChainPlan chosen;
  bool below_least = false;
  try {
    chosen = plan_chain(planning, limit, options);
  } catch (const InfeasibleError&) {  // below the planners' least peak: their least plan, if held fits it
    below_least = true;
    chosen = plan_chain(planning, least_peak(), options);
  }
  chosen.plan = make_plan(held, std::move(chosen.plan.tree));
  size_t within = below_least ? least_peak() : limit;
  for (int tries = 0; chosen.plan.predicted_peak_bytes > limit; ++tries) {
    if (within <= least_peak())
      throw InfeasibleError("plan_chain: memory limit " + std::to_string(limit) + " bytes is below the least peak " +
                                std::to_string(chosen.plan.predicted_peak_bytes) + " bytes of any plan, counted as held",
                            chosen.plan.predicted_peak_bytes);
    const size_t over = chosen.plan.predicted_peak_bytes - limit;
    within = tries >= 2 || within - least_peak() <= over ? least_peak() : within - over;
    chosen = plan_chain(planning, within, options);
    chosen.plan = make_plan(held, std::move(chosen.plan.tree));
  }
  return chosen;
}

HeldPlans::HeldPlans(const ChainCosts& planning, const ChainCosts& held, const ChainPlanOptions& options)
    : first_(std::make_unique<Set>(planning, held, options)) {}

HeldPlans HeldPlans::with_target(const ChainCosts& offload, const ChainCosts& held, const ChainPlanOptions& options) {
  HeldPlans out;
  out.first_ = std::make_unique<Set>(with_input_credits(offload, held), held_with_target(held, offload), options);
  out.memory_ = std::make_unique<Set>(without_target(offload, held), held, options);
  return out;
}

HeldPlans::~HeldPlans() = default;
HeldPlans::HeldPlans(HeldPlans&&) noexcept = default;
HeldPlans& HeldPlans::operator=(HeldPlans&&) noexcept = default;

ChainPlan HeldPlans::plan(size_t memory_limit, bool* in_memory) const {
  if (in_memory) *in_memory = !memory_;
  if (!memory_) return first_->plan(memory_limit);
  try {
    return first_->plan(memory_limit);
  } catch (const InfeasibleError& e) {
    // below the target's smallest limit every plan with it holds more: one in memory, where it fits
    try {
      ChainPlan chosen = memory_->plan(memory_limit);
      if (in_memory) *in_memory = true;
      return chosen;
    } catch (const InfeasibleError& f) {
      throw InfeasibleError(e.what(), std::min(e.min_feasible_bytes, f.min_feasible_bytes));
    }
  }
}

size_t HeldPlans::smallest_limit() const {
  const size_t first = first_->smallest_limit();
  return memory_ ? std::min(first, memory_->smallest_limit()) : first;
}

ChainPlan plan_chain_held(const ChainCosts& planning, const ChainCosts& held, size_t limit,
                          const ChainPlanOptions& options) {
  return HeldPlans(planning, held, options).plan(limit);
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
  return HeldPlans::with_target(offload, held, options).plan(limit, &in_memory);
}

size_t chain_min_feasible_memory_offload_or_held(const ChainCosts& offload, const ChainCosts& held,
                                                 const ChainPlanOptions& options) {
  return HeldPlans::with_target(offload, held, options).smallest_limit();
}

size_t chain_min_feasible_memory_held(const ChainCosts& planning, const ChainCosts& held, const ChainPlanOptions& options) {
  return HeldPlans(planning, held, options).smallest_limit();
}

}  // namespace remat::schedule
