// The checkpoint region node: first run (trace), replay in the backward pass. See region.h.
//
// Note [finding captured tensors]. While a region's first run is in progress a FirstRunObserver
// is installed. A tensor requiring grad that an op inside sees is an output of an earlier step of
// this region (its grad_fn is the region), one of the region's external inputs (kept, with an edge
// of its own: call steps receive them as they are, so a layer that keeps its input keeps the
// program's tensor), or comes from outside: a captured parameter or an activation computed before.
// The observer collects the gradient edges of the last kind and suppresses recording; they become
// extra edges of the region, so their gradients flow through the ordinary engine exactly once.
//
// Note [the sub-tape]. In the backward pass the region replays its steps on fresh leaves (aliases
// of the kept external values that require grad like the originals). Every node recorded then has
// a sequence number >= the one taken before the replay; the engine runs only those, and captures
// the gradients that reach any other node (the fresh leaves' accumulators, captured parameters'
// accumulators, nodes before the region): they are the region's input gradients.
//
// Note [selective caches]. Under selective:OPS the first run holds the outputs of the listed op
// kinds, in order; when the region closes it keeps those that some op of the region would save
// anyway under save-all (so the cache adds no bytes save-all would not keep) and drops the rest.
// The replay serves the kept ones in the same order instead of computing them. A region created
// while an outer one replays passes the outer one's cache requests on, so both stay aligned.
#include "region.h"

#include <algorithm>

#include "remat/backend.h"
#include "remat/dynamic.h"
#include "remat/memory.h"
#include "remat/ops.h"
#include "autodiff/digest.h"
#include "tensor/device_time.h"

namespace remat::detail {

namespace {

// Region records: one row per region up to this many; beyond, a region adds to the first row of
// its label (a label not seen yet is left out), so a long run keeps a bounded table.
constexpr size_t kMaxRegionRecords = 4096;

class FirstRunObserver final : public autodiff::RecordingObserver {
 public:
  FirstRunObserver(Region& region, autodiff::RecordingObserver* parent) : region_(region), parent_(parent) {}
  bool replay(const std::string& op, TensorList& outputs) override {
    region_.on_sequence(op);
    return parent_ != nullptr && parent_->replay(op, outputs);
  }
  bool defer(const std::string& op, const TensorList& inputs, TensorList& outputs,
             std::shared_ptr<const autodiff::OpReplay>& record_as) override {
    if (parent_ == nullptr || !parent_->defer(op, inputs, outputs, record_as)) return false;
    region_.on_deferred_by_parent(inputs, outputs);
    return true;
  }
  void after_forward(autodiff::OpEvent& event) override { region_.on_op(event); }
  bool suppress_recording(const TensorList& inputs) override {
    region_.on_recording(inputs);
    return true;
  }

