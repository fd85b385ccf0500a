// remat/schedule.h - checkpointing planners: plain data in, plain data (a plan) out.
//
// The schedule layer knows nothing about tensors: it reads per-stage costs and sizes and writes a
// plan that the engine executes. It includes only the standard library and the header-only
// remat/error.h (its errors are remat::Error, as everywhere in the API), so it builds on its own
// (from the repository root; -fsyntax-only in place of -c writes no object files):
//   g++ -std=c++20 -Wall -Wextra -Iinclude -c src/schedule/*.cpp
//
//   namespace rs = remat::schedule;
//
//   // Uniform loop of n = 100 steps, 5 snapshot slots: Revolve (binomial checkpointing).
//   std::vector<rs::RevolveAction> schedule = rs::revolve_schedule(100, 5);
//   rs::RevolveReplay replay = rs::replay_revolve(schedule, 100, 5);   // validates it
//   assert(replay.forward_steps == rs::revolve_optimal_forward_steps(100, 5));
//
//   // Heterogeneous chain of 3 stages under a byte budget: the chain planner.
//   rs::ChainCosts costs;
//   costs.forward_time   = {1.0, 4.0, 2.0};          // uf[i]
//   costs.backward_time  = {2.0, 8.0, 4.0};          // ub[i]
//   costs.boundary_bytes = {64, 256, 256, 16};       // x[i]: input of stage i; x[3] = chain output
//   costs.saved_bytes    = {512, 4096, 1024};        // xbar[i]: what recording stage i keeps
//   const rs::ChainPlanner planner(costs);            // smallest_limit() = 4928; save-all peaks at 6480
//   rs::Plan plan = planner.plan(/*memory_limit=*/5600).plan;        // below 4928: InfeasibleError
//   int regions = 0;                                  // stage: run recorded; region: checkpoint region
//   for (const rs::PlanNode& node : plan.tree) regions += node.kind == rs::PlanNode::Kind::region;
//   rs::SimResult check = rs::simulate(costs, plan);  // check.peak_bytes = 5440 <= 5600
//   std::cout << rs::format_tree(plan.tree);          // "S0 R[1..1](S1) S2" (stage 1 recomputed)
//   std::cout << rs::format_actions(plan.actions);    // "Fa0 Fn1 Fa2 L B2 D2 Fa1 D2 B1 D1 B0"
//
//   // Loop of unknown length with 4 slots: online checkpointing.
//   rs::OnlineCheckpointer online(4);
//   while (!done) { auto d = online.on_step(); if (d.take_snapshot) save(state, d.slot); step(); }
//   std::vector<rs::RevolveAction> reverse = online.reverse_schedule();
//
// The models behind the planners, in docs/planners.md: Revolve's actions and its forward-step
// count t(n, s); online checkpointing's placement and its bound; for heterogeneous chains the
// costs (uf, ub, x, xbar), the actions, the memory model simulate() uses, plans as trees, the
// rotor dynamic programme, its discretisation and the bound on what the rounding costs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "remat/error.h"

