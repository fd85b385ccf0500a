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
//   // Heterogeneous chain of 3 stages under a byte budget: the rotor dynamic programme.
//   rs::ChainCosts costs;
//   costs.forward_time   = {1.0, 4.0, 2.0};          // uf[i]
//   costs.backward_time  = {2.0, 8.0, 4.0};          // ub[i]
//   costs.boundary_bytes = {64, 256, 256, 16};       // x[i]: input of stage i; x[3] = chain output
//   costs.saved_bytes    = {512, 4096, 1024};        // xbar[i]: what recording stage i keeps
//   // min_feasible_memory(costs) = 4928, save-all peaks at 6480 bytes.
//   rs::Plan plan = rs::plan_rotor(costs, /*memory_limit=*/5600);   // below 4928: InfeasibleError
//   for (const rs::PlanNode& node : plan.tree) ...  // stage = run recorded; region = checkpoint region
//   rs::SimResult check = rs::simulate(costs, plan);  // check.peak_bytes = 5440 <= 5600
//   std::cout << rs::format_tree(plan.tree);          // "S0 R[1..1](S1) S2" (stage 1 recomputed)
//   std::cout << rs::format_actions(plan.actions);    // "Fa0 Fn1 Fa2 L B2 D2 Fa1 D2 B1 D1 B0"
//
//   // Loop of unknown length with 4 slots: online checkpointing.
//   rs::OnlineCheckpointer online(4);
//   while (!done) { auto d = online.on_step(); if (d.take_snapshot) save(state, d.slot); step(); }
//   std::vector<rs::RevolveAction> reverse = online.reverse_schedule();
//
// ================================ Revolve (uniform chains) ================================
// Chain x0 -> x1 -> ... -> xn of n forward steps; step i maps x_i to x_{i+1}. The reverse pass
// needs, for i = n-1 down to 0, the adjoint of step i, which needs x_i. A schedule is a list of
//   advance(to step k)   recompute forward from the current state to x_k (k - current steps),
//   takeshot(slot)       store the current state in a snapshot slot (overwrites the slot),
//   restore(slot)        make the state stored in the slot current,
//   firsturn(i) / youturn(i)  run step i with recording from x_i and then its adjoint ("turn");
//                        firsturn is the first turn (i = n-1), youturn every later one.
// Counting convention: the forward-step count of a schedule is the sum of its advance distances.
// The taped forward evaluation inside each turn is NOT counted (there are exactly n of them in
// every schedule, so "total forward evaluations" = count + n). Under this convention the optimum
// with s slots (the slot holding x0 included) is the closed form of Griewank & Walther:
//   beta(s, r) = C(s + r, s),  r = the smallest r >= 0 with beta(s, r) >= n,
//   t(n, s)    = r * n - beta(s + 1, r - 1)            (beta(., -1) = 0),
// e.g. t(n, 1) = n(n-1)/2, and t(n, s) = n - 1 when s >= n - 1 (store-all: r = 1).
//
// ======================= Heterogeneous chains: costs, plans, memory model =======================
// Stages 0..L-1. Stage i maps boundary a_i (x[i] bytes) to a_{i+1} (x[i+1] bytes); a_0 is the
// chain input (owned by the caller), a_L the chain output, consumed by the loss. Costs per stage:
//   uf[i] forward time, ub[i] backward time (ChainCosts::forward_time / backward_time),
//   x[i]  boundary bytes, i = 0..L (ChainCosts::boundary_bytes),
//   xbar[i] bytes that stage i's forward keeps for its backward when run with recording,
//         EXCLUDING its input boundary a_i (kept and counted separately as x[i]) and excluding
//         the output boundary a_{i+1} as a boundary (if the backward needs the output, count it
//         in xbar: the model then counts those bytes twice, which is conservative).
//
// Actions (ActionKind; rotor's names in brackets):
//   forward_no_save(i)  [F_ck / F_0]  needs a_i; computes a_{i+1} without recording.
//   forward_save_all(i) [F_all]       needs a_i; computes a_{i+1} and keeps stage i's record (xbar[i]).
//   drop(j)                           frees boundary a_j (never a_0). Rotor's F_0(i) = F_ck(i), drop(i).
//   loss                              [turn] needs a_L; creates the output gradient d_L (x[L] bytes),
//                                     then frees a_L.
//   backward(i)         [B]           needs the current gradient d_{i+1}, stage i's record and a_i;
//                                     creates d_i (x[i] bytes), then frees d_{i+1} and the record.
// Memory model (the same in the DP and in the simulator): live bytes = sum of x[j] over live
// boundaries (a_0 always live) + sum of xbar[i] over live records + x[j] for the live gradient
// d_j. An action's own allocations count together with everything live before it; its frees
// happen after it. So forward(i) peaks at live + x[i+1] (+ xbar[i] if recorded), loss at
// live + x[L] (a_L and d_L both live), backward(i) at live + x[i] (d_{i+1}, record, a_i, d_i
// all live). No other temporaries are modelled. Time = sum of uf over forward actions + sum of
// ub over backward actions. Peak = the maximum over all actions.
// Validity (simulate throws remat::Error otherwise): every operand live when used, a
// boundary never computed while already live, forward of a stage only before its backward,
// backward exactly once per stage, in order L-1..0, and at the end only a_0 and d_0 live.
//
// Plans as trees. A plan is a std::vector<PlanNode> covering stages 0..L-1 in order:
//   stage i:        run stage i with recording (F_all); its backward follows in the backward pass.
//   region [f, l]:  run stages f..l without recording, keeping only the region's input a_f; in
//                   the backward pass re-run the region's children (a plan for the sub-chain
//                   f..l, with the same rules) and back-propagate through them. A region's
//                   children may not be a single region over the same stages (that adds
//                   nothing and would nest without end).
// plan_actions() turns a tree into the action list; the engine runs the tree directly. For a
// sequence of children c_0..c_k over stages [a, b]:
//   forward parts of c_0..c_k in order (stage i: forward_save_all(i); region [f, l]:
//   forward_no_save(f), then forward_no_save(j), drop(j) for j = f+1..l);
//   then the turn: loss at the top level, drop(b+1) inside a region's re-run (its output is
//   not needed: the region already holds the incoming gradient d_{b+1});
//   then, for c = c_k..c_0: drop(output boundary of c) unless c = c_k; the backward part of c
//   (stage i: backward(i); region: the children's sequence, recursively, in re-run mode).
//
// rotor (plan_rotor). The optimal plan over all trees, by the dynamic programme of Beaumont,
// Eyraud-Dubois, Herrmann, Joly, Shilova (2019), restated for the model above. For a sub-chain
// [a, b] and memory m (bytes available beyond a_a, which the caller holds; in re-run mode the
// incoming gradient d_{b+1} counts against m from the start, at the top level it appears at the
// loss), C(a, b, m) = min of
//   F_all first:  uf[a] + C(a+1, b, m - x[a+1] - xbar[a]) + ub[a],
//                 if m >= xbar[a] + x[a+1] + x[a]   (the backward(a) peak);
//                 a = b: uf[a] + ub[a] if m >= xbar[a] + x[a+1] + max(x[a+1], x[a]);
//   region [a, c-1] first, a < c <= b:  sum(uf[a..c-1]) + C(c, b, m - x[c]) + C_rerun(a, c-1, m),
//                 if m >= g + max_{a<=k<c} ((k > a ? x[k] : 0) + x[k+1]) (its forward sweep),
//                 g = x[b+1] in re-run mode, 0 at the top level.
// (A region as the last child is never better than its children spliced in its place, so the
// recursion leaves it out; the tests check this against exhaustive search over all trees.)
// Discretisation: with M' = memory_limit - x[0] and unit u = max(1, ceil(M' / slots)), every
// size is rounded UP to whole units and the budget DOWN to floor(M' / u) units. A plan that
// fits in units therefore fits in bytes: the returned plan never exceeds memory_limit (checked
// by simulate with exact bytes). Proven bound: at most K = 2L + 2 buffers (L boundaries a_1..a_L,
// L records, 2 gradients) are live at once, so every plan whose exact peak is at most
// memory_limit - K*u fits in units; hence time(plan_rotor) <= OPT(memory_limit - (2L+2)*u),
// where OPT(M) is the least time over all trees with exact peak <= M. With u = 1 (small sizes
// or many slots) the result is exactly OPT(memory_limit). If the units admit no plan although
// memory_limit >= min_feasible_memory(), plan_rotor returns the least-peak plan (always
// within the limit). Cost: O(L^2 * slots) memory (10 bytes per entry; tables over 1.5e8
// entries are refused with remat::Error), O(L^3 * slots) time: with 500 slots about
// 0.05 s for L = 50, 0.4 s for L = 100, 3 s for L = 200 (one loaded core).
#pragma once

