// Checkpoint segments: see segment.h.
//
// Note [one graph]. A group of layer calls with the model's own code between them (the ops of a
// residual stream, a no-grad normaliser, a detach, a noise tensor, a parameter read again after
// the call that used it) was once recomputed by a second interpreter of that code: the segment
// traced every op between the calls and, in the backward pass, ran the trace again with recording
// on to build a sub-tape in place of the one the first run did not build. Every difference between
// the state the trace replayed under and the state the program ran under (grad mode, detach,
// which tensor an input was, the order of gradient contributions, values made on another thread)
// was a silently different gradient, and each patch found the next one. So the graph is no longer
// rebuilt at all. A segment's first run records the program's graph as save-all does, by the
// ordinary path, so every node, edge, grad mode and contribution order is save-all's by
// construction; the segment only decides what the graph keeps. It is the innermost saved-value
// hooks (remat/saved_hooks.h): a storage one of its ops made is dropped when a node saves it, and
// made again, for its value only, when a node first reads it in the backward pass. What it cannot
// make again (a parameter, a value from before it, a constant made by a factory, a value made on
// another thread or written in place since its op made it) it declines, and the value is kept as
// under save-all (Note [hooks that decline] in saved_tensor.cpp).
//
// Making a value again runs ops, not the program: the segment keeps each op's definition
// (autodiff::OpReplay), the generator state it started with, and where each input came from (a
// storage one of its ops made, read through the view the op read; or a tensor it holds), and runs
// the forwards alone (untaped) of the ops the dropped values need, in their first run's order,
// under the recompute depth (declared side effects are skipped). The program's own code between
// the ops, layers' forward_impl included, does not run again. Ops whose outputs no dropped value
// needs are not run (counted as skipped). A replay fills every dropped value still held at once, as
// a region's re-run did, and each goes when the last node that saved it has run. Because the only
// thing replayed is values, the check of a replay is a check of values: each op's outputs against
// its first run's shape, dtype and layout (by structure, before any value), and the digest of every
// value the segment made that something outside it still held when it closed.
//
// Lifetimes. A dropped value's packed form (Slot) holds the segment; the segment holds its
// lineage and the tensors it reads from outside, so those live exactly while some node of the
// graph may still read one of its values, and go with the last. A segment nested in another (a
// budget plan's region inside a region) reads the values it holds through the outer segment's
// hooks like any other saved value: the outer one drops them, and makes them again first.
//
// Note [what a segment reports]. A segment writes one row of the region records when it closes
// (kind "segment": its calls, the bytes it holds, its forward time) and, at each replay, one more
// recomputation (the values filled, the replay's time, FLOPs run and skipped); the backward time is
// from the replay's end to the release of the last value it filled.
#include "segment.h"

#include <algorithm>
#include <unordered_set>

#include "autodiff/replay.h"
#include "autodiff/state.h"
#include "region.h"
#include "tensor/allocate.h"
#include "remat/backend.h"
#include "remat/memory.h"

namespace remat::detail {

namespace {

thread_local int open_segments = 0;

class SegmentObserver final : public autodiff::RecordingObserver {
 public:
  SegmentObserver(Segment& segment, autodiff::RecordingObserver* parent) : segment_(segment), parent_(parent) {}
  void before_op(const std::string& op) override {
    segment_.before_op();
    if (parent_) parent_->before_op(op);
  }
  void after_forward(autodiff::OpEvent& event) override {
    if (parent_) parent_->after_forward(event);
    segment_.after_op(event);
  }
  bool suppress_recording(const TensorList& inputs) override {
    return parent_ != nullptr && parent_->suppress_recording(inputs);
  }