namespace remat::schedule {

// Thrown when no plan fits the memory limit. min_feasible_bytes is the least peak (exact bytes)
// of any plan for the chain; the message states it.
class InfeasibleError : public Error {
 public:
  InfeasibleError(const std::string& message, size_t min_feasible) : Error(message), min_feasible_bytes(min_feasible) {}
  size_t min_feasible_bytes;
};

// ================================ Revolve ================================

// beta(s, r) = C(s + r, s), the longest chain reversible with s slots and r repetitions.
// 0 when s < 0 or r < 0; saturates at UINT64_MAX.
uint64_t binomial_beta(int s, int r);
// The smallest r >= 0 with beta(s, r) >= n. Requires n >= 0, s >= 1.
int revolve_repetition_number(int64_t n, int s);
// t(n, s) = r*n - beta(s+1, r-1): the least forward-step count (advance distances; the n
// recorded evaluations inside the turns are not counted: docs/planners.md).
int64_t revolve_optimal_forward_steps(int64_t n, int s);

// advance: run forward from the current state to x_step; takeshot / restore: store the current
// state in a slot / make a slot's state current; firsturn / youturn: run step `step` recorded and
// then its adjoint (firsturn is the first of these, for step n-1).
struct RevolveAction {
  enum class Kind { advance, takeshot, restore, firsturn, youturn };
  Kind kind;
  int64_t step;   // advance: target state k; takeshot/restore: the state stored/restored;
                  // firsturn/youturn: the step i reversed (x_i -> x_{i+1})
  int slot = -1;  // takeshot/restore: the slot, 0..s-1
  bool operator==(const RevolveAction&) const = default;
};
std::string to_string(const RevolveAction& action);

// Schedules are materialised as action lists (at most about 4 actions per step), so their length
// is bounded: revolve_schedule and OnlineCheckpointer refuse more than kMaxScheduleSteps steps.
inline constexpr int64_t kMaxScheduleSteps = int64_t{1} << 24;

// An optimal schedule (forward-step count t(n, s)) for n steps and s >= 1 slots. Begins with
// takeshot of x0 in slot 0. s >= n - 1 gives store-all: snapshots of x0..x_{n-2}.
// n <= kMaxScheduleSteps.
std::vector<RevolveAction> revolve_schedule(int64_t n, int s);

struct RevolveReplay {
  int64_t forward_steps = 0;    // sum of advance distances (turns not counted)
  int64_t snapshots_taken = 0;  // takeshot actions
  int slots_used = 0;           // distinct slots ever written
};
// Executes a schedule on an abstract chain starting at x0 with all slots empty and checks it:
// advances only forward and up to x_n, takeshot/restore slots in [0, s), restore only from a
// filled slot, turns at the current state exactly once per step in order n-1..0 (firsturn first),
// and the informational `step` fields match. Throws remat::Error naming the action.
RevolveReplay replay_revolve(const std::vector<RevolveAction>& schedule, int64_t n, int s);

// ================================ Online checkpointing ================================
// For loops whose length is unknown in advance, with s >= 1 slots. Call on_step() with the loop
// at state x_i just before computing step i (i = 0, 1, ...); it says whether to store x_i and
// into which slot (overwriting it). After the loop ended at n = steps(), reverse_schedule()
// starts from the current state x_n and uses the snapshots held. Snapshots are placed at the
// multiples of a spacing that doubles when the slots are full; the whole run (the loop's n steps
// and the reverse) costs at most n + t(n, s) forward steps, one sweep more than offline Revolve
// (docs/planners.md, "Online checkpointing": the placement, the reverse and measured costs).
class OnlineCheckpointer {
 public:
  explicit OnlineCheckpointer(int slots);
  struct Decision {
    bool take_snapshot = false;
    int slot = -1;  // the slot to overwrite with the current state
  };
  Decision on_step();
  int64_t steps() const { return steps_; }
  int slots() const { return slots_; }
  // The held snapshots (state index, slot), sorted by state.
  std::vector<std::pair<int64_t, int>> snapshots() const;
  // The reverse pass after the loop ended at n = steps(): starts at state x_n.
  std::vector<RevolveAction> reverse_schedule() const;
  // The whole run as one schedule from x0 (for replay_revolve): the loop's takeshots and its
  // n one-step advances, then reverse_schedule().
  std::vector<RevolveAction> full_schedule() const;