 private:
  Region& region_;
  autodiff::RecordingObserver* parent_;
};

}  // namespace

RegionCounters& region_counters() {
  thread_local RegionCounters c;
  return c;
}

bool inside_first_run() { return dynamic_cast<FirstRunObserver*>(autodiff::recording_observer()) != nullptr; }

Region::Region(Kind kind, Policy policy, std::string label, std::shared_ptr<RegionProfile> profile,
               std::vector<schedule::PlanNode> sub_plan)
    : kind_(kind), policy_(Policy{policy.keep, Saved{policy.saved.dynamic_bytes, {}}}), label_(std::move(label)), profile_(std::move(profile)),
      sub_plan_(std::move(sub_plan)) {}

Region::~Region() {
  if (open_) autodiff::set_recording_observer(previous_observer_);
}

void Region::open(Device device) {
  REMAT_ASSERT(!open_ && !closed_, "region '", label_, "' opened twice");
  rng_ = rng_state();
  device_ = device;
  opened_at_ = backend(device_).mark_time();
  flops_at_open_ = autodiff::op_counters().forward_flops;
  trace_.expect(label_);
  observer_ = std::make_unique<FirstRunObserver>(*this, autodiff::recording_observer());
  previous_observer_ = autodiff::set_recording_observer(observer_.get());
  open_ = true;
}

Region::Ref Region::ref_for_input(const Tensor& t) {
  const TensorImpl* impl = t.impl_ptr().get();
  auto p = produced_.find(impl);
  if (p != produced_.end()) return p->second;
  auto e = external_of_.find(impl);
  if (e != external_of_.end()) return Ref{true, e->second, 0};
  External ext;
  ext.value = autodiff::SavedTensor(t);
  ext.requires_grad = t.requires_grad();
  ext.slot = next_edges.size();
  next_edges.push_back(autodiff::gradient_edge(t));
  uint32_t index = static_cast<uint32_t>(externals_.size());
  externals_.push_back(std::move(ext));
  external_of_[impl] = index;
  // a profiled region's output kept as this profiled region's input (budget.cpp, saved_output_bytes)
  if (const auto* from = dynamic_cast<const Region*>(t.grad_fn().get());
      profile_ && from && from != this && from->profile_ && t.storage()) {
    from->profile_->outputs_kept_bytes += from->profile_->outputs_kept_by == profile_.get() ? t.storage()->bytes() : 0;
    if (from->profile_->outputs_kept_by != profile_.get()) {
      from->profile_->outputs_kept_by = profile_.get();
      from->profile_->outputs_kept_bytes = t.storage()->bytes();
    }
  }
  return Ref{true, index, 0};
}

void Region::register_outputs(Step& step, TensorList& outputs, size_t count, const TensorList& inputs) {
  const uint32_t step_index = static_cast<uint32_t>(steps_.size());
  for (size_t i = 0; i < count; ++i) {
    Tensor& out = outputs[i];
    REMAT_CHECK(out.defined(), "checkpoint region '", label_, "': output ", i, " of ",
                step.is_call ? "a layer call" : step.op->op(), " is undefined");
    bool alias = out.grad_fn() != nullptr || out.requires_grad();
    for (const auto& in : inputs) alias = alias || out.same(in);
    if (alias) {  // a new handle: never rewire a tensor someone else holds
      Tensor made = out;
      out = out.detach();
      trace_.alias(made, out);
    }
    size_t slot = SIZE_MAX;
    if (is_floating(out.dtype())) {
      slot = autodiff::attach_output(out, shared_from_this());
      produced_impls_.push_back(out.impl_ptr());
    }
    produced_[out.impl_ptr().get()] = Ref{false, step_index, static_cast<uint32_t>(i)};
    step.output_slots.push_back(slot);
    step.digests.push_back(take_digest(out));
  }
}

// Adds the values a call step left behind (Note [values that leave a layer call]) as outputs of
// the node, after the step's own.
void Region::register_escaped(Step& step, TensorList& escaped) {
  const uint32_t step_index = static_cast<uint32_t>(steps_.size());
  for (Tensor& t : escaped) {
    const uint32_t k = static_cast<uint32_t>(step.output_slots.size());
    step.output_slots.push_back(autodiff::attach_output(t, shared_from_this()));
    produced_impls_.push_back(t.impl_ptr());
    produced_[t.impl_ptr().get()] = Ref{false, step_index, k};
    step.digests.push_back(take_digest(t));
  }
  escaped_values_ += escaped.size();
}

TensorList Region::add_call(const RegionFn& fn, const TensorList& inputs, const CallStepInfo& info) {
  REMAT_ASSERT(open_, "region '", label_, "': add_call on a closed region");
  Step step;
  step.is_call = true;
  step.fn = fn;
  step.info = info;
  step.rng = rng_state();
  for (size_t i = 0; i < inputs.size(); ++i) {
    REMAT_CHECK(inputs[i].defined(), "checkpoint region '", label_, "': input ", i, " is undefined");
    step.inputs.push_back(ref_for_input(inputs[i]));
  }
  const size_t cache_from = cache_.size();
  recorder_ = std::make_unique<CallRecorder>(
      inputs, [this](const Tensor& t) -> std::optional<std::pair<uint32_t, uint32_t>> {
        if (t.grad_fn().get() != this) return std::nullopt;
        auto p = produced_.find(t.impl_ptr().get());
        if (p == produced_.end() || p->second.external) return std::nullopt;
        return std::make_pair(p->second.index, p->second.output);
      });
  TensorList outputs;
  ++call_depth_;
  try {
    outputs = fn(inputs);
  } catch (...) {
    --call_depth_;
    recorder_.reset();
    throw;
  }
  --call_depth_;
  ++num_calls_;
  std::vector<const TensorImpl*> held;  // what the region itself holds of the call's values
  for (size_t c = cache_from; c < cache_.size(); ++c)
    for (const auto& t : cache_[c].pending)
      if (t.defined()) held.push_back(t.impl_ptr().get());
  CallRecorder::Outcome outcome = recorder_->finish(outputs, held);
  recorder_.reset();
  register_outputs(step, outputs, outputs.size(), inputs);
  if (outcome.trace) {
    step.trace = std::move(outcome.trace);
    // not called again: let the function (and the module it holds) go, so that a value the module
    // keeps, whose grad_fn is now this region, does not keep the module alive through the region
    step.fn = nullptr;
    ++traced_calls_;
    register_escaped(step, outcome.escaped);
  }
  steps_.push_back(std::move(step));
  return outputs;
}

void Region::on_sequence(const std::string& op) {
  trace_.on_sequence(op);
  if (recorder_) recorder_->before_op(op);
}

void Region::on_op(autodiff::OpEvent& event) {
  read_versions_.track(event.inputs);
  // one copy of the op's definition for all who keep it
  const std::shared_ptr<autodiff::OpReplay> replay = event.make_replay();
  if (recorder_) recorder_->after_op(event, replay);
  if (policy_.keep.kind == Policy::Kind::selective) {
    for (size_t i = 0; i < event.inputs.size(); ++i)
      if (event.inputs[i].defined() && event.saves_input(i))
        saved_by_ops_.emplace(event.inputs[i].storage().get(), event.inputs[i].storage());
    for (size_t i = 0; i < event.outputs.size(); ++i)
      if (event.outputs[i].defined() && event.saves_output(i))
        saved_by_ops_.emplace(event.outputs[i].storage().get(), event.outputs[i].storage());
    if (policy_.keep.keeps_op(event.op)) cache_.push_back({event.op, event.outputs, {}, false});
  }
  if (kind_ == Kind::segment && call_depth_ == 0) {
    // an op between layer calls: traced as a step of the segment
    Step step;
    step.op = replay;
    step.rng = rng_state();
    for (const auto& in : event.inputs) step.inputs.push_back(ref_for_input(in));
    register_outputs(step, event.outputs, event.visible, event.inputs);
    steps_.push_back(std::move(step));
  }
  trace_.on_event(event, replay);
}

bool Region::defer(const std::string& op, size_t ordinal, const TensorList& inputs, TensorList& outputs,
                   std::shared_ptr<const autodiff::OpReplay>& record_as) {
  if (dynamic_running() || !trace_.skips(ordinal, op)) return false;
  outputs = trace_.defer(ordinal, inputs, record_as, label_);
  return true;
}

void Region::on_recording(const TensorList& inputs) {
  for (const auto& in : inputs) {
    if (!in.requires_grad()) continue;
    if (in.grad_fn().get() == this) continue;                     // an output of an earlier step
    if (external_of_.count(in.impl_ptr().get())) continue;        // kept, with its own edge
    captured_.add(*this, autodiff::gradient_edge(in));
  }
}

bool Region::serve(const std::string& op, size_t& cursor, TensorList& outputs) {
  if (!policy_.keep.keeps_op(op)) return false;
  REMAT_CHECK(cursor < cache_.size() && cache_[cursor].op == op, "checkpoint region '", label_,
              "': its recomputation ran ops in a different order than its first run (op ", op,
              "); a region's function must be deterministic");
  CacheEntry& entry = cache_[cursor++];
  if (!entry.kept) return false;
  for (auto& s : entry.values) outputs.push_back(s.get());
  return true;
}

void Region::strip_outputs() {
  for (auto& weak : produced_impls_) {
    std::shared_ptr<TensorImpl> impl = weak.lock();
    if (impl && impl->grad_fn.get() == this) {
      impl->grad_fn.reset();
      impl->requires_grad = false;
      impl->output_nr = 0;
    }
  }
}

void Region::close() {
  REMAT_ASSERT(open_, "region '", label_, "' closed twice");
  autodiff::set_recording_observer(previous_observer_);
  open_ = false;
  closed_ = true;
  const TimeMark closed_at = backend(device_).mark_time();
  read_versions_.freeze();
  trace_.finish();
  for (auto& entry : cache_) {
    bool keep = !entry.pending.empty();
    for (const auto& t : entry.pending) keep = keep && t.defined() && saved_by_ops_.count(t.storage().get());
    if (keep)
      for (const auto& t : entry.pending) entry.values.emplace_back(t);
    entry.kept = keep;
    entry.pending.clear();
  }
  saved_by_ops_.clear();
  external_of_.clear();
  produced_.clear();
  valid_ = std::any_of(next_edges.begin(), next_edges.end(), [](const autodiff::Edge& e) { return e.valid(); });
  auto& rc = region_counters();
  ++rc.created;
  if (!valid_) {
    // nothing to differentiate: the outputs become plain tensors and the node goes away
    if (profile_) profile_->backward_done = true;  // a profiled stage with nothing to recompute
    strip_outputs();
    produced_impls_.clear();
    release_saved();
    return;
  }
  produced_impls_.clear();
  size_t boundary = 0;
  for (const auto& e : externals_) boundary += e.value.bytes();
  for (const auto& step : steps_)
    if (step.trace) boundary += step.trace->kept_bytes();
  size_t cached = 0;
  for (const auto& entry : cache_)
    for (const auto& v : entry.values) cached += v.bytes();
  if (rc.records.size() < kMaxRegionRecords) {
    record_index_ = rc.records.size();
    rc.first_record_of.emplace(label_, record_index_);
    RegionRecord rec;
    rec.label = label_;
    rec.kind = kind_ == Kind::segment ? "segment" : "layer";
    rc.records.push_back(std::move(rec));
  } else if (auto it = rc.first_record_of.find(label_); it != rc.first_record_of.end()) {
    record_index_ = it->second;
  }
  if (record_index_ < rc.records.size()) {
    RegionRecord& rec = rc.records[record_index_];
    rec.calls += num_calls_;
    rec.traced_calls += traced_calls_;
    rec.escaped_values += escaped_values_;
    rec.boundary_bytes = std::max(rec.boundary_bytes, boundary);
    rec.cached_bytes = std::max(rec.cached_bytes, cached);
    detail::add_device_seconds(device_, opened_at_, closed_at, record_sink(record_index_, &RegionRecord::forward_seconds));
  }
  if (profile_) {
    detail::add_device_seconds(device_, opened_at_, closed_at,
                               [p = profile_](double seconds) { p->forward_seconds = seconds; });
    profile_->forward_flops = autodiff::op_counters().forward_flops - flops_at_open_;
    profile_->boundary_bytes = boundary;
    profile_->output_bytes = 0;
    profile_->outputs_kept_by = nullptr;
    profile_->outputs_kept_bytes = 0;
    for (const auto& m : this->outputs) profile_->output_bytes += static_cast<size_t>(shape_numel(m.shape)) * dtype_size(m.dtype);
    profile_->backward_done = false;
  }
}

void Region::abort() {
  if (open_) autodiff::set_recording_observer(previous_observer_);
  open_ = false;
  closed_ = true;
  strip_outputs();
  produced_impls_.clear();
  produced_.clear();
  external_of_.clear();
  release_saved();
}

size_t Region::saved_bytes() const {
  size_t total = 0;
  for (const auto& e : externals_) total += e.value.bytes();
  for (const auto& step : steps_)
    if (step.trace) total += step.trace->kept_bytes();
  for (const auto& entry : cache_)
    for (const auto& v : entry.values) total += v.bytes();
  return total;
}

TensorList Region::apply(TensorList&&) {
  REMAT_ASSERT(false, "Region::apply is not used");
  return {};
}

void Region::release_saved() {
  for (auto& e : externals_) e.value.release();
  cache_.clear();
  steps_.clear();
  read_versions_.clear();
}

}  // namespace remat::detail
