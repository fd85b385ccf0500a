// The chain planner (remat/schedule.h: ChainPlanner): budget plans counted as an allocator counts
// saved bytes, in memory and with an offload target, and their smallest limits.
#include <algorithm>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
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
// anchor's levels (fewer on chains above 8,192 stages), over group menus built once
// (grouped_plans_at_anchors). It takes the fastest candidate whose held peak fits the limit, the
// one of least held peak among equally fast ones. A smaller limit has fewer candidates to choose
// from, so its choice is slower, or as fast and of no larger peak: the prediction never rises as
// the limit falls, at any length. Only the candidates that some limit chooses are kept
// (Choosable: by rising held peak, each faster than all before it), once per chain in a
// ChainPlanner, which then answers any limit with a search. The table whose limit is the least anchor
// at or above L has units at most about twice those of a plan made at L (an anchor's bytes over
// the slots), and the plans of its levels above L are candidates where their held peak fits it.
//
// Note [candidates made and simulated side by side]. On a 100,000-stage chain a candidate's tree
// has about 10^5 nodes; making one (the top-level table's sequence expanded) and simulating it as
// held take about 20 ms each. So each candidate is simulated on a second thread while the next is
// made, each is packed once simulated (PackedTree), and a candidate no limit would choose is
// dropped as soon as one as fast and no larger is known. The candidates go in the order they are made, and
// ties go to the first made, so the plans do not depend on the threads. A ChainPlanner of a
// 100,000-stage chain with a target is built in about 2x one plan's time
// (bench/results/held-plans-100k-2026-12-06.md).

// A plan tree in 12 bytes a node (a PlanNode is 48, and its children's vector an allocation):
// the count of top-level nodes, then each node, depth first, as its first and last stages and its
// children's count with its kind and offload flag in the low two bits. A ChainPlanner keeps up to hundreds of candidates, each of
// about 10^5 nodes on the longest chains.
using PackedTree = std::vector<uint32_t>;

void pack(const std::vector<PlanNode>& sequence, PackedTree& out) {
  for (const PlanNode& node : sequence) {
    const auto word = static_cast<uint32_t>(node.children.size() << 2) |
                      (node.kind == PlanNode::Kind::region ? 1u : 0u) | (node.offloaded ? 2u : 0u);
    out.insert(out.end(), {static_cast<uint32_t>(node.first), static_cast<uint32_t>(node.last), word});
    pack(node.children, out);
  }
}

PackedTree pack(const std::vector<PlanNode>& tree) {
  PackedTree out{static_cast<uint32_t>(tree.size())};
  pack(tree, out);
  out.shrink_to_fit();
  return out;
}

// The `count` nodes from `at` on, unpacked; `at` moves past them.
std::vector<PlanNode> unpack(const PackedTree& packed, size_t& at, size_t count) {
  std::vector<PlanNode> out;
  out.reserve(count);
  for (size_t k = 0; k < count; ++k) {
    const uint32_t word = packed[at + 2];
    PlanNode node{word & 1u ? PlanNode::Kind::region : PlanNode::Kind::stage, static_cast<int>(packed[at]),
                  static_cast<int>(packed[at + 1]), {}, (word & 2u) != 0};
    at += 3;
    node.children = unpack(packed, at, word >> 2);
    out.push_back(std::move(node));
  }
  return out;
}

std::vector<PlanNode> unpack(const PackedTree& packed) {
  size_t at = 1;
  return unpack(packed, at, packed[0]);
}

struct Candidate {
  PackedTree tree;
  double time = 0;
  size_t peak = 0;
  bool grouped = false;  // made by the grouped planner
};

