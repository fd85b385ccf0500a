// Internal: a checkpoint segment, the recomputation of a group of layer calls together with the
// model's own code between them (every-k:K groups, the regions of a budget plan). See Note [one
// graph] in segment.cpp.
//
// While a segment is open on a thread, the program runs as under save-all: every op is recorded on
// the tape, with its grad mode, its inputs as the program passed them, detach, constants and all.
// What changes is only what the tape keeps. The segment sees every op its thread runs (its
// definition, where each input came from, the generator state it started with), and it is the
// innermost saved-value hooks: a value an op saves that one of the segment's ops made (and that was
// not written in place since) is dropped, and comes back in the backward pass when its node reads
// it, by running the segment's ops again for their values only. Anything else an op saves is
// declined, and kept as without the segment.
//
//   auto segment = std::make_shared<Segment>("blocks.0..blocks.1", device_of(inputs));
//   segment->open();
//   h = add(h, block0->forward(h));   // recorded; what its nodes save is dropped
//   h = add(h, block1->forward(h));
//   segment->close();                 // (abort() where an exception passed)
//   loss(h).backward();               // the first node that reads a dropped value re-runs the ops
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "autodiff/digest.h"
#include "remat/autodiff.h"
#include "remat/budget.h"
#include "remat/policy.h"
#include "remat/random.h"
#include "remat/saved_hooks.h"
#include "tensor/device_time.h"

namespace remat::detail {

class Segment final : public std::enable_shared_from_this<Segment> {
 public:
  // `group`: several layer calls with the model's code between them (every-k, a budget plan's
  // region), as the region records name it ("segment"); else one layer call ("layer").
  Segment(std::string label, Device device, bool group);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Installs the segment as the thread's recording observer (passing every call on to the one it
  // replaces) and innermost saved-value hooks.
  void open();
  // Removes both, takes the digests of what the segment made that outlives it (the recomputation
  // check) and forgets the ops no dropped value needs.
  void close();
  // Removes both after an exception; what was recorded stays replayable.
  void abort();
  void set_label(std::string label) { label_ = std::move(label); }
  const std::string& label() const { return label_; }
  // Marks the layer call in progress (for the ops it runs, so that an error names it), while it lives.
  class InCall {
   public:
    InCall(Segment& segment, const std::string& label) : segment_(segment), previous_(segment.call_) {
      ++segment.calls_;
      segment.call_ = static_cast<int32_t>(segment.call_labels_.size());
      segment.call_labels_.push_back(label);
    }
    ~InCall() { segment_.call_ = previous_; }
    InCall(const InCall&) = delete;
    InCall& operator=(const InCall&) = delete;

   private:
    Segment& segment_;
    int32_t previous_;
  };
  // selective: the values ops of these kinds made are kept where a node saves them, not dropped.
  void keep_outputs_of(Keep kinds) { keep_ = std::move(kinds); }

  // Budget profiling: the segment writes what it measures of itself into `profile` (Note [a
  // profiled segment] in segment.cpp). `outputs`, given before close(), are the call's results.
  void set_profile(std::shared_ptr<RegionProfile> profile) { profile_ = std::move(profile); }
  void set_outputs(const TensorList& outputs);
  void set_inputs(const TensorList& inputs);

  // ---- used by the observer and the hooks (segment.cpp)
  struct Slot;
  void before_op();
  void after_op(const autodiff::OpEvent& event);
  PackedValue pack(const Tensor& storage);
  Tensor unpack(Slot& slot);
  void slot_released(size_t bytes, bool read);
  void slot_read(size_t bytes);

 private:
  // Where an op's input comes from in the replay: a value one of the segment's ops made (read
  // through the view the first run read), or a tensor the segment holds.
  struct Source {
    enum class Kind : uint8_t { undefined, made, held } kind = Kind::undefined;
    uint32_t index = 0;
    int64_t offset = 0;
    Shape shape;
    Strides strides;
    DType dtype = DType::f32;
  };
  struct Op {
    std::shared_ptr<autodiff::OpReplay> op;
    std::vector<Source> inputs;
    std::vector<int32_t> makes;  // per output (visible, then aux): the value it made, or -1
    RngState rng;                // the generator's state when the op started
    double flops = 0;            // once `op` is let go (no dropped value needs it): its FLOPs, skipped
    int32_t call = -1;           // the layer call it ran in (call_labels_), or -1: the model's own code
  };
  std::string where(const Op& op) const;  // "checkpoint segment 'S', layer 'L', op K"
  // A storage one of the segment's ops made.
  struct Value {
    uint32_t op = 0, output = 0;
    std::weak_ptr<Storage> first;  // the first run's storage (while it lives)
    uint64_t version = 0;          // its version just after the op made it
    int64_t offset = 0;            // the op's output as a view on it
    Shape shape;
    Strides strides;
    DType dtype = DType::f32;
    size_t bytes = 0;
    std::optional<ValueDigest> digest;  // taken at close() where something outside still holds it
    std::weak_ptr<Slot> slot;           // its dropped form, while a saved value holds it
    bool result = false;                // one of the layer call's results (set_outputs)
  };