 private:
  Segment& segment_;
  autodiff::RecordingObserver* parent_;
};

}  // namespace

bool segment_open() { return open_segments > 0; }

Segment::Segment(std::string label, Device device, bool group)
    : label_(std::move(label)), device_(device), group_(group) {}

Segment::~Segment() {
  if (open_) uninstall();
}

void Segment::open() {
  REMAT_ASSERT(!open_ && !closed_, "segment '", label_, "' opened twice");
  opened_at_ = backend(device_).mark_time();
  flops_at_open_ = autodiff::op_counters().forward_flops;
  SavedTensorHooks hooks;
  std::weak_ptr<Segment> self = weak_from_this();
  hooks.pack = [self](const Tensor& storage) -> PackedValue {
    std::shared_ptr<Segment> segment = self.lock();
    return segment ? segment->pack(storage) : nullptr;
  };
  hooks.unpack = [](const PackedValue& packed) {
    auto& slot = *std::static_pointer_cast<Slot>(packed);
    return slot.segment->unpack(slot);
  };
  hooks_.emplace(std::move(hooks));
  observer_ = std::make_unique<SegmentObserver>(*this, autodiff::recording_observer());
  previous_observer_ = autodiff::set_recording_observer(observer_.get());
  open_ = true;
  ++open_segments;
}

void Segment::uninstall() {
  autodiff::set_recording_observer(previous_observer_);
  hooks_.reset();
  open_ = false;
  closed_ = true;
  --open_segments;
}

void Segment::abort() {
  if (open_) uninstall();
  value_of_.clear();
  held_of_.clear();
}

void Segment::before_op() { pending_rng_ = rng_state(); }

bool Segment::is_leaf_value(const Tensor& t) {
  return t.storage()->tag() == memory::Tag::parameter || (t.requires_grad() && t.is_leaf());
}

// Note [a region's parameters]. A parameter (any leaf that requires grad) lives anyway, for its
// accumulator and its owner. A segment holds one its ops read as a handle, not as a saved value,
// and keeps a node's save of one as it is (away from an offload target), counted among the saved
// bytes only from the segment's recomputation until that value's release: as a region's re-run
// counted it when it kept its sub-tape. So a region's first run keeps no weight beyond its
// layer's (the bound of include/remat/checkpoint.h), what a profiled layer call keeps when
// recomputed includes its weights as a recorded stage does, and save-all, which saves weights the
// program did not tag as parameters, counts them as it always has.
Segment::Source Segment::source_of(const Tensor& t) {
  if (!t.defined()) return {};
  const std::shared_ptr<Storage>& storage = t.storage();
  if (auto it = value_of_.find(storage.get()); it != value_of_.end()) {
    const Value& v = values_[it->second];
    if (v.first.lock() == storage && storage->version() == v.version)
      return {Source::Kind::made, it->second, t.offset(), t.shape(), t.strides(), t.dtype()};
  }
  const TensorImpl* impl = t.impl_ptr().get();
  if (auto it = held_of_.find(impl); it != held_of_.end() && it->second.first.lock() == t.impl_ptr())
    return {Source::Kind::held, it->second.second, 0, {}, {}, t.dtype()};
  const auto index = static_cast<uint32_t>(held_.size());
  Held held;
  if (is_leaf_value(t)) {
    held.leaf = t.detach();
    held.version = storage->version();
    leaf_storages_[storage.get()] = storage;
  } else if (auto kept = declined_.find(storage.get()); profile_ && kept != declined_.end() && kept->second.lock() == storage) {
    // a profiled segment keeps this value in a slot of its own (Note [a profiled segment]), and a
    // saved tensor of it would share that slot, which holds the segment: a cycle. Held as it is.
    held.leaf = t.detach();
    held.version = storage->version();
  } else {
    holding_ = true;  // these hooks let it pass: kept as without them (or by an enclosing segment)
    held.saved = autodiff::SavedTensor(t);
    holding_ = false;
  }
  held_.push_back(std::move(held));
  held_of_[impl] = {t.impl_ptr(), index};
  return {Source::Kind::held, index, 0, {}, {}, t.dtype()};
}

// A held tensor as the replay reads it; one written in place since is an error naming it.
Tensor Segment::held_value(uint32_t index) const {
  const Held& h = held_[index];
  if (h.leaf.defined()) {
    REMAT_CHECK(h.leaf.storage()->version() == h.version, "checkpoint segment '", label_, "': a tensor of shape ",
                shape_str(h.leaf.shape()), h.leaf.name().empty() ? std::string() : " ('" + h.leaf.name() + "')",
                " that its recomputation reads was modified in place after the forward pass read it; the "
                "recomputation cannot read the values the forward pass read");
    return h.leaf;
  }
  try {
    return h.saved.get();
  } catch (const Error& e) {
    throw Error(concat("checkpoint segment '", label_, "': a value its recomputation reads: ", e.what()));
  }
}

void Segment::after_op(const autodiff::OpEvent& event) {
  if (!open_) return;
  Op op;
  op.op = event.make_replay();
  op.call = call_;
  op.rng = pending_rng_.value_or(rng_state());
  pending_rng_.reset();
  op.inputs.reserve(event.inputs.size());
  for (const auto& in : event.inputs) op.inputs.push_back(source_of(in));
  const auto index = static_cast<uint32_t>(ops_.size());
  for (size_t k = 0; k < event.outputs.size(); ++k) {
    const Tensor& out = event.outputs[k];
    int32_t made = -1;
    if (out.defined()) {
      const std::shared_ptr<Storage>& storage = out.storage();
      bool seen = false;  // a view of an input, or of a storage known already
      for (const auto& in : event.inputs) seen = seen || (in.defined() && in.storage() == storage);
      if (auto it = value_of_.find(storage.get()); it != value_of_.end())
        seen = seen || values_[it->second].first.lock() == storage;
      if (!seen) {
        Value v;
        v.op = index;
        v.output = static_cast<uint32_t>(k);
        v.first = storage;
        v.version = storage->version();
        v.offset = out.offset();
        v.shape = out.shape();
        v.strides = out.strides();
        v.dtype = out.dtype();
        v.bytes = storage->bytes();
        made = static_cast<int32_t>(values_.size());
        value_of_[storage.get()] = static_cast<uint32_t>(made);
        values_.push_back(std::move(v));
      }
    }
    op.makes.push_back(made);
  }
  ops_.push_back(std::move(op));
}

PackedValue Segment::pack(const Tensor& storage) {
  if (holding_) return nullptr;
  const std::shared_ptr<Storage>& raw = storage.storage();
  auto make_slot = [&](uint32_t value) {
    auto slot = std::make_shared<Slot>();
    slot->segment = shared_from_this();
    slot->value = value;
    slot->dtype = storage.dtype();
    ++live_slots_;
    return slot;
  };
  if (auto leaf = leaf_storages_.find(raw.get());
      raw->tag() == memory::Tag::parameter || (leaf != leaf_storages_.end() && leaf->second.lock() == raw)) {
    std::shared_ptr<Slot> slot = make_slot(UINT32_MAX);  // Note [a region's parameters]
    slot->filled = storage;
    leaf_slots_.push_back(slot);
    return slot;
  }
  auto it = value_of_.find(raw.get());
  if (it == value_of_.end() || values_[it->second].first.lock() != raw || raw->version() != values_[it->second].version) {
    declined_.try_emplace(raw.get(), raw);  // not ours to make again: kept, part of what this region keeps
    if (!profile_) return nullptr;
    std::shared_ptr<Slot> slot = make_slot(UINT32_MAX);  // kept here, so that the segment sees its backward
    slot->filled = storage;
    slot->filled.storage()->add_saved_reference();
    slot->counted = true;
    return slot;
  }
  Value& v = values_[it->second];
  if (keep_ && keep_->keeps_op(ops_[v.op].op->op())) {
    selective_kept_.try_emplace(raw.get(), raw);
    return nullptr;
  }
  if (std::shared_ptr<Slot> slot = v.slot.lock()) return slot;
  std::shared_ptr<Slot> slot = make_slot(it->second);
  v.slot = slot;
  return slot;
}

Tensor Segment::unpack(Slot& slot) {
  if (!backward_started_) backward_start();
  if (!slot.filled.defined()) replay();
  REMAT_ASSERT(slot.filled.defined(), "segment '", label_, "': a dropped value was not made again");
  if (!slot.read && streams(slot)) {
    slot.read = true;
    slot_read(slot.filled.storage()->bytes());
  }
  return slot.filled;
}

// The values whose first-run storages still live unwritten (the program, or a node that kept them,
// holds them), held for the replay (an offload target's writer may let go of its copy meanwhile):
// a replay reads those instead of making them again.
std::vector<std::shared_ptr<Storage>> Segment::available_values() const {
  std::vector<std::shared_ptr<Storage>> available(values_.size());
  for (size_t v = 0; v < values_.size(); ++v) {
    std::shared_ptr<Storage> first = values_[v].first.lock();
    if (first && first->version() == values_[v].version) available[v] = std::move(first);
  }
  return available;
}

// Per op: run it (a wanted value, or an input of one run, needs it), serve it (all it is needed for
// is available), or skip it.
std::vector<Segment::Run> Segment::needed_ops(const std::vector<bool>& wanted,
                                              const std::vector<std::shared_ptr<Storage>>& available) const {
  std::vector<bool> value_needed = wanted;
  std::vector<Run> run(ops_.size(), Run::skip);
  for (size_t i = ops_.size(); i-- > 0;) {
    const Op& op = ops_[i];
    bool needed = false, made = false;
    for (int32_t m : op.makes) {
      if (m < 0 || !value_needed[static_cast<size_t>(m)]) continue;
      needed = true;
      made = made || available[static_cast<size_t>(m)] == nullptr;
    }
    if (!needed) continue;
    run[i] = made ? Run::run : Run::serve;
    if (!made) continue;
    for (const Source& s : op.inputs)
      if (s.kind == Source::Kind::made) value_needed[s.index] = true;
  }
  return run;
}

// Releases what no dropped value can need any more: the ops it would not run, the tensors only they
// read. Takes the digests of the values it made that something outside it still holds.
void Segment::close() {
  REMAT_ASSERT(open_, "segment '", label_, "' closed twice");
  uninstall();
  const TimeMark closed_at = backend(device_).mark_time();
  keep_what_is_needed();
  const Kept kept = measure_kept();
  write_record(kept, closed_at);
  if (profile_) {
    add_device_seconds(device_, opened_at_, closed_at, [p = profile_](double seconds) { p->forward_seconds = seconds; });
    profile_close(kept);
  }
  value_of_.clear();
  held_of_.clear();
  leaf_storages_.clear();
  declined_.clear();
  selective_kept_.clear();
}

// Drops the ops no dropped value needs (their FLOPs kept, to count them as skipped) and the held
// tensors only they read; digests what the ops that stay made and something outside still holds.
void Segment::keep_what_is_needed() {
  std::vector<bool> wanted(values_.size(), false);
  for (size_t v = 0; v < values_.size(); ++v) wanted[v] = !values_[v].slot.expired();
  const std::vector<Run> run = needed_ops(wanted, std::vector<std::shared_ptr<Storage>>(values_.size()));
  std::vector<bool> held_needed(held_.size(), false);
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (run[i] == Run::skip) {
      ops_[i].flops = ops_[i].op->flops();
      ops_[i].op.reset();
      ops_[i].inputs.clear();
      continue;
    }
    for (const Source& s : ops_[i].inputs)
      if (s.kind == Source::Kind::held) held_needed[s.index] = true;
    for (int32_t m : ops_[i].makes) {
      if (m < 0) continue;
      Value& v = values_[static_cast<size_t>(m)];
      std::shared_ptr<Storage> first = v.first.lock();
      if (first && first->version() == v.version)
        v.digest = take_digest(detail::tensor_over(first, v.offset, v.shape, v.strides, v.dtype));
    }
  }
  for (size_t h = 0; h < held_.size(); ++h)
    if (!held_needed[h]) held_[h] = Held{};
}

