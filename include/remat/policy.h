// remat/policy.h - what a backward pass keeps and where kept values live, as a printable value.
//
// A Policy is two values. `keep` says what layer calls keep:
//   save-all        everything every op's backward needs (no recomputation)
//   every-layer     only the boundaries between layers; recompute each layer once (default)
//   every-k:K       every K-th boundary; recompute segments of K layers (1 <= K <= 2^31 - 1)
//   selective:OPS   like every-layer, but inside each region keep the outputs of the listed op
//                   kinds (comma-separated, e.g. selective:matmul) and recompute the rest; the
//                   kinds are those of autodiff::op_kinds(), and an unknown one is an error
//                   that lists them
//   budget:BYTES    what fits in BYTES (units: B, KB, KiB, MB, MiB, GB, GiB, TB, TiB; at most
//                   2^63 - 1 bytes), chosen by the planner at the least recomputation (remat/budget.h)
//   budget:auto     a budget from the machine: the memory the run may use (the device's free memory
//                   plus what remat holds there; on the CPU the smaller of the host's available
//                   memory and the cgroup's limit), less what the run holds besides saved values
//                   (parameters, gradients, optimizer state, temporaries: the allocator's peaks in
//                   the profiling steps). When save-all's peak fits, the plan is save-all.
//   budget:auto,limit=BYTES
//                   the same, with the memory the run may use capped at BYTES (--memory-limit)
// `saved` says where kept values live: in memory (the default), or
//   dynamic:BYTES   held up to BYTES; beyond, the cheapest to recompute are evicted and recomputed
//                   when the backward needs them (remat/dynamic.h). Its keep axis is save-all:
//                   the runtime decides value by value, so it is written alone
//   offload:DIR[,threshold=BYTES][,ram=BYTES]
//                   kept values of at least `threshold` bytes (default 1 MiB) are written to a
//                   file in DIR and read back for the backward pass (remat/offload.h). Under
//                   every-layer those are the layer boundaries; values a region saves while it is
//                   re-run in the backward pass stay in memory (its backward reads them at once).
//                   Under budget: the plan chooses which layer calls' kept values are written.
//   dynamic:BYTES+offload:DIR[,threshold=BYTES]
//                   both: evicted values are written to DIR where that is cheaper than recomputing
//                   them, and read back (remat/dynamic.h); ram= does not apply to it
// As text: KEEP+offload:DIR[,...] (e.g. every-layer+offload:/scratch); offload:DIR[,...] alone
// is save-all+offload:DIR[,...]. Parsing is strict: no sign, no trailing characters, no value
// that does not fit. A policy prints as it parses (to_string).
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

#include "remat/offload.h"

namespace remat {

// What layer calls keep (the first axis).
struct Keep {
  enum class Kind { save_all, every_layer, every_k, selective, budget };
  Kind kind = Kind::every_layer;
  int k = 1;                        // every_k
  std::vector<std::string> ops;     // selective
  size_t budget_bytes = 0;          // budget (0 for budget:auto until planned)
  bool budget_auto = false;         // budget:auto
  size_t memory_limit_bytes = 0;    // budget:auto: the most memory the run may use (0: the device's)

  bool recomputes() const { return kind != Kind::save_all; }
  bool keeps_op(const std::string& op) const;  // selective: is `op` among the kept kinds?
  std::string to_string() const;               // "every-k:2", "budget:1048576", ...
  bool operator==(const Keep&) const = default;
};

// Where kept values live (the second axis): in memory, up to a dynamic: budget, in an offload
// target, or both of the last two.
struct Saved {
  size_t dynamic_bytes = 0;              // dynamic:BYTES (0: none)
  std::optional<OffloadTarget> offload;  // offload:DIR[,...]

  bool in_memory() const { return dynamic_bytes == 0 && !offload; }
  // Whether a saved-value runtime runs (dynamic:, or an offload target).
  bool has_runtime() const { return !in_memory(); }
  std::string to_string() const;  // "memory", "dynamic:N", "offload:...", "dynamic:N+offload:..."
  bool operator==(const Saved&) const = default;
};

struct Policy {
  using Kind = Keep::Kind;
  Keep keep;
  Saved saved;

  static Policy save_all() { return of_kind(Kind::save_all); }
  static Policy every_layer() { return of_kind(Kind::every_layer); }
  static Policy every_k(int k);
  static Policy selective(std::vector<std::string> ops);
  static Policy budget(size_t bytes);
  static Policy budget_from_memory(size_t memory_limit_bytes = 0);  // budget:auto[,limit=BYTES]
  static Policy dynamic(size_t bytes);                              // save-all, saved under dynamic:BYTES
  // save-all, kept values offloaded (offload:DIR)
  static Policy offload(std::string directory, size_t threshold_bytes = size_t{1} << 20, size_t ram_bytes = 0);
  // This policy with its kept values offloaded to `target` (KEEP+offload:..., or
  // dynamic:BYTES+offload:...); ram= with dynamic: is a remat::Error (see above).
  Policy with_offload(OffloadTarget target) const;
  // The keep axis alone, kept values in memory.
  Policy in_memory() const { return Policy{keep, {}}; }
  // Whether anything may be recomputed: a keep axis other than save-all, or dynamic: (which
  // recomputes the values it evicts).
  bool recomputes() const { return keep.recomputes() || saved.dynamic_bytes > 0; }
  // Parses the forms above; a malformed string throws remat::Error listing the valid forms.
  static Policy parse(const std::string& text);
  std::string to_string() const;
  // Checks the two values go together: dynamic: only with save-all (it decides what is kept
  // itself), ram= not with dynamic:, a budget positive, an offload directory not empty. Throws
  // remat::Error naming the policy. parse() and ScopedPolicy check it.
  void validate() const;
  bool operator==(const Policy&) const = default;

 private:
  static Policy of_kind(Kind kind) {
    Policy p;
    p.keep.kind = kind;
    return p;
  }
};

// The policy in force on this thread (scoped default, or every-layer).
Policy current_policy();

// Sets the thread's default policy for its lifetime (nests; restores the previous on exit).
// A policy whose kept values do not live in memory also starts its runtime (remat/dynamic.h,
// remat/offload.h) for the scope. Inside a scope whose runtime is running, a policy with the same
// `saved` value continues it (the keep axis may differ; dynamic:N continues
// dynamic:N+offload:...); any other dynamic or offload policy (or one inside a DynamicScope /
// OffloadScope made directly) is a remat::Error.
class ScopedPolicy {
 public:
  explicit ScopedPolicy(Policy policy);
  explicit ScopedPolicy(const std::string& policy) : ScopedPolicy(Policy::parse(policy)) {}
  ~ScopedPolicy();
  ScopedPolicy(const ScopedPolicy&) = delete;
  ScopedPolicy& operator=(const ScopedPolicy&) = delete;

  // Where this scope started an offload runtime (an offload: policy without dynamic:): returns
  // once every value handed to it so far is written out (OffloadScope::wait_for_writes), e.g.
  // between a forward pass and its backward; otherwise returns at once.
  void wait_for_offload_writes() const;

 private:
  std::optional<Policy> previous_;
  std::shared_ptr<void> runtime_;
  OffloadScope* offload_ = nullptr;  // runtime_, where it is an OffloadScope
};

}  // namespace remat