  Source source_of(const Tensor& t);
  void uninstall();
  void forget_unneeded();
  enum class Run : uint8_t { skip, serve, run };
  std::vector<Run> needed_ops(const std::vector<bool>& wanted,
                              const std::vector<std::shared_ptr<Storage>>& available) const;
  std::vector<std::shared_ptr<Storage>> available_values() const;
  void replay();
  struct Made {
    std::vector<Tensor> values;  // per value: made again (whole storage), for the wanted ones
    double recomputed_flops = 0, skipped_flops = 0;
  };
  Made make_values(const std::vector<bool>& wanted);
  size_t fill_slots(const std::vector<bool>& wanted, const std::vector<Tensor>& made);
  Tensor whole_value(size_t v, const std::shared_ptr<Storage>& storage) const;
  Tensor input_for(const Source& source, const std::vector<Tensor>& made) const;
  void check_replayed(const Op& op, size_t k, const Tensor& out) const;

  std::string label_;
  Device device_;
  bool group_ = false;
  bool holding_ = false;  // source_of is making a held value
  size_t calls_ = 0;
  int32_t call_ = -1;  // the layer call in progress (InCall)
  std::vector<std::string> call_labels_;
  std::optional<Keep> keep_;
  bool open_ = false, closed_ = false;
  std::vector<Op> ops_;
  std::vector<Value> values_;
  // A tensor the ops read from outside: kept as a saved value, or, for a parameter or another leaf
  // that requires grad (alive for its accumulator anyway), as a handle and the version it was read at.
  struct Held {
    autodiff::SavedTensor saved;
    Tensor leaf;
    uint64_t version = 0;
  };
  Tensor held_value(uint32_t index) const;
  static bool is_leaf_value(const Tensor& t);

  std::vector<Held> held_;
  std::unordered_map<const Storage*, std::weak_ptr<Storage>> leaf_storages_;  // first run
  std::vector<std::weak_ptr<Slot>> leaf_slots_;  // Note [a region's parameters]
  std::unordered_map<const Storage*, std::weak_ptr<Storage>> declined_;  // first run: saved, not ours
  std::unordered_map<const Storage*, std::weak_ptr<Storage>> selective_kept_;  // first run: kept by keep_
  std::unordered_map<const Storage*, uint32_t> value_of_;                                        // first run
  std::unordered_map<const TensorImpl*, std::pair<std::weak_ptr<TensorImpl>, uint32_t>> held_of_;  // first run
  std::optional<RngState> pending_rng_;
  // the thread's state it replaced
  std::unique_ptr<autodiff::RecordingObserver> observer_;
  autodiff::RecordingObserver* previous_observer_ = nullptr;
  std::optional<ScopedSavedTensorHooks> hooks_;
  // closing (segment.cpp)
  struct Kept {
    size_t boundary_bytes = 0, saved_by_nodes = 0, selective_bytes = 0;
    std::vector<const Storage*> storages;  // those of boundary_bytes
  };
  void keep_what_is_needed();
  Kept measure_kept() const;
  void write_record(const Kept& kept, const TimeMark& closed_at);
  void profile_close(const Kept& kept);
  void profile_replay_end(size_t saved_before);
  void profile_backward_end();

  std::shared_ptr<RegionProfile> profile_;
  double flops_at_open_ = 0;
  std::vector<std::weak_ptr<Storage>> outputs_, inputs_;
  bool streams(const Slot& slot) const;
  size_t read_live_ = 0, read_peak_ = 0;  // profiled: filled values read and not yet released
  // counters (Note [what a segment reports] in segment.cpp)
  TimeMark opened_at_;
  size_t record_index_ = SIZE_MAX;
  size_t live_slots_ = 0;  // slots handed out and not yet released
  TimeMark replay_end_;    // the backward's start, or the end of the replay it began with
  bool backward_started_ = false, backward_timed_ = false;
  void backward_start();
};

// What the hooks keep for a saved value: a dropped value, filled when a replay makes it again (Note
// [one graph]); a parameter's storage, kept as it is (Note [a region's parameters]); or, in a
// profiled segment, any other value, kept as it is (Note [a profiled segment]).
struct Segment::Slot {
  std::shared_ptr<Segment> segment;
  uint32_t value = UINT32_MAX;  // the dropped value's index (UINT32_MAX: kept as it is)
  DType dtype = DType::f32;     // as the saved value reads the storage
  Tensor filled;                // the whole storage
  bool counted = false;         // holds a saved reference on it (in the saved account)
  bool read = false;            // unpacked since
  ~Slot() {
    if (counted) filled.storage()->remove_saved_reference();
    segment->slot_released(filled.defined() ? filled.storage()->bytes() : 0, read);
  }
};

// True while a segment is open on this thread (its layer calls and explicit regions run plain:
// the segment covers them).
bool segment_open();

}  // namespace remat::detail
