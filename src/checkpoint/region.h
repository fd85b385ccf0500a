// Internal: the checkpoint region node shared by remat::checkpoint, layer calls and segments.
//
// A Region is a tape node standing for a piece of forward computation that ran without
// recording. It keeps a trace of what ran, as steps:
//   - call steps: a function (a layer call) applied to some values;
//   - op steps: one op made between layer calls (a residual add, a reshape), kept as an
//     autodiff::OpReplay; only segments (every-k groups, budget plan regions) trace these.
// Step inputs refer either to outputs of earlier steps or to external values (kept by the
// region as SavedTensors, version-checked). Every visible output of every step is an output of
// the region node: it gets the region as grad_fn while the forward runs, so later ops, inside or
// outside the region, see it as part of the tape. So does a value a call step made and left
// behind (kept in a member or a list: Note [values that leave a layer call], traced_call.cpp),
// and such a step is replayed from its ops instead of calling the layer again. In the backward
// pass the region replays its steps with recording on (RNG restored before each step; selective
// caches served), runs the backward of that sub-tape, and hands the gradients that leave it on
// along its edges, one contribution at a time (the order save-all would have added them in).
//
// Note [what a region version-checks]. Recomputation re-reads everything the first run read.
// External step inputs are SavedTensors (checked on get()). Everything else the ops read (captured
// parameters, constants) is tracked by storage: the version of every storage an op read is taken
// when the region closes, and compared before the replay; a storage that no longer exists could
// not be re-read anyway. A mismatch is the error save-all gives for an overwritten saved value.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "autodiff/history.h"
#include "remat/autodiff.h"
#include "remat/backend.h"
#include "dead_ops.h"
#include "tensor/device_time.h"
#include "remat/budget.h"
#include "remat/call.h"
#include "remat/counters.h"
#include "remat/policy.h"
#include "remat/random.h"
#include "remat/schedule.h"
#include "traced_call.h"
#include "versions.h"

namespace remat::detail {

class Region;

// How a call step runs when its region is replayed (set by the dispatcher, remat/call.cpp).
struct CallStepInfo {
  CallSite site;
  int position = -1;  // stage index under a budget plan scope, else -1
};

class Region final : public autodiff::Node {
 public:
  enum class Kind { call, segment };
  Region(Kind kind, Policy policy, std::string label, std::shared_ptr<RegionProfile> profile = nullptr,
         std::vector<schedule::PlanNode> sub_plan = {});
  ~Region() override;

  // ---- first run
  // Installs the first-run observer (recording off) and captures the RNG state. `device` is where
  // the region's values live (device_of its inputs): its counters and clock are the profile's.
  void open(Device device);
  // Runs a layer call as a step (its ops untaped); returns its outputs, now outputs of this node.
  TensorList add_call(const RegionFn& fn, const TensorList& inputs, const CallStepInfo& info);
  // Restores the observer, takes versions, settles the selective cache, writes counters. After
  // close(), `valid()` tells whether any gradient can flow through the region; if not, its
  // outputs have been made plain tensors again.
  void close();
  // Leaves without the bookkeeping of close() (an exception passed through the region).
  void abort();
  bool is_open() const { return open_; }
  bool valid() const { return valid_; }
  size_t num_calls() const { return num_calls_; }
  const std::string& label() const { return label_; }
  void set_label(std::string label) { label_ = std::move(label); }

  // ---- autodiff::Node
  std::string name() const override { return "Checkpoint(" + label_ + ")"; }
  size_t saved_bytes() const override;
  TensorList apply(TensorList&&) override;
  bool returns_contributions() const override { return true; }
  std::vector<TensorList> apply_contributions(TensorList&& grad_outputs) override;
  void release_saved() override;
  void prefetch_saved() const override {
    for (const auto& e : externals_) e.value.prefetch();
  }

  // ---- used by the observers
  void on_op(autodiff::OpEvent& event);
  void on_recording(const TensorList& inputs);
  bool serve(const std::string& op, size_t& cursor, TensorList& outputs);
  // Numbers the ops of the region's extent (Note [skipping dead ops]): on the first run, and
  // (next_op) on a recomputation, which may defer the op numbered `ordinal`.
  void on_sequence(const std::string& op);
  bool defer(const std::string& op, size_t ordinal, const TensorList& inputs, TensorList& outputs,
             std::shared_ptr<const autodiff::OpReplay>& record_as);
  // An enclosing recomputation deferred an op of this region's first run (it holds the inputs).
  void on_deferred_by_parent(const TensorList& inputs, const TensorList& outputs) {
    if (recorder_) recorder_->on_deferred(inputs, outputs);
  }
  const Policy& policy() const { return policy_; }

 private:
  struct Ref {
    bool external = false;
    uint32_t index = 0;   // external: index into externals_; internal: step index
    uint32_t output = 0;  // internal: output index of that step
  };
  struct Step {
    bool is_call = false;
    RegionFn fn;                                   // call steps
    CallStepInfo info;                             // call steps
    std::shared_ptr<autodiff::OpReplay> op;        // op steps
    std::vector<Ref> inputs;
    std::vector<size_t> output_slots;              // node output slot of each output (SIZE_MAX: none)
    RngState rng;                                  // at the start of the step
    std::vector<std::optional<ValueDigest>> digests;  // of each output on the first run (digest.h)
    // call steps that left values behind: replayed from their ops, and their escaped values follow
    // their outputs (Note [values that leave a layer call], traced_call.cpp)
    std::shared_ptr<const CallTrace> trace;
  };
  struct External {
    autodiff::SavedTensor value;
    bool requires_grad = false;
    size_t slot = 0;  // index into next_edges
  };
  struct CacheEntry {
    std::string op;
    TensorList pending;                            // first run: held until close() decides
    std::vector<autodiff::SavedTensor> values;     // kept (served on replay)
    bool kept = false;
  };