 private:
  int slots_;
  int64_t steps_ = 0;
  int64_t spacing_ = 1;
  std::vector<int64_t> slot_state_;  // state held by each slot, -1 = free
  std::vector<RevolveAction> forward_log_;
};

// ================================ Heterogeneous chains ================================

struct ChainCosts {
  std::vector<double> forward_time;    // uf[i], i = 0..L-1
  std::vector<double> backward_time;   // ub[i], i = 0..L-1
  std::vector<size_t> boundary_bytes;  // x[i], i = 0..L (x[0]: chain input, x[L]: chain output)
  std::vector<size_t> saved_bytes;     // xbar[i], i = 0..L-1 (excluding the input boundary)
  // Of xbar[i], the bytes that are the output a_{i+1} itself (a record that keeps its stage's
  // output), i = 0..L-1, or empty (none): while record i and a_{i+1} are both in memory they are
  // counted once by simulate. The planners ignore it (they count both, which errs on the safe side).
  std::vector<size_t> saved_output_bytes;
  // Of x[i], the bytes that stage i's record holds itself (ops that save their input, like a
  // Linear's), i = 0..L-1, or empty (none). A record sent to the offload target takes them along:
  // while it is away they are not in memory unless another holder keeps them (simulate: Note [a
  // record that keeps its input] in src/schedule/simulate.cpp), and the planners credit its offload
  // with them (exact where record i - 1 keeps a_i as its output: they count those bytes twice).
  std::vector<size_t> saved_input_bytes;
  size_t input_sent_with_record(size_t i) const { return saved_input_bytes.empty() ? 0 : saved_input_bytes[i]; }
  // Of xbar[i], the most that record i keeps in memory at once when it is streamed: sent to the
  // offload target value by value as its forward saves them, and read back value by value as its
  // backward reads them (Note [a record read back value by value] in src/autodiff/saved_tensor.cpp),
  // i = 0..L-1, or empty (none: a streamed record counts whole, as one that is not).
  std::vector<size_t> streamed_bytes;
  size_t streamed(size_t i) const { return streamed_bytes.empty() ? saved_bytes[i] : std::min(streamed_bytes[i], saved_bytes[i]); }
  // Whether simulate counts a boundary only while something holds it, as an allocator counts
  // saved values: a_{i+1} made by a forward is a temporary until the next action that keeps it
  // (a forward of stage i+1, unless that forward does not record and the next action drops
  // a_{i+1}: a region's forward sweep; the loss; a backward; an offload); one dropped unused (a
  // re-run's last output) never counts. false: a boundary counts from the forward that makes it.
  // The planners ignore it and the next field (docs/planners.md, "boundaries counted while held").
  bool boundaries_counted_when_held = false;
  // Values that a region keeps beyond its input once its forward sweep passes from stage
  // read_by - 1 to stage read_by: made by stage made_by < read_by - 1 (-1: before the chain, the
  // step's token ids) and read by stage read_by or the ops before it (a position embedding added to
  // stage read_by - 1's output). A region that starts after made_by keeps them with its input until
  // that is dropped; one that starts at or before it made them, a temporary of its sweep. Counted
  // with boundaries_counted_when_held only. Entries with the same value >= 0 are one value read by
  // several stages (a mask multiplied in after every layer call): counted once while kept.
  struct SweptValue {
    int read_by = 1;
    int made_by = -1;
    size_t bytes = 0;
    int value = -1;  // -1: a value of its own
  };
  std::vector<SweptValue> swept_values;
  // What the ops just before stage `stage` (after stage - 1's layer call; for stage 0, before the
  // first call) save for their own backward: a product with a constant mask between two calls.
  // They run recorded where stage `stage` starts a node (its record, or before a region over it
  // opens), not inside a region's sweep, and keep these values until stage `stage`'s backward has
  // run. Entries with the same value >= 0 are one value that several gaps save: counted once
  // while any holds it. Counted with boundaries_counted_when_held only.
  struct GapSaved {
    int stage = 0;
    size_t bytes = 0;
    int value = -1;  // -1: a value of its own
  };
  std::vector<GapSaved> gap_saved;
  // What writing a kept byte out and reading it back costs (seconds per byte), when kept values
  // may be offloaded; negative: there is no offload target, and no plan offloads.
  double offload_seconds_per_byte = -1;
  // The part of offload_seconds_per_byte that writes the byte out (0 to all of it). A write runs on
  // one disk worker, in the order of the offloads, behind the forward compute that follows its
  // node up to the loss; only what the queue of writes runs past the loss is charged (the stall).
  // The rest is the read back, before the node's backward (charged in full, or its stall with
  // reads_ahead). 0: no queued write (docs/planners.md, "the cost of a transfer").
  double offload_write_seconds_per_byte = 0;
  bool can_offload() const { return offload_seconds_per_byte >= 0; }
  // The most a plan may offload in a step: every record and every boundary (by which a budget plan
  // judges whether the page cache holds it: remat::offload_price).
  size_t offloadable_bytes() const {
    size_t total = 0;
    for (size_t b : saved_bytes) total += b;
    for (size_t b : boundary_bytes) total += b;
    return total;
  }
  // Whether a read may start ahead of its node: in the backward, after the loss and after the
  // read before it (one read in flight, in the order of the fetches), at the earliest action from
  // which the live bytes plus the value stay within the plan's peak; then a read is charged only
  // for the stall it causes, what it runs past the compute from its start to its node. The peak
  // does not change. false: a read is charged in full at its node (docs/planners.md, "the cost of
  // a transfer").
  bool reads_ahead = false;
  // Whether peaks count the backward pass's gradient buffers d_j (x[j] bytes each), as the rotor
  // paper's model does; false: boundaries and records only, what an allocator counts as saved
  // (the budget: policy, whose budget bounds saved bytes).
  bool gradients_counted = true;
  size_t gradient_bytes(size_t j) const { return gradients_counted ? boundary_bytes[j] : 0; }

