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
//   dynamic:BYTES   any program: keep saved values up to BYTES, evict the cheapest to recompute
//                   beyond, recompute evicted ones when the backward needs them (remat/dynamic.h)
//   offload:DIR[,threshold=BYTES][,ram=BYTES]
//                   keep everything, but write saved values of at least `threshold` bytes to
//                   files in DIR and read them back for the backward pass (remat/dynamic.h)
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

struct Policy {
  enum class Kind { save_all, every_layer, every_k, selective, budget, dynamic, offload };
  Kind kind = Kind::every_layer;
  int k = 1;                       // every_k
  std::vector<std::string> ops;    // selective
  size_t budget_bytes = 0;         // budget, dynamic
  std::string directory;           // offload
  size_t threshold_bytes = 0;      // offload: smaller saved values stay in memory
  size_t ram_bytes = 0;            // offload: bound on values in flight (0: none)

  static Policy save_all() { return {Kind::save_all, 1, {}, 0, {}, 0, 0}; }
  static Policy every_layer() { return {Kind::every_layer, 1, {}, 0, {}, 0, 0}; }
  static Policy every_k(int k);
  static Policy selective(std::vector<std::string> ops);
  static Policy budget(size_t bytes);
  static Policy dynamic(size_t bytes);
  static Policy offload(std::string directory, size_t threshold_bytes = size_t{1} << 20, size_t ram_bytes = 0);
  // Parses the forms above; a malformed string throws remat::Error listing the valid forms.
  static Policy parse(const std::string& text);
  std::string to_string() const;
  bool recomputes() const { return kind != Kind::save_all && kind != Kind::offload; }
  // Whether layer calls become regions (dynamic and offload act on saved values, not layers).
  bool makes_regions() const { return recomputes() && kind != Kind::dynamic; }
  bool keeps_op(const std::string& op) const;  // selective: is `op` among the kept kinds?
  bool operator==(const Policy&) const = default;
};

// The policy in force on this thread (scoped default, or every-layer).
Policy current_policy();

// Sets the thread's default policy for its lifetime (nests; restores the previous on exit).
// A dynamic or offload policy also starts its runtime (remat/dynamic.h) for the scope. Inside a
// scope whose runtime is running, the same policy again continues it; any other dynamic or
// offload policy (or one inside a DynamicScope / OffloadScope made directly) is a remat::Error.
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