// The candidates that some limit chooses, kept as they are made: plan_chain_held takes the fastest
// candidate whose held peak fits, the one of least held peak among equally fast ones (the first
// made among equal ones). So a candidate that one made before it is as fast as and holds no more
// than is never chosen, nor is one that a later candidate is as fast as and holds no more than,
// unless the two are equal. What stays, by rising held peak, is faster at each step.
class Choosable {
 public:
  void add(Candidate c) {
    for (const Candidate& k : kept_)
      if (k.peak <= c.peak && k.time <= c.time) return;
    std::erase_if(kept_, [&](const Candidate& k) { return c.peak <= k.peak && c.time <= k.time; });
    kept_.push_back(std::move(c));
  }
  size_t least_peak() const {
    size_t least = SIZE_MAX;
    for (const Candidate& k : kept_) least = std::min(least, k.peak);
    return least;
  }
  std::vector<Candidate> by_rising_peak() && {
    std::sort(kept_.begin(), kept_.end(), [](const Candidate& a, const Candidate& b) { return a.peak < b.peak; });
    return std::move(kept_);
  }

 private:
  std::vector<Candidate> kept_;
};

std::vector<Candidate> held_candidates(const ChainCosts& planning, const ChainCosts& held,
                                       const ChainPlanOptions& options) {
  Choosable out;
  // Each candidate is simulated on a second thread while the next is made (Note [candidates made
  // and simulated side by side]).
  std::future<Candidate> simulated;
  const std::launch side = planning_threads(options) > 1 ? std::launch::async : std::launch::deferred;
  const auto settle = [&] {  // the candidate in simulation, if any, added
    if (simulated.valid()) out.add(simulated.get());
  };
  const auto add = [&](std::vector<PlanNode> tree, bool grouped = false) {
    settle();
    const auto made = std::make_shared<std::vector<PlanNode>>(std::move(tree));
    const auto simulate = [&held, grouped, made] {
      const Plan plan = make_plan(held, std::move(*made));
      return Candidate{pack(plan.tree), plan.predicted_time, plan.predicted_peak_bytes, grouped};
    };
    try {
      simulated = std::async(side, simulate);
    } catch (const std::system_error&) {  // no thread to be had: simulated here
      out.add(simulate());
    }
  };
  const auto done = [&] {
    settle();
    return std::move(out).by_rising_peak();
  };
  const Plan save_all = plan_save_all(planning);
  add(save_all.tree);
  if (!runs_exact(planning, options)) {
    grouped_plans_at_anchors(planning, options, [&](std::vector<PlanNode> tree) { add(std::move(tree), true); });
    // as plan_grouped: the exact least-peak plan, where it is cheap, only below the grouped least
    if (least_peak_is_cheap(planning.num_stages(), options)) {
      settle();
      Plan least = make_plan(held, plan_min_memory(planning).tree);
      if (least.predicted_peak_bytes < out.least_peak())
        out.add(Candidate{pack(least.tree), least.predicted_time, least.predicted_peak_bytes, false});
    }
    return done();
  }
  const Plan least_plan = plan_min_memory(planning);  // its peak is min_feasible_memory's
  add(least_plan.tree);
  const size_t least = least_plan.predicted_peak_bytes;
  for (size_t anchor = save_all.predicted_peak_bytes;; anchor /= 2) {
    for (std::vector<PlanNode>& tree : rotor_plans_below(planning, std::max(anchor, least), options.slots))
      add(std::move(tree));
    if (anchor <= least) break;
  }
  return done();
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
  chosen.plan = make_plan(held, unpack(best.tree));
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
// costs, which count as an allocator does. It chooses among fixed candidates, each simulated as
// held (Note [a prediction that never rises] above), so the smallest limit it plans from
// (chain_min_feasible_memory_held) is the least held peak among them: below the planners' least
// peak where they count more than is held (a boundary made and dropped in a re-run), above it
// where swept values lift every plan. Every limit from it up is planned.

// One chain's plans: the candidates that some limit chooses, made once.
struct HeldSet {
  ChainCosts planning, held;
  ChainPlanOptions options;
  mutable std::optional<std::vector<Candidate>> choices;

  HeldSet(ChainCosts p, ChainCosts h, const ChainPlanOptions& o) : planning(std::move(p)), held(std::move(h)), options(o) {
    check_held(planning, held);
    check_options(options);
  }
  const std::vector<Candidate>& candidates() const {
    if (!choices) choices = held_candidates(planning, held, options);
    return *choices;
  }
  ChainPlan plan(size_t limit) const { return plan_fixed_held(candidates(), planning, held, limit, options); }
  size_t smallest_limit() const { return candidates().front().peak; }
};

struct ChainPlanner::Set : HeldSet {
  using HeldSet::HeldSet;
};

namespace {

// A held count without an offload target's prices (its records' inputs, which an offloaded
// record takes along, stay: they are the held count's, not the target's).
ChainCosts without_prices(ChainCosts costs) {
  costs.offload_seconds_per_byte = -1;
  costs.offload_write_seconds_per_byte = 0;
  costs.reads_ahead = false;
  return costs;
}

}  // namespace

// Note [one chain planner]. ChainPlanner is the one entry that plans a budget chain: the budget
// policy (src/checkpoint/budget.cpp) makes its plans with it, `remat plan` asks the policy for the
// plan it would run (BudgetPlanner::plan_for) or, for a chain read from a file, plans with it
// directly. In memory it is one set of candidates, planned with `planning` and counted as `held`.
// With an offload target it is two: the target's, planned with each offloaded record's input
// credited (with_input_credits) and counted as held with the target's prices; and, for limits
// below the target's smallest, the same chain in memory (without_target: the chain's output as
// held counts it), which offloads nothing. The planners behind it (plan_rotor, plan_chain, ...:
// chain_internal.h) are the schedule layer's own.
ChainPlanner::ChainPlanner(const ChainCosts& costs, const ChainPlanOptions& options)
    : ChainPlanner(costs, costs, options) {}

ChainPlanner::ChainPlanner(const ChainCosts& planning, const ChainCosts& held, const ChainPlanOptions& options)
    : options_(options) {
  planning.validate();
  held.validate();
  const ChainCosts held_memory = without_prices(held);
  least_costs_ = without_target(planning, held_memory);
  if (planning.can_offload()) {
    first_ = std::make_unique<Set>(with_input_credits(planning, held_memory), held_with_target(held_memory, planning),
                                   options);
    memory_ = std::make_unique<Set>(least_costs_, held_memory, options);
  } else {
    first_ = std::make_unique<Set>(planning, held_memory, options);
  }
}

ChainPlanner::~ChainPlanner() = default;
ChainPlanner::ChainPlanner(ChainPlanner&&) noexcept = default;
ChainPlanner& ChainPlanner::operator=(ChainPlanner&&) noexcept = default;

ChainPlan ChainPlanner::plan(size_t memory_limit, bool* in_memory) const {
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

size_t ChainPlanner::smallest_limit() const {
  const size_t first = first_->smallest_limit();
  return memory_ ? std::min(first, memory_->smallest_limit()) : first;
}

size_t ChainPlanner::least_planned_peak() const { return chain_min_feasible_memory(least_costs_, options_); }

const ChainCosts& ChainPlanner::predicted_costs(bool in_memory) const {
  return in_memory && memory_ ? memory_->held : first_->held;
}

ChainPlan plan_chain_held(const ChainCosts& planning, const ChainCosts& held, size_t limit,
                          const ChainPlanOptions& options) {
  return HeldSet(planning, held, options).plan(limit);
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
  return ChainPlanner(offload, held, options).plan(limit, &in_memory);
}

size_t chain_min_feasible_memory_offload_or_held(const ChainCosts& offload, const ChainCosts& held,
                                                 const ChainPlanOptions& options) {
  return ChainPlanner(offload, held, options).smallest_limit();
}

size_t chain_min_feasible_memory_held(const ChainCosts& planning, const ChainCosts& held, const ChainPlanOptions& options) {
  return HeldSet(planning, held, options).smallest_limit();
}

}  // namespace remat::schedule