  int num_stages() const { return static_cast<int>(forward_time.size()); }
  // Throws remat::Error on mismatched lengths, no stage, negative or non-finite
  // times (the offload cost included, when not negative), or sizes whose sum could overflow.
  void validate() const;
  static ChainCosts uniform(int stages, double forward_time, double backward_time, size_t boundary_bytes,
                            size_t saved_bytes);
};

// forward_no_save(i) / forward_save_all(i): a_i -> a_{i+1} without / with stage i's record;
// backward(i): d_{i+1} -> d_i (needs the record and a_i); drop(j): frees boundary a_j; loss: the
// turn at the chain's end; offload(i): stage i's record, if it holds one, else boundary a_i
// (i >= 1), leaves memory for the offload target; fetch(i): it comes back (docs/planners.md: what
// each needs, allocates and frees).
enum class ActionKind { forward_no_save, forward_save_all, backward, drop, loss, offload, fetch };
struct Action {
  ActionKind kind;
  int index;  // stage (forwards, backward), boundary (drop), L (loss)
  bool operator==(const Action&) const = default;
};

// A plan as a tree: stage i runs recorded; region [first, last] runs without recording, keeping
// only its input, and in the backward pass re-runs `children` (a plan for its stages; not a single
// region over the same stages) and back-propagates through them. An offloaded node (top level
// only) sends what it keeps (a stage its record, a region its input boundary, which must not be
// a_0) to the offload target after its forward and fetches it back before its backward.
struct PlanNode {
  enum class Kind { stage, region } kind;
  int first, last;                  // stage: first == last
  std::vector<PlanNode> children;   // region: the plan for stages first..last
  bool offloaded = false;
  static PlanNode stage(int index) { return {Kind::stage, index, index, {}}; }
  static PlanNode region(int first, int last, std::vector<PlanNode> children) {
    return {Kind::region, first, last, std::move(children)};
  }
  PlanNode& offload() {
    offloaded = true;
    return *this;
  }
  bool operator==(const PlanNode&) const = default;
};

// The read back of one offloaded value (a fetch action), as simulate() charges it.
struct ReadAhead {
  int index = 0;           // the fetch's stage or boundary index
  size_t bytes = 0;
  int start_action = 0;    // the action before which the read may start (== fetch_action: none ahead)
  int fetch_action = 0;    // the fetch's position in the action list
  double read_time = 0;    // the read's disk time
  double window = 0;       // the compute from start_action to the fetch
  double stall = 0;        // what the read adds to the step: max(0, read_time - window)
};

struct Plan {
  std::vector<Action> actions;
  std::vector<PlanNode> tree;
  size_t predicted_peak_bytes = 0;  // from simulate (exact bytes)
  double predicted_time = 0;
  std::vector<ReadAhead> reads;     // from simulate: where each read back starts and its charge
};

struct SimResult {
  size_t peak_bytes = 0;
  double total_time = 0;
  int forward_evaluations = 0;  // forward actions
  int recomputed_forwards = 0;  // forward_evaluations - L
  size_t offloaded_bytes = 0;   // written to the offload target (and read back)
  double write_stall_time = 0;  // of total_time: how long the queued writes run past the forward pass
  double read_time = 0;         // of total_time: what the reads back add (their stalls, with reads_ahead)
  std::vector<ReadAhead> reads; // one per fetch, in action order
};

// Checks a tree covers stages 0..num_stages-1 in order with valid regions; throws
// remat::Error naming the offending node.
void validate_tree(const std::vector<PlanNode>& tree, int num_stages);
// The action list of a (valid) tree (the rules: docs/planners.md, "Plans as trees").
std::vector<Action> plan_actions(const std::vector<PlanNode>& tree, int num_stages);
// Executes a plan on the cost model (docs/planners.md, "memory model"). Uses the tree when
// present (plan.actions, if not empty, must then equal plan_actions(tree)); otherwise the action
// list. Throws remat::Error if the plan is invalid.
SimResult simulate(const ChainCosts& costs, const Plan& plan);
SimResult simulate_actions(const ChainCosts& costs, const std::vector<Action>& actions);
// Tree -> Plan with actions and predictions filled in by simulate.
Plan make_plan(const ChainCosts& costs, std::vector<PlanNode> tree);

// ============================ Budget chains ============================
//
// One planner plans a chain within a memory limit: ChainPlanner. It makes the least-time plan
// that fits, in memory or, where its costs name an offload target (ChainCosts::can_offload), with
// kept values offloaded, at any length: the exact rotor dynamic programme on short chains, the
// grouped planner on long ones (docs/planners.md: the algorithms, their costs and bounds). It is
// what a budget policy runs (remat/budget.h) and what `remat plan` prints.
// automatic: exact below a work threshold, grouped above it; exact or grouped forces one.
enum class RotorMethod { automatic, exact, grouped };
struct ChainPlanOptions {
  int slots = 500;                // memory units of the exact programme (about limit / slots bytes)
  RotorMethod method = RotorMethod::automatic;
  double exact_max_work = 1e8;    // automatic: exact while L^3 * (slots + 1) / 6 is at most this
  int group = 16;                 // grouped: parts per group (>= 2)
  int group_slots = 400;          // grouped: memory units of each group's programme (>= 8)
  int top_parts = 64;             // grouped: parts of the top-level programme (2 to 1000)
  // grouped: threads that build the top-level parts' group menus and simulate the planner's
  // candidates beside the thread making them (0: the hardware's cores; 1 to 1024). The plans do
  // not depend on it; progress is reported on the calling thread only.
  int threads = 0;
  // Called with the fraction done (0 to 1), at most about 100 times, by the grouped planner;
  // the library prints nothing itself.
  std::function<void(double fraction)> progress;
  // For a budget plan with an offload target (remat/budget.h): >= 0, the cost per offloaded byte
  // to plan with instead of the target's measured bandwidth (a known target, or a test), with no
  // queued write part (the read back still starts ahead where the plan's peak leaves room).
  double offload_seconds_per_byte = -1;
  // For a budget plan: price each layer call by its FLOP estimate (autodiff::OpCounters; the
  // forward at 1e9 FLOP/s, the backward twice that) instead of its measured times, so that the
  // same model plans the same on every run and machine, whatever the load (reproducible memory
  // behaviour; tests). Predicted times are then nominal.
  bool times_from_flops = false;
};
struct ChainPlan {
  Plan plan;
  RotorMethod method = RotorMethod::exact;  // exact or grouped: which planner made the plan
  int levels = 0;                           // grouped: levels of groups above the stages
  std::string describe() const;             // e.g. "exact rotor" or "grouped rotor, 3 levels of <= 16"
};
// The one chain planner. Made once for a chain, it plans any number of limits (each in about a
// millisecond once made: making it costs one planning of the chain, which on long chains takes
// seconds and reports progress to options.progress).
// ChainPlanner(costs) plans and predicts with `costs`. ChainPlanner(planning, held) plans with
// `planning` and counts each plan's peak as `held` does (the same chain with
// boundaries_counted_when_held, swept_values and gap_saved: as an allocator counts saved bytes,
// which is how a budget policy predicts), and chooses the fastest plan whose held peak fits, so
// the predicted time never rises as the limit falls.
// With an offload target in the costs (`planning.can_offload()`) it plans with it, and below the
// target's smallest limit in memory (offloading nothing) where that fits.
// plan() throws InfeasibleError below smallest_limit(), from which every limit is planned.
//   rs::ChainCosts held = costs;                       // the 3-stage chain of the example above,
//   held.boundaries_counted_when_held = true;          // counted as an allocator counts
//   const rs::ChainPlanner planner(costs, held);
//   const size_t least = planner.smallest_limit();
//   rs::ChainPlan chosen = planner.plan(least + 512);  // chosen.plan.predicted_peak_bytes <= least + 512
// Not to be shared between threads (the in-memory plans of a target's chain are made at the first
// call that needs them).
class ChainPlanner {
 public:
  explicit ChainPlanner(const ChainCosts& costs, const ChainPlanOptions& options = {});
  ChainPlanner(const ChainCosts& planning, const ChainCosts& held, const ChainPlanOptions& options = {});
  ~ChainPlanner();
  ChainPlanner(ChainPlanner&&) noexcept;
  ChainPlanner& operator=(ChainPlanner&&) noexcept;

