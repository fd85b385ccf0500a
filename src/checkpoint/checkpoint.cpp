// Explicit checkpoint regions, per-call policies, counters, the memory report and warnings. The
// region itself is a segment (segment.cpp); the layer-call rule in call.cpp.
#include "remat/checkpoint.h"

#include <cstdio>
#include <mutex>
#include <sstream>

#include "saved/dynamic_internal.h"
#include "budget_internal.h"
#include "region.h"
#include "remat/memory.h"
#include "tensor/device_time.h"

namespace remat {

detail::RegionCounters& detail::region_counters() {
  thread_local RegionCounters c;
  return c;
}

namespace {

std::mutex warning_mutex;
WarningHandler warning_handler;  // guarded by warning_mutex; empty: stderr

// Warns once per thread when a backward pass under a recomputing policy met no region and no loop
// that recomputes (scan, while_loop), and the forward made no layer call (layer calls that all
// chose to keep everything, e.g. by their own save-all policy or a budget plan of stages only, are
// a decision, not an oversight). A backward with no forward op since the last one (a second
// backward through a retained graph) is not judged: its forward was.
void on_backward_end(bool may_warn) {
  detail::check_budget();  // Note [a budget compared at every step]
  auto& rc = detail::region_counters();
  const uint64_t regions = rc.run_in_backward + rc.loops_run_in_backward, calls = rc.layer_calls_since_backward;
  rc.run_in_backward = 0;
  rc.loops_run_in_backward = 0;
  rc.layer_calls_since_backward = 0;
  const autodiff::OpCounters ops = autodiff::op_counters();
  thread_local uint64_t first_run_ops_then = 0;
  const uint64_t first_run_ops = ops.forward_ops - ops.recomputed_ops;
  const bool forward_since = first_run_ops != first_run_ops_then;
  first_run_ops_then = first_run_ops;
  thread_local bool warned = false;
  if (!may_warn || !forward_since || regions > 0 || calls > 0 || warned) return;
  const Policy policy = current_policy();
  if (!policy.keep.recomputes()) return;  // dynamic and offload work on saved values, not regions
  warned = true;
  warn(detail::concat(
      "the backward pass ran under policy ", policy.to_string(),
      " but met no checkpoint region, so nothing was recomputed and every intermediate was kept. Regions come "
      "from layer calls: call your layers through a module (child->forward(x) inside a Module's forward_impl, "
      "or nn::Sequential / remat::Chain), or wrap a block in remat::checkpoint(fn, x); use save-all to keep "
      "everything without this warning"));
}

const bool backward_listener_registered = [] {
  autodiff::set_backward_listener(&on_backward_end);
  return true;
}();

}  // namespace

bool is_recomputing() { return autodiff::recompute_depth() > 0; }

void set_warning_handler(WarningHandler handler) {
  std::lock_guard<std::mutex> lock(warning_mutex);
  warning_handler = std::move(handler);
}

void warn(const std::string& message) {
  WarningHandler handler;
  {
    std::lock_guard<std::mutex> lock(warning_mutex);
    handler = warning_handler;
  }
  if (handler) {
    handler(message);
  } else {
    std::fprintf(stderr, "remat: warning: %s\n", message.c_str());
    std::fflush(stderr);
  }
}

TensorList checkpoint(const RegionFn& fn, const TensorList& inputs, const CheckpointOptions& options) {
  REMAT_CHECK(static_cast<bool>(fn), "checkpoint: the region function is empty");
  for (size_t i = 0; i < inputs.size(); ++i) REMAT_CHECK(inputs[i].defined(), "checkpoint: input ", i, " is undefined");
  Policy policy = options.policy.value_or(current_policy());
  // an explicit region inside a model planned under a budget is one region, as asked
  if (!options.policy && policy.keep.kind == Policy::Kind::budget) policy = Policy::every_layer();
  REMAT_CHECK(policy.keep.kind != Policy::Kind::budget,
              "checkpoint: a budget policy applies to a model's layer calls or a Chain (the planner chooses the "
              "regions), not to a single region");
  CallSite site;
  site.label = options.label.empty() ? "region" : options.label;
  site.role = CallRole::layer;
  site.policy = policy;
  return detail::explicit_region(fn, inputs, site, options.profile);
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input, const CheckpointOptions& options) {
  REMAT_CHECK(static_cast<bool>(fn), "checkpoint: the region function is empty");
  return checkpoint([fn](const TensorList& in) { return TensorList{fn(in[0])}; }, TensorList{input}, options)[0];
}

TensorList grad(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs, const GradOptions& options) {
  std::optional<ScopedPolicy> scope;
  if (options.policy) scope.emplace(*options.policy);
  Tensor loss = f(inputs);
  return grad(TensorList{loss}, inputs, TensorList{}, options.retain_graph);
}

Tensor backward(const std::function<Tensor()>& f, const GradOptions& options) {
  std::optional<ScopedPolicy> scope;
  if (options.policy) scope.emplace(*options.policy);
  Tensor loss = f();
  backward(TensorList{loss}, TensorList{}, options.retain_graph);
  return loss;
}

Counters counters() {
  detail::settle_device_seconds();  // the regions' times, read off the devices' marks
  Counters c;
  c.ops = autodiff::op_counters();
  const auto& rc = detail::region_counters();
  c.regions_created = rc.created;
  c.regions_recomputed = rc.recomputed;
  c.layer_calls = rc.layer_calls;
  c.regions = rc.records;
  c.dynamic = detail::dynamic_counters();
  c.budget = detail::budget_counters();
  return c;
}

void reset_counters() {
  detail::settle_device_seconds();  // readings still pending belong to the records cleared here
  autodiff::reset_op_counters();
  auto& rc = detail::region_counters();
  rc.created = 0;
  rc.recomputed = 0;
  rc.layer_calls = 0;
  rc.records.clear();
  rc.first_record_of.clear();
  detail::dynamic_counters() = {};
  detail::budget_counters() = {};
}

std::string memory_report(size_t save_all_peak_bytes) { return memory_report(counters(), save_all_peak_bytes); }

std::string memory_report(const Counters& c, size_t save_all_peak_bytes) {
  std::ostringstream out;
  char line[320];
  std::snprintf(line, sizeof line, "%-28s %8s %5s %12s %12s %10s %10s %10s %7s %11s %11s\n", "region", "kind",
                "calls", "kept", "re-run saved", "forward", "recompute", "backward", "re-runs", "re-run FLOP",
                "skipped");
  out << line;
  size_t kept = 0, rerun = 0, cached = 0;
  double forward = 0, recompute = 0, backward = 0, flops = 0, skipped = 0;
  uint64_t reruns = 0;
  for (const auto& r : c.regions) {
    std::string label = r.label.size() > 28 ? r.label.substr(0, 25) + "..." : r.label;
    std::snprintf(line, sizeof line, "%-28s %8s %5zu %12s %12s %9.2fms %9.2fms %9.2fms %7llu %11.4g %11.4g\n",
                  label.c_str(), r.kind.c_str(), r.calls,
                  memory::format_bytes(static_cast<double>(r.boundary_bytes + r.cached_bytes)).c_str(),
                  memory::format_bytes(static_cast<double>(r.recomputed_saved_bytes)).c_str(), r.forward_seconds * 1e3,
                  r.recompute_seconds * 1e3, r.backward_seconds * 1e3, static_cast<unsigned long long>(r.recomputations),
                  r.recomputed_flops, r.skipped_flops);
    out << line;
    flops += r.recomputed_flops;
    skipped += r.skipped_flops;
    kept += r.boundary_bytes + r.cached_bytes;
    cached += r.cached_bytes;
    rerun += r.recomputed_saved_bytes;
    forward += r.forward_seconds;
    recompute += r.recompute_seconds;
    backward += r.backward_seconds;
    reruns += r.recomputations;
  }
  std::snprintf(line, sizeof line, "%-28s %8s %5llu %12s %12s %9.2fms %9.2fms %9.2fms %7llu %11.4g %11.4g\n", "total",
                "", static_cast<unsigned long long>(c.layer_calls), memory::format_bytes(static_cast<double>(kept)).c_str(),
                memory::format_bytes(static_cast<double>(rerun)).c_str(), forward * 1e3, recompute * 1e3, backward * 1e3,
                static_cast<unsigned long long>(reruns), flops, skipped);
  out << line;
  out << c.regions.size() << " regions, " << c.layer_calls << " layer calls; regions keep "
      << memory::format_bytes(static_cast<double>(kept)) << " (of which selective caches "
      << memory::format_bytes(static_cast<double>(cached)) << ") where their ops would keep "
      << memory::format_bytes(static_cast<double>(rerun)) << " when recorded";
  if (save_all_peak_bytes > 0)
    out << "; save-all's measured peak of saved bytes: " << memory::format_bytes(static_cast<double>(save_all_peak_bytes));
  out << "\n";
  return out.str();
}

}  // namespace remat