#include <cstddef>
#include <cstdint>
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
// t(n, s) = r*n - beta(s+1, r-1): the least forward-step count (convention above).
int64_t revolve_optimal_forward_steps(int64_t n, int s);

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
// starts from the current state x_n and uses the snapshots held.
// Placement (doubling): snapshots at all multiples of a spacing d <= i, starting with d = 1;
// when a multiple of d needs a slot and all s are full, d doubles and the snapshots that are
// not multiples of the new d are released. Reverse: a small DP chooses which held snapshots to
// keep (q_0 = 0 < q_1 < ...); segment [q_j, q_{j+1}) is reversed, last first, by offline Revolve
// with s - j slots, so the reverse costs min over kept subsets of sum_j t(q_{j+1} - q_j, s - j).
// Bound: the kept subset {0} alone costs t(n, s), so the total forward-step count of the whole
// run (the n steps of the forward loop + the reverse schedule) is at most n + t(n, s): at most
// one sweep more than offline Revolve, hence <= 2 t(n, s) + 1 (as t(n, s) >= n - 1); when
// n <= s it is n (offline: n - 1). Measured (n = 2000): 33374 vs 31374 offline for s = 3,
// 20276 vs 19812 for s = 4, 8845 vs 8635 for s = 10; the extra over offline, in sweeps of n,
// averages 0.92 (s = 2), 0.72 (s = 3), 0.30 (s = 4), 0.13 (s = 10) over n = 50..2000.
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

  int num_stages() const { return static_cast<int>(forward_time.size()); }
  // Throws remat::Error on mismatched lengths, no stage, negative or non-finite
  // times, or sizes whose sum could overflow.
  void validate() const;
  static ChainCosts uniform(int stages, double forward_time, double backward_time, size_t boundary_bytes,
                            size_t saved_bytes);
};

