// What a segment measures of itself for the budget planner: Note [a profiled segment].
#include <algorithm>

#include "autodiff/state.h"
#include "remat/backend.h"
#include "remat/memory.h"
#include "segment.h"

namespace remat::detail {

// Note [a profiled segment]. While a budget policy profiles a model, each layer call runs as a
// segment of its own that measures, into its RegionProfile, what the planner's chain model asks
// of a stage: when it closes, its forward time and FLOPs, the bytes it keeps (what it holds to
// make its values again, and what its nodes saved that it could not drop, counted once a storage:
// its boundary), and of those the bytes some node saved (a Linear's input); when its backward
// starts (a node first reads a value it keeps), the live and peak saved bytes then; at its replay,
// the saved bytes its values add (allocator-measured) and of those its own results' (a tanh
// layer's); when the last value its nodes saved is released, its backward's time, the most of its
// values read and not yet released at once (what a record read back value by value would hold),
// and the sum of the other accounts' peaks. To see its backward start whatever its nodes saved, a
// profiled segment keeps every value it cannot make again itself (counted as a plain saved value
// would be, and in memory, as the profiling steps keep everything) instead of declining it. It
// also notes when it holds the previous profiled call's results as its input (Note [records that
// keep their outputs] in budget.cpp).
namespace {
struct LastProfiled {
  std::vector<std::weak_ptr<Storage>> outputs;
  std::shared_ptr<RegionProfile> profile;
};
thread_local LastProfiled last_profiled;
}  // namespace

void Segment::set_inputs(const TensorList& inputs) {
  for (const Tensor& t : inputs)
    if (t.defined()) inputs_.push_back(t.storage());
}

// Whether a value its nodes saved counts in what a record of the call streams: one it made, or one
// in the saved account that is not the call's input (a weight the program did not tag as a
// parameter, a constant), as a record read back value by value would hold it.
bool Segment::streams(const Slot& slot) const {
  if (slot.value != UINT32_MAX) return true;
  const Storage& s = *slot.filled.storage();
  if (!autodiff::counted_as_saved(s)) return false;
  return std::none_of(inputs_.begin(), inputs_.end(), [&](const std::weak_ptr<Storage>& w) { return w.lock().get() == &s; });
}

void Segment::set_outputs(const TensorList& outputs) {
  for (const Tensor& t : outputs) {
    if (!t.defined()) continue;
    outputs_.push_back(t.storage());
    if (auto it = value_of_.find(t.storage().get()); it != value_of_.end()) values_[it->second].result = true;
    if (profile_) profile_->output_bytes += t.nbytes();
  }
}

void Segment::profile_close(const Kept& kept) {
  RegionProfile& p = *profile_;
  p.forward_flops = autodiff::op_counters().forward_flops - flops_at_open_;
  p.boundary_bytes = kept.boundary_bytes;
  p.saved_input_bytes = kept.saved_by_nodes;
  p.outputs_kept_by = nullptr;
  p.outputs_kept_bytes = 0;
  if (last_profiled.profile && last_profiled.profile != profile_) {
    for (const auto& weak : last_profiled.outputs) {
      std::shared_ptr<Storage> out = weak.lock();
      if (!out || std::find(kept.storages.begin(), kept.storages.end(), out.get()) == kept.storages.end()) continue;
      last_profiled.profile->outputs_kept_by = profile_.get();
      last_profiled.profile->outputs_kept_bytes += out->bytes();
    }
  }
  last_profiled = {outputs_, profile_};
  p.backward_done = live_slots_ == 0;  // no node saved anything: there is no backward to measure
}

void Segment::profile_replay_end(size_t saved_before) {
  const size_t saved_after = backend(device_).allocator().stats().live(memory::Tag::saved);
  profile_->saved_bytes = saved_after > saved_before ? saved_after - saved_before : 0;
  profile_->saved_output_bytes = 0;
  for (const Value& v : values_)
    if (std::shared_ptr<Slot> slot = v.slot.lock(); slot && slot->counted && v.result)
      profile_->saved_output_bytes += v.bytes;
}

void Segment::profile_backward_end() {
  const memory::Stats s = backend(device_).allocator().stats();
  profile_->streamed_bytes = read_peak_;
  profile_->held_peak_at_backward_end = s.peak(memory::Tag::parameter) + s.peak(memory::Tag::gradient) + s.peak(memory::Tag::other);
  profile_->backward_done = true;
}

}  // namespace remat::detail
