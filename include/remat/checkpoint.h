// remat/checkpoint.h - checkpoint regions: forward without keeping, recompute in backward.
//
//   // a block run as a region: its internals are not kept; the backward re-runs it once
//   Tensor y = remat::checkpoint([&](const Tensor& h) { return mlp_block(h); }, x);
//
//   // or set it once for a whole model: every layer call becomes a region (an nn::Module's
//   // children, or a remat::Chain's: remat/chain.h, included here)
//   remat::ScopedPolicy policy(remat::Policy::parse("every-layer"));   // the default anyway
//   Tensor loss = remat::mean(model->forward(x));
//   loss.backward();
//
// How it works. checkpoint(fn, inputs) runs fn with recording off: no node is created inside, so
// nothing its ops would save is kept. It keeps the inputs, the RNG state at entry and (selective
// policy) the outputs of the kept op kinds, and records one region node whose edges lead to the
// inputs and to every tensor requiring grad that fn used without receiving it as an input
// (captured parameters, found while fn ran). In the backward pass the region node restores the
// RNG state, re-runs fn with recording on (a fresh sub-tape; inner regions met there become
// regions again: multi-level checkpointing), runs the backward of that sub-tape only, hands the
// gradients on along its own edges (so a captured parameter's gradient is accumulated exactly
// once, by the outer backward), and frees the sub-tape. Re-running fn never goes through
// checkpoint() for this region again, so there is no recursion through the rule.
//
// Memory. For a chain of N regions with boundary (input) bytes b each and internal saved bytes
// I (what one region's ops keep when recorded), the peak of saved bytes under every-layer is
//     peak_saved <= N * b + I + g
// where g is one gradient-sized temporary (the loss op's own saved input), against about
// N * (I + b) under save-all. Under every-k:K: (N / K) * b + K * I + g. Tests check it with the
// allocator's counters.
//
// Exact replay. Recomputation restores the RNG state captured at region entry, so dropout masks
// are identical; on the CPU, gradients under every policy are bitwise equal to save-all. State
// that must change once per step (running statistics) is an op's declared side effect, which no
// recomputation repeats (docs/design.md, "Side effects"), or is left alone while
// is_recomputing() is true.
#pragma once

#include <concepts>
#include <functional>
#include <optional>
#include <string>

#include "remat/autodiff.h"
#include "remat/budget.h"
#include "remat/call.h"
#include "remat/chain.h"  // Chain, which existing code finds here
#include "remat/counters.h"
#include "remat/dynamic.h"
#include "remat/offload.h"
#include "remat/policy.h"
#include "remat/tensor.h"

namespace remat {

struct CheckpointOptions {
  std::optional<Policy> policy;  // per-layer override
  std::string label;             // names the region in counters
  std::shared_ptr<RegionProfile> profile;  // if set, the region writes its timings and sizes here
};

// Regions (explicit ones, and layers marked as layers inside other layers) nest at most this deep;
// a deeper one is a remat::Error naming the depth.
inline constexpr int kMaxRegionNesting = 256;

// Runs fn(inputs) as a checkpoint region under the effective policy (save-all: a plain call).
TensorList checkpoint(const RegionFn& fn, const TensorList& inputs, const CheckpointOptions& options = {});
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input,
                  const CheckpointOptions& options = {});

// True while a region's function is being re-run by the backward pass.
bool is_recomputing();

// set_recomputation_check / recomputation_check: remat/autodiff.h (every form of recomputation).

// ---- per-call policy ("backend option"): the forward runs under `policy`, then the backward.
struct GradOptions {
  std::optional<Policy> policy;
  bool retain_graph = false;
};
// Gradients of f(inputs) (a scalar) with respect to inputs (which must require grad).
TensorList grad(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
                const GradOptions& options);
// Runs loss = f() under the policy, back-propagates into leaves' .grad(), returns the loss.
Tensor backward(const std::function<Tensor()>& f, const GradOptions& options);

// ---- counters (remat/counters.h: what each field counts)
Counters counters();
void reset_counters();

// A table of the regions since the last reset_counters(), one row per region: dotted name,
// boundary bytes kept, bytes its ops saved when re-run, forward / recompute / backward time and
// recomputations, with totals. `save_all_peak_bytes`, when known (measured by running the same
// step under save-all), is printed beside the totals.
std::string memory_report(size_t save_all_peak_bytes = 0);
std::string memory_report(const Counters& counters, size_t save_all_peak_bytes);

// ---- warnings
// A backward pass under a recomputing policy that met no region prints one warning per thread
// (naming the policy and how to get regions) through the warning handler; the default handler
// writes "remat: warning: ..." to stderr. Pass nullptr to restore the default, or a function that
// ignores its argument to silence warnings.
using WarningHandler = std::function<void(const std::string&)>;
void set_warning_handler(WarningHandler handler);
void warn(const std::string& message);

}  // namespace remat
