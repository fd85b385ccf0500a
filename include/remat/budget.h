// remat/budget.h - the budget:BYTES policy: the layer calls of a model (or the children of a
// Chain) profiled once, planned by the rotor dynamic programme (remat/schedule.h; the grouped
// planner for chains too long for it), executed as nested checkpoint regions.
//
//   auto model = std::make_shared<MyModel>();          // any nn::Module, or a remat::Chain
//   remat::ScopedPolicy policy(remat::Policy::parse("budget:64MiB"));
//   for (int step = 0; step < steps; ++step) {
//     Tensor loss = mean(model->forward(x));  // steps 0-1 profile (every-layer), later steps run the plan
//     loss.backward();
//   }
//   model->planner()->report();               // the plan, its predicted peak and time
//   model->planner()->feasible_range();       // the smallest feasible budget, save-all's peak
//
// What is planned. The plan scope is the outermost call under the budget (the model's forward,
// or a Chain / container with its own budget policy). Its layer calls (remat/call.h), in the
// order they run and looking through containers, are the stages of a chain: stage i is the i-th
// layer call. This is the reduction of a model to a chain: a residual or parallel structure
// becomes the sequence of its layer calls, the ops between calls (adds, concatenations) belong to
// the region that covers them, and the values a region keeps are what its calls and those ops
// read from before it (the residual stream, a branch's shared input), measured.
//
// How. The first forwards under the budget (for the scope's input shapes; kProfilingSteps of
// them) run every layer call as its own region and the last of them records, per call, its
// forward time, the bytes it keeps (boundary), the bytes its ops keep when recorded (measured
// with the allocator while the region is re-run) and its backward time. Once that step's backward
// has finished, the next forward builds the cost model, asks the planner for the plan of least
// predicted time whose peak fits, and runs it: a stage runs its call with recording; a region is
// a segment over its calls (the ops between them included), with a segment of its own for each
// region nested in it, whose dropped values the backward pass makes again. A plan is for the
// layer calls it was made for (their labels and their inputs' shapes and dtypes): new input
// shapes profile and plan again (plans for a few shapes are kept and used again when those come
// back), and a step whose calls differ from its plan's makes the next one profile again. Every
// step's measured peak of saved bytes is compared with the budget; a step above it is counted
// (remat::counters().budget) and warned of, once per plan scope, shape and budget.
//
// The budget covers the whole step's saved bytes: the stages are planned within the budget minus
// the saved bytes that live outside them (kept by ops before the scope, measured at its entry,
// and by ops after it up to the loss, measured on the profiling step). The profiling steps run
// under every-layer and may exceed a budget below every-layer's peak. A budget below the smallest
// feasible one is an error naming that smallest budget in bytes and in human units.
//
// With an offload target (budget:BYTES+offload:DIR, budget:auto+offload:DIR), the plan may also
// offload a top-level node instead of keeping it in memory or recomputing it: a stage's record or
// a region's input goes to the target after the node's forward and comes back before its
// backward, charged at the directory's measured write and read bandwidth (remat/offload.h,
// offload_bandwidth). Only those nodes' values are written; the rest of the plan scope keeps its
// saved values in memory, and values saved outside the scope follow the offload rule of
// remat/offload.h. The profiling steps keep the scope's values in memory.
//
// budget:auto (remat/policy.h) derives the budget when the plan is made, once per profile: the
// memory the run may use (the memory limit if given and smaller, else the device's free memory
// plus what remat holds and caches there; on the CPU the host's available memory or the cgroup's
// room, the smaller) less what the profiled step held besides saved values. When save-all's peak
// fits, the plan is save-all and recomputes nothing; the report says which case it was. A run
// that holds more besides saved values than it may use is a remat::Error naming both.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "remat/offload.h"
#include "remat/policy.h"
#include "remat/schedule.h"
#include "remat/tensor.h"