  Ref ref_for_input(const Tensor& t);
  void register_outputs(Step& step, TensorList& outputs, size_t count, const TensorList& inputs);
  void register_escaped(Step& step, TensorList& escaped);
  TensorList replay_call(const Step& step, const TensorList& inputs, std::shared_ptr<Region>& nested,
                         const std::vector<TensorList>& replayed);
  void strip_outputs();
  void check_recomputed(size_t step, const TensorList& outputs) const;
  // the backward pass (apply_contributions), in order
  TensorList fresh_leaves() const;
  void check_replayed_shapes(size_t step, const TensorList& outputs) const;
  std::vector<TensorList> replay_steps(const TensorList& leaves);
  autodiff::EngineResult backward_replayed(std::vector<TensorList> replayed, const TensorList& grad_outputs,
                                           uint64_t first_sequence_nr) const;
  size_t saved_output_bytes(const std::vector<TensorList>& replayed, const TensorList& leaves) const;
  static std::vector<int> saved_holders_of(const TensorList& leaves);
  static size_t saved_input_bytes(const TensorList& leaves, const std::vector<int>& before);
  void record_recomputation(const TimeMark& recompute_start, const TimeMark& backward_start,
                            const TimeMark& backward_end, size_t recomputed_saved,
                            const autodiff::OpCounters& ops_before, const autodiff::OpCounters& ops_after);
  std::vector<TensorList> route_input_grads(const TensorList& leaves, const autodiff::EngineResult& result) const;

  Kind kind_;
  Policy policy_;  // without its offload target: a replay runs under it and never starts an offload runtime
  std::string label_;
  std::shared_ptr<RegionProfile> profile_;
  std::vector<schedule::PlanNode> sub_plan_;
  bool open_ = false, valid_ = false, closed_ = false;
  size_t num_calls_ = 0;
  size_t traced_calls_ = 0, escaped_values_ = 0;  // Note [values that leave a layer call]
  int call_depth_ = 0;  // > 0 while a call step's function runs
  std::unique_ptr<CallRecorder> recorder_;  // while a call step's function runs (first run)
  RngState rng_;
  TimeMark opened_at_;  // on device_ (Note [timing without waiting] in src/tensor/device_time.cpp)
  double flops_at_open_ = 0;  // autodiff::op_counters().forward_flops when opened (profile_'s forward FLOPs)
  autodiff::RecordingObserver* previous_observer_ = nullptr;
  std::unique_ptr<autodiff::RecordingObserver> observer_;

  std::vector<Step> steps_;
  std::vector<External> externals_;
  std::unordered_map<const TensorImpl*, uint32_t> external_of_;  // first run only
  std::unordered_map<const TensorImpl*, Ref> produced_;           // first run only
  std::vector<std::weak_ptr<TensorImpl>> produced_impls_;         // first run only
  autodiff::CapturedEdges captured_;
  Device device_;  // where the values live: whose allocator counters and clock the profile reads
  ReadVersions read_versions_;  // Note [what a region version-checks]
  // selective
  std::vector<CacheEntry> cache_;
  // First run only: the storages some op would save. Weak references, so that a storage freed during
  // the first run keeps its address (its control block stays allocated) and no later storage can
  // be taken for it.
  std::unordered_map<const Storage*, std::weak_ptr<Storage>> saved_by_ops_;
  size_t record_index_ = SIZE_MAX;
  OpTrace trace_;  // Note [skipping dead ops]
};


// The device of the first defined tensor (the CPU if there is none).
inline Device device_of(const TensorList& tensors) {
  for (const auto& t : tensors)
    if (t.defined()) return t.device();
  return Device{};
}

// Counters shared by regions and the dispatcher (thread-local).
struct RegionCounters {
  uint64_t created = 0;
  uint64_t recomputed = 0;
  uint64_t run_in_backward = 0;  // regions recomputed since the last top-level backward ended
  uint64_t loops_run_in_backward = 0;  // scan / while_loop backward passes (they recompute) since then
  uint64_t layer_calls = 0;      // layer calls met (call.cpp)
  uint64_t layer_calls_since_backward = 0;
  std::vector<RegionRecord> records;
  std::unordered_map<std::string, size_t> first_record_of;  // label -> its first row in records
};
RegionCounters& region_counters();

// Adds seconds to a field of this thread's region record `index` (when it still exists).
inline detail::SecondsSink record_sink(size_t index, double RegionRecord::*field) {
  return [index, field](double seconds) {
    auto& records = region_counters().records;
    if (index < records.size()) records[index].*field += seconds;
  };
}

// True while a region's first run is in progress on this thread (nested explicit regions are
// then plain calls: the enclosing region covers them).
bool inside_first_run();

// An explicit region (remat::checkpoint, or a call whose role is `layer` inside another layer):
// a region under site.policy unless that policy keeps everything, grad mode is off, or a region's
// first run is in progress (then a plain call). Implemented in call.cpp.
TensorList explicit_region(const RegionFn& fn, const TensorList& inputs, const CallSite& site,
                           std::shared_ptr<RegionProfile> profile);

}  // namespace remat::detail