// What the region keeps from its forward to its backward, counted once a storage: what it holds to
// make its values again, and what its nodes saved that it could not drop (kept plainly); and, under
// a selective policy, the values of the kept op kinds that its nodes saved.
Segment::Kept Segment::measure_kept() const {
  Kept kept;
  std::unordered_set<const Storage*> counted;
  auto count = [&](const Storage& s) {
    if (!autodiff::counted_as_saved(s) || !counted.insert(&s).second) return false;
    kept.boundary_bytes += s.bytes();
    kept.storages.push_back(&s);
    return true;
  };
  for (const auto& [raw, weak] : declined_)
    if (std::shared_ptr<Storage> s = weak.lock(); s && s->saved_references() > 0 && count(*s))
      kept.saved_by_nodes += s->bytes();
  for (const Held& h : held_)
    if (h.saved.defined() && !h.saved.packed()) count(*h.saved.get().storage());  // (packed: an enclosing segment's)
  for (const auto& [raw, weak] : selective_kept_)
    if (std::shared_ptr<Storage> s = weak.lock(); s && s->saved_references() > 0) kept.selective_bytes += s->bytes();
  return kept;
}

// One row of the region records (Note [what a segment reports]).
void Segment::write_record(const Kept& kept, const TimeMark& closed_at) {
  auto& rc = region_counters();
  ++rc.created;
  if (rc.records.size() < kMaxRegionRecords) {
    record_index_ = rc.records.size();
    rc.first_record_of.emplace(label_, record_index_);
    RegionRecord rec;
    rec.label = label_;
    rec.kind = group_ ? "segment" : "layer";
    rc.records.push_back(std::move(rec));
  } else if (auto it = rc.first_record_of.find(label_); it != rc.first_record_of.end()) {
    record_index_ = it->second;
  }
  if (record_index_ >= rc.records.size()) return;
  RegionRecord& rec = rc.records[record_index_];
  rec.calls += calls_;
  rec.boundary_bytes = std::max(rec.boundary_bytes, kept.boundary_bytes);
  rec.cached_bytes = std::max(rec.cached_bytes, kept.selective_bytes);
  add_device_seconds(device_, opened_at_, closed_at, record_sink(record_index_, &RegionRecord::forward_seconds));
}