namespace remat {

// Written by a checkpoint region that was given one (CheckpointOptions::profile).
struct RegionProfile {
  double forward_seconds = 0;    // first run
  double recompute_seconds = 0;  // the re-run of its ops, in the backward pass
  double backward_seconds = 0;   // its backward (from the re-run to the release of its last value)
  double forward_flops = 0;      // the first run's FLOP estimate (autodiff::OpCounters::forward_flops)
  size_t boundary_bytes = 0;     // inputs kept by the region
  size_t output_bytes = 0;
  size_t saved_bytes = 0;        // what the re-run's ops kept (allocator-measured)
  size_t saved_output_bytes = 0;  // of saved_bytes, the re-run's outputs themselves (e.g. tanh's)
  size_t saved_input_bytes = 0;   // of boundary_bytes, what the re-run's ops saved (e.g. a Linear's input)
  size_t streamed_bytes = 0;      // of saved_bytes, the most in memory at once when read back value by value
  // what a sweep from the previous call to this one keeps (read_by: this stage), as ChainCosts::swept_values
  std::vector<schedule::ChainCosts::SweptValue> sweep_kept;
  // what the ops between the previous call and this one save, as ChainCosts::gap_saved
  std::vector<schedule::ChainCosts::GapSaved> gap_saved;
  const RegionProfile* outputs_kept_by = nullptr;  // the profiled region that kept its outputs as inputs
  size_t outputs_kept_bytes = 0;                   // the bytes it kept of them
  size_t saved_live_at_backward = 0;  // live saved bytes when its backward started
  size_t saved_peak_at_backward = 0;  // and the allocator's saved peak at that moment
  size_t held_peak_at_backward_end = 0;  // the sum of the per-tag peaks but saved, when its backward ended
  bool backward_done = false;
};

class BudgetPlanner {
 public:
  struct Report {
    Shape input_shape;                 // the plan scope's first input
    std::vector<Shape> signature;      // all its inputs' shapes
    std::vector<std::string> stage_labels;  // the layer call of each stage
    std::vector<double> stage_forward_flops;  // each stage's forward, FLOP estimate (profiled)
    std::string policy;                // the keep axis planned for, e.g. "budget:auto"
    size_t budget_bytes = 0;           // for budget:auto, the budget derived (see below)
    // budget:auto: the memory the run may use, what limited it, and what the run holds besides
    // saved values (the sum of the allocator's per-tag peaks but saved, when the profiled step's
    // backward left the chain: parameters, gradients, optimizer state, temporaries); the budget
    // is their difference.
    bool automatic = false;
    size_t memory_capacity_bytes = 0;
    std::string capacity_source;      // e.g. "the memory limit", "the host's available memory"
    size_t held_besides_saved_bytes = 0;
    // KEEP+offload:DIR: where offloaded nodes go (else empty), the directory's measured bandwidth
    // as the plan prices it (remat::offload_price: the page cache's or the disk's, as
    // offload_priced_as says; costs.offload_seconds_per_byte, 1/write + 1/read, and
    // costs.offload_write_seconds_per_byte, 1/write, queued behind the forward pass, are drawn
    // from it) and what the plan offloads per step.
    std::string offload_target;
    double offload_write_bytes_per_second = 0, offload_read_bytes_per_second = 0;
    std::string offload_priced_as;  // "page cache" or "disk"
    bool offload_in_full = false;   // each transfer charged in full (offload_copies_share_the_cores)
    // On a device: its values' copies to host memory and back (remat::host_copy_bandwidth), added
    // to the write and the read; 0 on the CPU.
    double offload_to_host_bytes_per_second = 0, offload_from_host_bytes_per_second = 0;
    size_t predicted_offloaded_bytes = 0;
    size_t outside_bytes = 0;        // saved before the chain, live through it
    size_t after_chain_bytes = 0;    // saved after the chain up to the loss (in costs' x[L], not in outside_bytes)
    size_t chain_limit_bytes = 0;    // what the chain was planned within
    schedule::ChainCosts costs;
    schedule::Plan plan;
    std::string tree;                // format_tree(plan.tree)
    size_t predicted_peak_bytes = 0; // plan peak + outside bytes
    double predicted_seconds = 0;    // forward + recomputation + backward of the chain
    double profiled_chain_seconds = 0;  // the chain's forward + re-run + backward on the profiling step
    std::string planner;             // which planner made the plan (schedule::ChainPlan::describe)
    schedule::RotorMethod method = schedule::RotorMethod::exact;  // exact or grouped
  };
  // What budgets a profiled model can run under, outside bytes included: the smallest from which
  // plans are made in memory (schedule::ChainPlanner::smallest_limit: counted as the allocator
  // counts), save-all's predicted peak (a budget at or above it recomputes nothing), and the
  // planners' own least peak in memory (ChainPlanner::least_planned_peak). With an offload target
  // the smallest budget may lie lower (records that take their inputs along): the refusal of a
  // budget below it names it, and `remat plan --offload DIR` prints it.
  struct FeasibleRange {
    size_t smallest_budget_bytes = 0;
    size_t save_all_peak_bytes = 0;
    size_t least_planned_peak_bytes = 0;
  };
  // The plan in force for the last input shape, if planned yet.
  std::optional<Report> report() const;
  // The measured costs of the last profiled shape, as its plan was made from them (counted as
  // held; with an offload target, priced for it): set with the first plan after the profiling
  // steps, not by them (feasible_range() is there as soon as they finish).
  std::optional<schedule::ChainCosts> costs() const;
  // The feasible budgets of the last profiled shape, once its backward finished (as costs());
  // plans once, so it takes as long as planning (progress goes to the options' callback).
  std::optional<FeasibleRange> feasible_range() const;

