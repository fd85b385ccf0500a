// remat/dynamic.h - any program under a byte budget: dynamic rematerialization (dynamic:BYTES)
// and offloading saved values to disk (offload:DIR).
//
//   // any program of remat ops, with or without modules and regions
//   Tensor loss = backward([&] { return solver(u0); }, {Policy::parse("dynamic:64MiB")});
//   remat::DynamicCounters d = remat::counters().dynamic;   // evictions, rematerializations, ...
//
//   // or as a scope of its own
//   { remat::DynamicScope scope(64 << 20); Tensor l = f(x); l.backward(); }
//
// dynamic:BYTES (Dynamic Tensor Rematerialization, Kirisame et al., ICLR 2021). While the policy
// is in force every op's lineage is kept: the op (its forward, as an autodiff::OpReplay) and the
// values it read (references to how those were made, or the values themselves when they were not
// made by an op: parameters, inputs). Every value saved for a backward pass goes through the
// saved-value hooks (remat/saved_hooks.h) into the runtime, which holds its storage and counts it.
// Whenever holding one more saved storage would take the live saved bytes above BYTES, the runtime
// evicts the held storage with the lowest score
//     h(t) = cost(t) / (bytes(t) * staleness(t))
// where cost(t) is the estimated time of the op that made t plus that of every evicted value its
// recomputation would need first. The estimate is a roofline formula, FLOPs / F + bytes read and
// written / M with F / M = 10 FLOP per byte (these CPUs' balance), not a measurement, so that an
// elementwise op is not counted hundreds of times cheaper than the matmul beside it and decisions
// stay reproducible. The evicted ancestors are found by a walk of at most 64 values (the paper's
// "evicted neighbourhood", computed directly instead of with its union-find approximation,
// because the graphs of one step are small). Staleness is the number of op
// calls and saved-value reads since t was last used (a logical clock: decisions, and so peak
// memory, do not depend on timing noise). Only storages the runtime alone holds are evictable
// (evicting one that the program still holds would free nothing), and never one in use. An
// evicted value read by the backward pass is recomputed from its op and that op's inputs, which
// are recomputed first if they were evicted too; random ops replay their captured generator
// state, so gradients are bitwise equal to save-all on the CPU. The unit of eviction is the
// storage: views share their base's. Regions compose: their kept inputs are saved values too.
// A budget that no eviction can meet (the values an op needs at once exceed it) is a remat::Error
// naming the smallest feasible budget seen so far in bytes and MiB (a lower bound: the rest of the
// step may need more) and, once dynamic_feasible_range measured one on this thread, the smallest
// budget of the whole step; the op fails, nothing else changes. counters().dynamic.smallest_feasible_bytes reports the smallest budget the steps run
// so far needed (the largest of those needs).
// Requirement on ops: an op's forward must be a pure function of its inputs and of what it
// captured, apart from a declared side effect, which a rematerialization skips (docs/design.md,
// "Side effects"). A rematerialized value that differs from the evicted one, or an input changed
// in place since the op read it, is a remat::Error (remat::set_recomputation_check).
//
// dynamic:BYTES+offload:DIR[,threshold=BYTES]. As dynamic:BYTES, but an evicted value of at least
// `threshold` bytes whose recomputation the roofline estimates dearer than writing it out and
// reading it back (2e-10 s a byte, each way) is written to a nameless file in DIR when it is
// evicted and read back, not recomputed, when the backward pass needs it (its digest checked);
// the eviction score takes the cheaper way back. Only CPU values are written. The writes happen
// in the evicting thread; `ram=` does not apply (a remat::Error). Results are the same bits.
//
// offload:DIR[,threshold=BYTES][,ram=BYTES]. Saved values of at least `threshold` bytes (default
// 1 MiB) are written by a background thread to a file in DIR and dropped from memory once written;
// smaller ones stay where they are. A value saved on a device other than the CPU is copied to host
// memory first (its device memory is freed) and comes back to that device, counted there as saved,
// when the backward pass reads it. The backward pass gets values back ahead of need where it can;
// gradients are bitwise equal to save-all's. `ram` bounds the bytes of values in flight (written or
// read but not yet dropped); the forward waits when it is reached (counted as stall). DIR never
// shows a file of ours, on any exit path; the file is kept, one per directory, for the next scope,
// and release_offload_files() closes the kept files. A directory that cannot be written, or a write
// that fails (a full disk), is a remat::Error at the next saved value or read, and nothing is
// lost: a value whose write failed stays in memory. The allocator counts values in flight and
// values handed back while the backward pass uses them, not the kernel's page cache. Values read
// back from the file's mapped pages share the fate of any mapped file: a disk that fails to read
// them gives SIGBUS. How (the nameless mapped file, read-back, lending a core to the writer, device
// values): the Notes of src/saved/offload.cpp and offload_file.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace remat {

