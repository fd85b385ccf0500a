// remat/scan.h - differentiable loops whose memory does not grow with their length.
//
//   // 10000 steps of an explicit PDE solver; only 16 states are kept for the backward pass
//   auto step = [&](const Tensor& u, int64_t t) { return add(u, mul_scalar(laplacian(u), dt)); };
//   Tensor u_final = remat::scan(step, u0, 10000, {.schedule = ScanSchedule::revolve, .snapshots = 16});
//   Tensor g = remat::grad({loss(u_final)}, {u0})[0];    // d loss / d u0
//
//   // a loop whose length is known only when it ends
//   Tensor u = remat::while_loop([&](const Tensor& u, int64_t t) { return residual(u) > tol; }, step, u0,
//                                {.schedule = ScanSchedule::online, .snapshots = 8});
//
// step(state, t) maps the state before step t to the state after it; it may use parameters and
// per-step inputs (captured tensors requiring grad get their gradients, as in a checkpoint region)
// and must be deterministic apart from remat's RNG, whose state is replayed per step: a step run
// again in the backward pass that returns another state than on the forward sweep (8 bytes of
// digest per step are kept) is a remat::Error naming the step.
//
// Schedules:
//   store_all  the loop recorded as written: every step's internals kept (the reference).
//   revolve    binomial checkpointing (Griewank & Walther, Algorithm 799) with `snapshots` slots
//              (the slot holding the initial state included): the least recomputation for a
//              known n. Forward-step evaluations beyond the n recorded ones = t(n, s) = r*n -
//              beta(s+1, r-1) (remat/schedule.h), counted in ScanStats.
//   online     for while_loop, where n is unknown: snapshots placed by doubling the spacing,
//              reversed by Revolve between kept snapshots; at most n + t(n, s) extra forward
//              evaluations (one sweep more than offline Revolve).
// Memory (saved bytes, allocator-measured): at most (s + 1) * state_bytes + one step's internals.
// Length: the revolve and online schedules are materialised as action lists, so a loop under them
// has at most schedule::kMaxScheduleSteps = 2^24 steps (more is a remat::Error); store_all has
// no limit.
// The backward pass through a loop under revolve or online runs once: a second one is the error a
// freed graph gives, and with retain_graph an error too (the snapshots were rewritten); store_all
// records the loop as written and runs any number of times.
// Gradients are bitwise equal to the loop unrolled under save-all when the loop's captured
// parameters get no other gradient contribution before the loop's own (their per-step
// contributions are summed in the same order as the unrolled loop does).
#pragma once

#include <cstdint>
#include <functional>

#include "remat/tensor.h"

namespace remat {

enum class ScanSchedule { store_all, revolve, online };

struct ScanOptions {
  ScanSchedule schedule = ScanSchedule::revolve;
  int snapshots = 8;  // slots for revolve and online (>= 1)
};

struct ScanStats {
  int64_t steps = 0;               // n
  int64_t forward_steps = 0;       // step evaluations without recording (forward sweep + recomputation)
  int64_t recorded_steps = 0;      // step evaluations with recording (the n "turns")
  int64_t optimal_forward_steps = 0;  // Revolve's closed form t(n, s) for this n and s (-1: beyond int64)
  size_t state_bytes = 0;
  size_t snapshot_peak_bytes = 0;  // bytes of snapshots held at once, at most
};

using ScanStep = std::function<Tensor(const Tensor& state, int64_t step)>;
using ScanCondition = std::function<bool(const Tensor& state, int64_t step)>;

Tensor scan(const ScanStep& step, const Tensor& state0, int64_t n_steps, const ScanOptions& options = {});
Tensor while_loop(const ScanCondition& cond, const ScanStep& step, const Tensor& state0,
                  const ScanOptions& options = {.schedule = ScanSchedule::online, .snapshots = 8});

// Statistics of the last scan/while_loop on this thread, updated as its backward pass runs.
ScanStats last_scan_stats();

}  // namespace remat
