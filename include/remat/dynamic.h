// remat/dynamic.h - any program under a byte budget of saved values: dynamic rematerialization
// (dynamic:BYTES, and dynamic:BYTES+offload:DIR).
//
//   // any program of remat ops, with or without modules and regions
//   Tensor loss = backward([&] { return solver(u0); }, {Policy::parse("dynamic:64MiB")});
//   remat::DynamicCounters d = remat::counters().dynamic;   // evictions, rematerializations, ...
//
//   // or as a scope of its own
//   { remat::DynamicScope scope(64 << 20); Tensor l = f(x); l.backward(); }
//
// Contract. While a scope is alive on a thread, every value saved for a backward pass is held by
// the runtime, and the live saved bytes it holds stay at most BYTES: when holding one more value
// would pass it, the held value with the lowest score, estimated recomputation time over (bytes x
// staleness), is evicted (Dynamic Tensor Rematerialization, Kirisame et al., ICLR 2021). An
// evicted value the backward pass reads is recomputed from the op that made it, its evicted inputs
// first; random ops replay their generator state, so gradients are bitwise equal to save-all's.
// Decisions use a logical clock and a formula of FLOPs and bytes, never timings, so the peak is
// reproducible. With an offload target, an evicted value of at least its threshold whose
// recomputation the formula puts above a round trip through the file, at the directory's
// bandwidth (remat::offload_bandwidth, measured once per process: which values are written may
// differ from one machine or run to the next, the results never do), is written there and read
// back instead (its digest checked); ram= does not apply (a remat::Error). A budget no eviction
// can meet is a remat::Error naming the smallest budget the run has needed so far and, once
// dynamic_feasible_range measured it, the whole step's; the op fails and nothing else changes.
// A rematerialized value that differs from the evicted one, or an input changed in place since,
// is a remat::Error. An op's forward must be a pure function of its inputs and captures, apart
// from a declared side effect, which a rematerialization skips (docs/design.md). The score, the
// cost formula and the file: the Notes of src/saved/dynamic.cpp.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>

#include "remat/counters.h"
#include "remat/offload.h"

namespace remat {

// Dynamic rematerialization under `budget_bytes` for the lifetime of the scope (this thread);
// with `evict_to` (dynamic:BYTES+offload:DIR), evicted values are written there where that is
// cheaper than recomputing them (threshold_bytes applies, ram_bytes must be 0).
class DynamicScope {
 public:
  explicit DynamicScope(size_t budget_bytes, std::optional<OffloadTarget> evict_to = std::nullopt);
  ~DynamicScope();
  DynamicScope(const DynamicScope&) = delete;
  DynamicScope& operator=(const DynamicScope&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The budgets dynamic: can run one step of a program under, measured by running it.
//
//   auto step = [&] { model.zero_grad(); model.loss(x, y).backward(); };
//   remat::DynamicRange r = remat::dynamic_feasible_range(step);
//   // dynamic:<r.smallest_budget_bytes> runs the step; dynamic:<r.smallest_budget_bytes - 1> fails
//
// `step` runs one forward and backward under the thread's policy (no GradOptions::policy); it is
// run several times, each under a ScopedPolicy of dynamic:B, and must do the same work each time
// (same shapes and ops; eviction depends on them, not on values). The first run, with no budget to
// speak of, measures save-all's peak (the most saved bytes held at once: at or above it nothing is
// evicted) and the largest need; then runs raise the budget to the need each failed run reports
// (as a user reading the errors would), and the byte below the budget found is run too: when it
// fails, that budget is the smallest; when it does not (eviction order can make feasibility
// non-monotone), the smallest is bisected between the last failed budget and it. counters().dynamic
// is left as it was (but for peak_held_bytes); the other counters count the runs. The result is
// remembered on this thread: a later infeasible dynamic: budget's error names it beside the need
// the failing run saw. An error of the step other than an infeasible budget is rethrown.
struct DynamicRange {
  size_t smallest_budget_bytes = 0;  // runs the step; one byte less fails (or it is 1)
  size_t save_all_peak_bytes = 0;    // held with nothing evicted
  int runs = 0;                      // of `step`
};
DynamicRange dynamic_feasible_range(const std::function<void()>& step);

namespace detail {
bool dynamic_running();  // a DynamicScope is alive on this thread
}  // namespace detail

}  // namespace remat