Tensor Segment::input_for(const Source& s, const std::vector<Tensor>& made) const {
  switch (s.kind) {
    case Source::Kind::undefined: return Tensor();
    case Source::Kind::made: {
      const Tensor& whole = made[s.index];
      REMAT_ASSERT(whole.defined(), "segment '", label_, "': an op read a value the replay had not made");
      return detail::tensor_over(whole.storage(), s.offset, s.shape, s.strides, s.dtype);
    }
    case Source::Kind::held: return held_value(s.index);
  }
  return Tensor();
}

std::string Segment::where(const Op& op) const {
  const std::string layer = op.call >= 0 ? call_labels_[static_cast<size_t>(op.call)] : std::string();
  return concat("checkpoint segment '", label_, "'", layer.empty() || layer == label_ ? "" : ", layer '" + layer + "'",
                ", op ", op.op->op());
}

// Output k of `op`, made again, has the first run's shape, dtype and layout (structure before values).
void Segment::check_replayed(const Op& op, size_t k, const Tensor& out) const {
  const Value& v = values_[static_cast<size_t>(op.makes[k])];
  const bool same = out.defined() && out.dtype() == v.dtype && out.shape() == v.shape && out.strides() == v.strides &&
                    out.offset() == v.offset && out.storage()->bytes() == v.bytes && out.device() == device_;
  REMAT_CHECK(same, where(op), ": recomputing it made output ", k, " as ",
              out.defined() ? concat(dtype_name(out.dtype()), " ", shape_str(out.shape())) : std::string("nothing"),
              " where its first run made ", dtype_name(v.dtype), " ", shape_str(v.shape),
              " (or the same with another layout); an op's forward must be a pure function of its inputs");
}

