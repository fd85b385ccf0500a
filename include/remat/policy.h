// remat/policy.h - what a backward pass keeps, as a printable value.
//
//   save-all        keep everything every op's backward needs (no recomputation)
//   every-layer     keep only the boundaries between layers; recompute each layer once (default)
//   every-k:K       keep every K-th boundary; recompute segments of K layers (1 <= K <= 2^31 - 1)
//   selective:OPS   like every-layer, but inside each region keep the outputs of the listed op
//                   kinds (comma-separated, e.g. selective:matmul) and recompute the rest; the
//                   kinds are those of autodiff::op_kinds(), and an unknown one is an error
//                   that lists them
//   budget:BYTES    keep what fits in BYTES (units: B, KB, KiB, MB, MiB, GB, GiB, TB, TiB; at most
//                   2^63 - 1 bytes), chosen by the planner at the least recomputation
//   budget:auto     a budget from the machine: the memory the run may use (the device's free memory
//                   plus what remat holds there; on the CPU the smaller of the host's available
//                   memory and the cgroup's limit), less what the run holds besides saved values
//                   (parameters, gradients, optimizer state, temporaries: the allocator's peaks in
//                   the profiling steps). When save-all's peak fits, the plan is save-all.
//   budget:auto,limit=BYTES
//                   the same, with the memory the run may use capped at BYTES (--memory-limit)
//   dynamic:BYTES   any program: keep saved values up to BYTES, evict the cheapest to recompute
//                   beyond, recompute evicted ones when the backward needs them (remat/dynamic.h)
//
// Where kept values live is the second axis: in memory (the default), or in files:
//   KEEP+offload:DIR[,threshold=BYTES][,ram=BYTES]     e.g. every-layer+offload:/scratch
//                   KEEP (any form above) decides what is kept; kept values of at
//                   least `threshold` bytes are written to files in DIR and read back for the
//                   backward pass (remat/dynamic.h). Under every-layer those are the layer
//                   boundaries; values a region saves while it is re-run in the backward pass
//                   stay in memory (its backward reads them at once). Under budget: the plan
//                   chooses which layer calls' kept values are written (remat/budget.h).
//   offload:DIR[,...]  short for save-all+offload:DIR[,...]
// dynamic:BYTES+offload:DIR[,threshold=BYTES] writes the values it evicts to DIR where that is
// cheaper than recomputing them, and reads them back (remat/dynamic.h); ram= does not apply to it.
// Parsing is strict: no sign, no trailing characters, no value that does not fit.
//
// Three ways to set it, most specific first (the first one present wins):
//   1. a per-layer or per-container override (CheckpointOptions::policy, Chain::set_policy,
//      the policy argument of Chain::add),
//   2. a per-call option on remat::grad / remat::backward (GradOptions::policy),
//   3. the thread-local scoped default (remat::ScopedPolicy guard(Policy::parse("save-all"))),
//   and every-layer when none is set.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace remat {

// Where kept values go when they are not kept in memory (see offload: above).
struct OffloadTarget {
  std::string directory;
  size_t threshold_bytes = size_t{1} << 20;  // smaller saved values stay in memory
  size_t ram_bytes = 0;                      // bound on values in flight (0: none)
  std::string to_string() const;             // "offload:DIR,threshold=N[,ram=N]"
  bool operator==(const OffloadTarget&) const = default;
};

struct Policy {
  // What regions keep (the first axis).
  enum class Kind { save_all, every_layer, every_k, selective, budget, dynamic };
  Kind kind = Kind::every_layer;
  int k = 1;                        // every_k
  std::vector<std::string> ops;     // selective
  size_t budget_bytes = 0;          // budget (0 for budget:auto until planned), dynamic
  bool budget_auto = false;         // budget:auto
  size_t memory_limit_bytes = 0;    // budget:auto: the most memory the run may use (0: the device's)
  // Where kept values live (the second axis): in memory, or written to files.
  std::optional<OffloadTarget> offload_to;

  static Policy save_all() { return of_kind(Kind::save_all); }
  static Policy every_layer() { return of_kind(Kind::every_layer); }
  static Policy every_k(int k);
  static Policy selective(std::vector<std::string> ops);
  static Policy budget(size_t bytes);
  static Policy budget_from_memory(size_t memory_limit_bytes = 0);  // budget:auto[,limit=BYTES]
  static Policy dynamic(size_t bytes);
  // save-all, kept values offloaded (offload:DIR)
  static Policy offload(std::string directory, size_t threshold_bytes = size_t{1} << 20, size_t ram_bytes = 0);
  // This policy's keep axis with its kept values offloaded to `target` (KEEP+offload:...); a
  // dynamic: policy with a ram= bound is a remat::Error (see above).
  Policy with_offload(OffloadTarget target) const;
  // The keep axis alone (kept values in memory).
  Policy keep() const;
  // Parses the forms above; a malformed string throws remat::Error listing the valid forms.
  static Policy parse(const std::string& text);
  std::string to_string() const;
  bool recomputes() const { return kind != Kind::save_all; }
  // Whether layer calls become regions (dynamic acts on saved values, not layers).
  bool makes_regions() const { return recomputes() && kind != Kind::dynamic; }
  // Whether the policy starts a saved-value runtime (dynamic:, or an offload target).
  bool has_runtime() const { return kind == Kind::dynamic || offload_to.has_value(); }
  bool keeps_op(const std::string& op) const;  // selective: is `op` among the kept kinds?
  bool operator==(const Policy&) const = default;

 private:
  static Policy of_kind(Kind kind) {
    Policy p;
    p.kind = kind;
    return p;
  }
};

// The policy in force on this thread (scoped default, or every-layer).
Policy current_policy();

// Sets the thread's default policy for its lifetime (nests; restores the previous on exit).
// A dynamic: policy or one with an offload target also starts its runtime (remat/dynamic.h) for
// the scope. Inside a scope whose runtime is running, a policy with the same dynamic: budget or
// the same offload target continues it (the keep axis may differ; dynamic:N continues
// dynamic:N+offload:...); any other dynamic or offload
// policy (or one inside a DynamicScope / OffloadScope made directly) is a remat::Error.
class ScopedPolicy {
 public:
  explicit ScopedPolicy(Policy policy);
  explicit ScopedPolicy(const std::string& policy) : ScopedPolicy(Policy::parse(policy)) {}
  ~ScopedPolicy();
  ScopedPolicy(const ScopedPolicy&) = delete;
  ScopedPolicy& operator=(const ScopedPolicy&) = delete;

 private:
  std::optional<Policy> previous_;
  std::shared_ptr<void> runtime_;
};

}  // namespace remat