  // The fastest plan whose predicted peak is at most memory_limit; `in_memory` (if given) says
  // whether it offloads nothing. Its predictions are those of predicted_costs(*in_memory).
  ChainPlan plan(size_t memory_limit, bool* in_memory = nullptr) const;
  // The least limit plan() plans from (with a target, the smaller of its and the in-memory one).
  size_t smallest_limit() const;
  // The planners' own least peak of the chain in memory, as `planning` counts (no held count, no
  // target): where plans start to keep everything they can in memory before offloading.
  size_t least_planned_peak() const;
  // The costs a plan's predictions are made with: `held` (with the target's prices, for a plan
  // that offloads).
  const ChainCosts& predicted_costs(bool in_memory) const;

 private:
  struct Set;  // one chain's candidate plans, made at the first call that needs them
  std::unique_ptr<Set> first_;   // with the target, if any, else in memory
  std::unique_ptr<Set> memory_;  // a target's chain in memory; null without a target
  ChainCosts least_costs_;       // planning in memory, for least_planned_peak()
  ChainPlanOptions options_;
};


// Fixed plans.
Plan plan_save_all(const ChainCosts& costs);      // every stage F_all
Plan plan_every_layer(const ChainCosts& costs);   // every stage its own region
Plan plan_every_k(const ChainCosts& costs, int k);  // regions of k stages (the last may be shorter)
// As PyTorch's checkpoint_sequential(functions, segments): segment size L / segments (integer
// division); the first segments - 1 segments are regions, the remaining stages run with
// recording. 1 <= segments <= L.
Plan plan_uniform_segments(const ChainCosts& costs, int segments);

// Printable forms: tree "R[0..2](S0 S1 S2) S3" ("+o" after an offloaded node: "S3+o");
// actions "Fa0 Fn1 D1 L B1 ..." (offload O, fetch I: "Fa3 O3 ... I3 B3").
std::string format_tree(const std::vector<PlanNode>& tree);
std::string format_actions(const std::vector<Action>& actions);

}  // namespace remat::schedule
