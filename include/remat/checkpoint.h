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
// How it works. checkpoint(fn, inputs) runs fn as a segment: its ops run and are recorded as under
// save-all (the graph is save-all's: grad mode, detach, every edge to a captured parameter), but
// what their nodes save of the values fn's ops made is dropped, and the segment keeps instead each
// op's definition, the RNG state it started with and what its ops read from outside (fn's inputs,
// constants). In the backward pass, when a node first reads a dropped value, the segment runs the
// forwards of the ops those values need, for their values only, and fills every dropped value
// still held; each goes when its last node has run. fn itself never runs again, so there is no
// recursion through the rule and nothing fn does between its ops can differ; an explicit region
// inside fn is a segment of its own (multi-level checkpointing). Note [one graph] in
// src/checkpoint/segment.cpp.
//
// Memory. For a chain of N regions with boundary (input) bytes b each and internal saved bytes
// I (what one region's ops keep when recorded), the peak of saved bytes under every-layer is
//     peak_saved <= N * b + I + g
// where g is one gradient-sized temporary (the loss op's own saved input), against about
// N * (I + b) under save-all. Under every-k:K: (N / K) * b + K * I + g. Tests check it with the
// allocator's counters.
//
// Exact replay. Each op made again starts from the RNG state its first run started from, so dropout
// masks are identical; on the CPU, gradients under every policy are bitwise equal to save-all.
// State that an op must change once per step (running statistics) is its declared side effect,
// which no recomputation repeats (docs/design.md, "Side effects"); what fn's own code does runs
// once.
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

// True while a recomputation runs (a region's ops made again, a dynamic: rematerialization, a loop's
// step function run again): an op's forward, or a loop's step, can leave its effects alone then.
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