struct DynamicCounters {
  uint64_t evictions = 0;
  uint64_t rematerializations = 0;
  double remat_flops = 0;
  double remat_seconds = 0;
  size_t smallest_feasible_bytes = 0;  // dynamic: the largest need seen (a lower bound of any feasible budget)
  size_t peak_held_bytes = 0;          // dynamic: the most saved bytes held at once (what the budget bounds)
  uint64_t offloaded = 0;              // offload: values written to disk
  size_t bytes_offloaded = 0;
  size_t bytes_prefetched = 0;         // read back ahead of need
  size_t bytes_read_on_demand = 0;     // read back when the backward pass needed them
  size_t bytes_mapped = 0;             // of those read back, the bytes handed over as mapped file pages
  double stall_seconds = 0;            // waiting for writes (ram bound) or reads
};

struct OffloadOptions {
  std::string directory;
  size_t threshold_bytes = size_t{1} << 20;
  size_t ram_bytes = 0;  // 0: no bound
  // For tests: writes fail (as on a full disk) once this many bytes were written; 0: never.
  size_t fail_after_bytes = 0;
  // For tests: each write takes at least this long (a slow disk); 0: as long as it takes.
  double write_delay_seconds = 0;
};

// Dynamic rematerialization under `budget_bytes` for the lifetime of the scope (this thread);
// with `evict_to` (dynamic:BYTES+offload:DIR), evicted values are written there where that is
// cheaper than recomputing them (see dynamic:BYTES above).
class DynamicScope {
 public:
  explicit DynamicScope(size_t budget_bytes, std::optional<OffloadOptions> evict_to = std::nullopt);
  ~DynamicScope();
  DynamicScope(const DynamicScope&) = delete;
  DynamicScope& operator=(const DynamicScope&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};


// Offloading of saved values for the lifetime of the scope (this thread).
class OffloadScope {
 public:
  explicit OffloadScope(const OffloadOptions& options);
  ~OffloadScope();
  OffloadScope(const OffloadScope&) = delete;
  OffloadScope& operator=(const OffloadScope&) = delete;

  // Blocks until every write started so far is on disk (their memory copies are then dropped,
  // and the backward pass reads them back, ahead of need where it can). Rethrows a failed write.
  void wait_for_writes();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Closes the files that ended offload scopes kept for the next ones (see offload:DIR above).
void release_offload_files();

// How fast a directory takes saved values and gives them back: 32 MiB written in 1 MiB pieces to
// a nameless file there (twice; the second pass, onto pages the file has, is timed) and read back
// (what a budget plan with an offload target charges per byte it offloads). Measured once per directory and process; a directory that cannot be
// written is a remat::Error naming it.
struct OffloadBandwidth {
  double write_bytes_per_second = 0;
  double read_bytes_per_second = 0;
  double seconds_per_byte() const { return 1.0 / write_bytes_per_second + 1.0 / read_bytes_per_second; }
};
OffloadBandwidth offload_bandwidth(const std::string& directory);

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
// is left as it was (but for peak_held_bytes); the other counters count the runs. The result is remembered on this thread: a later infeasible dynamic:
// budget's error names it beside the need the failing run saw. An error of the step other than an
// infeasible budget is rethrown.
struct DynamicRange {
  size_t smallest_budget_bytes = 0;  // runs the step; one byte less fails (or it is 1)
  size_t save_all_peak_bytes = 0;    // held with nothing evicted
  int runs = 0;                      // of `step`
};
DynamicRange dynamic_feasible_range(const std::function<void()>& step);

namespace detail {
bool dynamic_running();  // a DynamicScope is alive on this thread
bool offload_running();  // an OffloadScope is alive on this thread
// Which values an offload store writes while a gate is alive on this thread (gates nest): none
// (closed), those of at least the threshold (the default, with no gate), or every one (a node a
// budget plan offloads: the plan counts all of its bytes as gone; call.cpp). A gate may also set
// a cap on the CPU allocator's saved bytes (0: none; the one-argument form keeps the enclosing
// gate's): before the store keeps or writes a value that would lift the saved bytes above it,
// it waits for its writes in flight, oldest first, until the value fits or none is left. A budget
// plan caps its scope at its predicted peak, so that offloaded nodes' writes overlap the nodes
// after them (Note [writes behind a plan's peak] in src/saved/offload.cpp).
class OffloadGate {
 public:
  enum class Mode { closed, threshold, every_value };
  explicit OffloadGate(Mode mode);
  OffloadGate(Mode mode, size_t saved_cap_bytes);
  ~OffloadGate();
  OffloadGate(const OffloadGate&) = delete;
  OffloadGate& operator=(const OffloadGate&) = delete;

 private:
  Mode previous_;
  size_t previous_cap_;
};
}  // namespace detail

}  // namespace remat
