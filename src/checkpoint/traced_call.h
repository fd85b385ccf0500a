// Internal: a layer call whose values outlive it, and which a region therefore replays from the
// ops its first run made instead of calling the layer again. See Note [values that leave a layer
// call] in traced_call.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "remat/autodiff.h"
#include "remat/random.h"
#include "tensor/allocate.h"

namespace remat::detail {

// Where a traced op's input, or a traced call's result, comes from.
struct TracedSource {
  enum class Kind : uint8_t { undefined, call_input, op_output, region_value, kept };
  Kind kind = Kind::undefined;
  uint32_t index = 0;   // call_input: input; op_output: op; region_value: the region's step; kept: value
  uint32_t output = 0;  // op_output, region_value: which output
};

// The ops of one layer call as its first run made them, to be run again in its place.
class CallTrace {
 public:
  // The call's results (its outputs, then its escaped values) recomputed from `inputs` (the
  // call's inputs in the replay); `region_value(step, output)` is a value of an earlier step of
  // the region in the replay. Each op runs through the ordinary path (recorded, observed) under
  // the grad mode and the RNG state it first ran with.
  TensorList replay(const TensorList& inputs, const std::function<Tensor(uint32_t, uint32_t)>& region_value) const;
  size_t kept_bytes() const;
  size_t num_ops() const { return ops_.size(); }
  // The (step, output) values of the region that the replay asks region_value for.
  std::vector<std::pair<uint32_t, uint32_t>> region_values() const;

 private:
  friend class CallRecorder;
  struct Op {
    std::shared_ptr<autodiff::OpReplay> op;
    // when it started, for a custom op (its forward may draw from the generator; a built-in op's
    // definition holds the RngState it drew before it ran)
    std::optional<RngState> rng;
    bool grad_enabled = true;
    std::vector<TracedSource> inputs;
  };
  // An input no op of the call made: a constant (kept as a SavedTensor: counted, version-checked)
  // or a tensor requiring grad (a captured parameter, another region's output), held as it is so
  // that the replayed op's gradient reaches it.
  struct Kept {
    autodiff::SavedTensor value;
    Tensor with_history;
  };
  Tensor input(const TracedSource& source, const TensorList& inputs, const std::vector<TensorList>& values,
               const std::function<Tensor(uint32_t, uint32_t)>& region_value) const;

  std::vector<Op> ops_;
  std::vector<Kept> kept_;
  std::vector<TracedSource> results_;
};

// Watches one layer call's first run (a region's call step): traces its ops, and, when it has
// returned, tells what of the call is still alive besides its outputs.
class CallRecorder final : public HandleWatcher {
 public:
  // Finds a value of the region (an output of an earlier step): (step, output), or nothing.
  using RegionLookup = std::function<std::optional<std::pair<uint32_t, uint32_t>>(const Tensor&)>;
  // Installs itself as the thread's handle watcher until it is destroyed.
  CallRecorder(const TensorList& inputs, RegionLookup region_lookup);
  ~CallRecorder() override;
  CallRecorder(const CallRecorder&) = delete;
  CallRecorder& operator=(const CallRecorder&) = delete;

  void on_new_handle(const std::shared_ptr<TensorImpl>& impl) override;
  // Around each op of the call: before it runs (its grad mode, and for a custom op the RNG state),
  // after it ran.
  void before_op(const std::string& op);
  void after_op(const autodiff::OpEvent& event, const std::shared_ptr<autodiff::OpReplay>& replay);
  // An op of the call whose outputs an enclosing recomputation deferred: its inputs stay held
  // while they are pending, by the enclosing region, not by the program.
  void on_deferred(const TensorList& inputs, const TensorList& outputs);

  struct Outcome {
    std::unique_ptr<CallTrace> trace;  // set when something outlives the call
    // Values some op of the call made that outlive it and would carry a gradient under save-all
    // (made under grad mode from something requiring grad), outputs excluded, in the order made;
    // the trace's results list them after the outputs.
    TensorList escaped;
  };
  // The call returned `outputs`; `held` are the call's values the region itself holds (its
  // selective cache). Call once.
  Outcome finish(const TensorList& outputs, const std::vector<const TensorImpl*>& held);

 private:
  struct Known {
    TracedSource source;
    std::weak_ptr<TensorImpl> impl;  // the address is not reused while it lives
  };
  TracedSource resolve(const Tensor& t);
  bool differentiable(const TracedSource& source, const Tensor& t) const;

  HandleWatcher* previous_;
  bool watching_ = true;  // installed as the thread's handle watcher (until finish())
  RegionLookup region_lookup_;
  TensorList inputs_;
  std::vector<long> input_uses_;  // use counts of the inputs' handles when the call began
  std::vector<CallTrace::Op> ops_;
  std::vector<std::vector<std::weak_ptr<TensorImpl>>> op_outputs_;  // visible outputs, per op
  std::vector<bool> op_differentiable_;
  TensorList kept_;
  std::unordered_map<const TensorImpl*, Known> known_;
  std::vector<std::weak_ptr<TensorImpl>> made_;  // every handle made during the call
  std::vector<std::pair<TensorList, std::vector<std::weak_ptr<Storage>>>> deferred_;
  bool reads_region_values_ = false;  // an op read an earlier step's value not passed as an input
  std::optional<std::pair<std::optional<RngState>, bool>> pending_;  // before_op's, for the next after_op
  bool complete_ = true;  // every after_op had its before_op
};

}  // namespace remat::detail