void Segment::replay() {
  std::vector<bool> wanted(values_.size(), false);
  bool any = false;
  for (size_t v = 0; v < values_.size(); ++v) {
    std::shared_ptr<Slot> slot = values_[v].slot.lock();
    wanted[v] = slot && !slot->filled.defined();
    any = any || wanted[v];
  }
  if (!any) return;
  Backend& device = backend(device_);
  const TimeMark start = device.mark_time();
  const size_t saved_before = device.allocator().stats().live(memory::Tag::saved);
  const Made made = make_values(wanted);
  fill_slots(wanted, made.values);
  const size_t saved_after = device.allocator().stats().live(memory::Tag::saved);
  const size_t filled = saved_after > saved_before ? saved_after - saved_before : 0;  // (allocator-measured)
  replay_end_ = device.mark_time();
  if (profile_) {
    add_device_seconds(device_, start, replay_end_, [p = profile_](double seconds) { p->recompute_seconds = seconds; });
    profile_replay_end(saved_before);
  }
  auto& rc = region_counters();
  ++rc.recomputed;
  ++rc.run_in_backward;
  if (record_index_ >= rc.records.size()) return;
  RegionRecord& rec = rc.records[record_index_];
  ++rec.recomputations;
  rec.recomputed_saved_bytes = filled;
  rec.recomputed_flops += made.recomputed_flops;
  rec.skipped_flops += made.skipped_flops;
  add_device_seconds(device_, start, replay_end_, record_sink(record_index_, &RegionRecord::recompute_seconds));
}