  // The plan a budget policy (budget:BYTES or budget:auto, with or without +offload:DIR) would put
  // in force for the last profiled shape, made from the kept profile without putting it in force
  // (what `remat plan` prints); nullopt before a profile has finished. A budget below the smallest
  // feasible one is the remat::Error the policy raises; a policy that is no budget, likewise.
  std::optional<Report> plan_for(const Policy& budget) const;

  // How plans are made (schedule::ChainPlanner: exact rotor for short chains, the grouped planner
  // for long ones). `progress`, if set, is called while a long chain is planned, e.g. to show it
  // on a terminal; the library prints nothing itself. Takes effect at the next plan.
  void set_options(schedule::ChainPlanOptions options);
  const schedule::ChainPlanOptions& options() const;

  // Steps run under every-layer to profile a new input shape; the last one is measured (the
  // first run of a shape also pays for one-time work such as JIT-compiled GEMM kernels).
  static constexpr int kProfilingSteps = 2;

  // Used by the layer-call dispatcher (src/checkpoint/call.cpp).
  struct State;
  BudgetPlanner();
  ~BudgetPlanner();
  State& state() { return *state_; }

 private:
  std::unique_ptr<State> state_;
};

// How a budget plan of a step on `device` charges the bytes it offloads to `directory`, the one
// rule that budget plans and `remat plan --offload` share (Note [measuring the offload target] in
// src/saved/offload_file.cpp): the directory's bandwidths as offload_price takes them for what
// `costs` may offload (ChainCosts::offloadable_bytes) against the host's available memory, plus
// the device's host copies (the copy home added to the write, the copy back to the read). Where
// the store's copies share the step's cores (offload_copies_share_the_cores), each transfer is
// charged in full: no write queued behind the compute, no read ahead. Sets the three offload
// fields of `costs`; returns what it measured and chose. A directory that cannot be written is a
// remat::Error naming it, and `costs` is left as it was.
//   schedule::ChainCosts costs = schedule::ChainCosts::uniform(8, 1e-3, 2e-3, 1 << 20, 4 << 20);
//   const OffloadCharge charge = charge_offload(dir, parse_device("cpu"), costs);
//   // costs.can_offload(); the CPU's values need no host copy; charge.in_full where the step's
//   // threads take every core
struct OffloadCharge {
  OffloadPrice price;
  HostCopyBandwidth copies;
  bool in_full = false;
};
OffloadCharge charge_offload(const std::string& directory, Device device, schedule::ChainCosts& costs);

}  // namespace remat