enum class ActionKind { forward_no_save, forward_save_all, backward, drop, loss };
struct Action {
  ActionKind kind;
  int index;  // stage (forwards, backward), boundary (drop), L (loss)
  bool operator==(const Action&) const = default;
};

struct PlanNode {
  enum class Kind { stage, region } kind;
  int first, last;                  // stage: first == last
  std::vector<PlanNode> children;   // region: the plan for stages first..last
  static PlanNode stage(int index) { return {Kind::stage, index, index, {}}; }
  static PlanNode region(int first, int last, std::vector<PlanNode> children) {
    return {Kind::region, first, last, std::move(children)};
  }
  bool operator==(const PlanNode&) const = default;
};

struct Plan {
  std::vector<Action> actions;
  std::vector<PlanNode> tree;
  size_t predicted_peak_bytes = 0;  // from simulate (exact bytes)
  double predicted_time = 0;
};

struct SimResult {
  size_t peak_bytes = 0;
  double total_time = 0;
  int forward_evaluations = 0;  // forward actions
  int recomputed_forwards = 0;  // forward_evaluations - L
};

// Checks a tree covers stages 0..num_stages-1 in order with valid regions; throws
// remat::Error naming the offending node.
void validate_tree(const std::vector<PlanNode>& tree, int num_stages);
// The action list of a (valid) tree, per the rules above.
std::vector<Action> plan_actions(const std::vector<PlanNode>& tree, int num_stages);
// Executes a plan on the cost model. Uses the tree when present (plan.actions, if not empty,
// must then equal plan_actions(tree)); otherwise the action list. Throws remat::Error
// if the plan is invalid.
SimResult simulate(const ChainCosts& costs, const Plan& plan);
SimResult simulate_actions(const ChainCosts& costs, const std::vector<Action>& actions);
// Tree -> Plan with actions and predictions filled in by simulate.
Plan make_plan(const ChainCosts& costs, std::vector<PlanNode> tree);

// The optimal plan within memory_limit bytes (see "rotor" above). slots >= 1.
// Throws InfeasibleError if memory_limit < min_feasible_memory(costs).
Plan plan_rotor(const ChainCosts& costs, size_t memory_limit, int slots = 500);
// The least peak (exact bytes, a_0 included) of any plan, and a plan that attains it (least
// time among the least-peak choices of each subproblem).
size_t min_feasible_memory(const ChainCosts& costs);
Plan plan_min_memory(const ChainCosts& costs);

// Fixed plans.
Plan plan_save_all(const ChainCosts& costs);      // every stage F_all
Plan plan_every_layer(const ChainCosts& costs);   // every stage its own region
Plan plan_every_k(const ChainCosts& costs, int k);  // regions of k stages (the last may be shorter)
// As PyTorch's checkpoint_sequential(functions, segments): segment size L / segments (integer
// division); the first segments - 1 segments are regions, the remaining stages run with
// recording. 1 <= segments <= L.
Plan plan_uniform_segments(const ChainCosts& costs, int segments);

// Printable forms: tree "R[0..2](S0 S1 S2) S3"; actions "Fa0 Fn1 D1 L B1 ...".
std::string format_tree(const std::vector<PlanNode>& tree);
std::string format_actions(const std::vector<Action>& actions);

}  // namespace remat::schedule