// Runs the forwards of the ops the wanted values need, in order, each on its first run's inputs
// and generator state, checking what each makes; reads what still lives where it is. Returns the
// wanted values (whole storages), the others let go after their last reader.
Segment::Made Segment::make_values(const std::vector<bool>& wanted) {
  const std::vector<std::shared_ptr<Storage>> available = available_values();
  const std::vector<Run> run = needed_ops(wanted, available);
  std::vector<size_t> last_read(values_.size(), 0);
  for (size_t i = 0; i < ops_.size(); ++i)
    if (run[i] == Run::run)
      for (const Source& s : ops_[i].inputs)
        if (s.kind == Source::Kind::made) last_read[s.index] = i;
  Made made;
  made.values.resize(values_.size());
  std::vector<Tensor>& values = made.values;
  autodiff::OpCounters& counters = autodiff::thread_state().counters;
  ReplayScope scope;  // recompute depth; the generator as it was, afterwards
  for (size_t i = 0; i < ops_.size(); ++i) {
    const Op& op = ops_[i];
    if (!op.op || run[i] == Run::skip) {  // (no op: no dropped value needed it when the segment closed)
      ++counters.skipped_ops;
      made.skipped_flops += op.op ? op.op->flops() : op.flops;
      continue;
    }
    if (run[i] == Run::serve) {  // what is needed of it lives: read as it is
      ++counters.cached_ops;
      for (int32_t m : op.makes)
        if (m >= 0 && available[static_cast<size_t>(m)]) values[m] = whole_value(m, available[static_cast<size_t>(m)]);
      continue;
    }
    TensorList args;
    args.reserve(op.inputs.size());
    for (const Source& s : op.inputs) args.push_back(input_for(s, values));
    set_rng_state(op.rng);
    const TensorList outs = op.op->run_forward(args);
    ++counters.forward_ops;
    ++counters.recomputed_ops;
    made.recomputed_flops += op.op->flops();
    REMAT_CHECK(outs.size() == op.makes.size(), where(op), ": recomputing it made ", outs.size(),
                " outputs where its first run made ", op.makes.size(), "; an op's forward must be a pure function of its inputs");
    for (size_t k = 0; k < op.makes.size(); ++k) {
      if (op.makes[k] < 0) continue;
      const auto v = static_cast<size_t>(op.makes[k]);
      check_replayed(op, k, outs[k]);
      // (a device's comparison is made at the end of the backward pass: the message holds its own words)
      check_digest(values_[v].digest, outs[k], [what = where(op)] { return recompute_mismatch(what); });
      values[v] = whole_value(v, outs[k].storage());
    }
    for (const Source& s : op.inputs)
      if (s.kind == Source::Kind::made && last_read[s.index] == i && !wanted[s.index]) values[s.index] = Tensor();
    for (int32_t m : op.makes)
      if (m >= 0 && !wanted[static_cast<size_t>(m)] && last_read[static_cast<size_t>(m)] <= i) values[m] = Tensor();
  }
  counters.forward_flops += made.recomputed_flops;
  counters.recomputed_flops += made.recomputed_flops;
  counters.skipped_flops += made.skipped_flops;
  return made;
}

// Fills the wanted values' slots, and counts the parameters the nodes hold from now on (Note [a
// region's parameters]). Returns the bytes filled.
size_t Segment::fill_slots(const std::vector<bool>& wanted, const std::vector<Tensor>& made) {
  for (const std::weak_ptr<Slot>& weak : leaf_slots_) {
    std::shared_ptr<Slot> slot = weak.lock();
    if (!slot || slot->counted) continue;
    slot->filled.storage()->add_saved_reference();
    slot->counted = true;
  }
  size_t filled = 0;
  for (size_t v = 0; v < values_.size(); ++v) {
    if (!wanted[v]) continue;
    std::shared_ptr<Slot> slot = values_[v].slot.lock();
    REMAT_ASSERT(made[v].defined(), "segment '", label_, "': value ", v, " was not made again");
    const size_t numel = values_[v].bytes / dtype_size(slot->dtype);
    slot->filled = detail::tensor_over(made[v].storage(), 0, {static_cast<int64_t>(numel)}, {1}, slot->dtype);
    slot->filled.storage()->add_saved_reference();
    slot->counted = true;
    filled += values_[v].bytes;
  }
  return filled;
}

// Value v's whole storage `storage`, as the value's dtype reads it.
Tensor Segment::whole_value(size_t v, const std::shared_ptr<Storage>& storage) const {
  return detail::tensor_over(storage, 0, {static_cast<int64_t>(values_[v].bytes / dtype_size(values_[v].dtype))}, {1},
                 values_[v].dtype);
}

void Segment::slot_read(size_t bytes) {
  read_live_ += bytes;
  read_peak_ = std::max(read_peak_, read_live_);
}

// The first value a node of the segment reads back: its backward starts.
void Segment::backward_start() {
  backward_started_ = true;
  replay_end_ = backend(device_).mark_time();  // (a replay, if one runs now, moves it)
  if (!profile_) return;
  const memory::Stats stats = backend(device_).allocator().stats();
  profile_->saved_live_at_backward = stats.live(memory::Tag::saved);
  profile_->saved_peak_at_backward = stats.peak(memory::Tag::saved);
}

void Segment::slot_released(size_t bytes, bool read) {
  if (read) read_live_ -= std::min(read_live_, bytes);
  if (live_slots_ == 0 || --live_slots_ > 0 || !backward_started_ || backward_timed_) return;
  backward_timed_ = true;  // the last value its nodes saved is gone: the segment's backward is over
  const TimeMark end = backend(device_).mark_time();
  auto& rc = region_counters();
  if (record_index_ < rc.records.size())
    add_device_seconds(device_, replay_end_, end, record_sink(record_index_, &RegionRecord::backward_seconds));
  if (profile_) {
    add_device_seconds(device_, replay_end_, end, [p = profile_](double seconds) { p->backward_seconds = seconds; });
    profile_backward_end();
  }
}

}  // namespace remat::detail
