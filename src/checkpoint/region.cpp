// The checkpoint region node: first run (trace), replay in the backward pass. See region.h.
//
// Note [finding captured tensors]. While a region's first run is in progress a FirstRunObserver
// is installed. Call steps receive history-free aliases of their external inputs, so a tensor
// requiring grad that an op inside sees is either an output of an earlier step of this region
// (its grad_fn is the region) or comes from outside: a captured parameter or an activation
// computed before. The observer collects the gradient edges of the latter and suppresses
// recording; they become extra edges of the region, so their gradients flow through the ordinary
// engine exactly once.
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
#include "autodiff/replay.h"
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
    return parent_ != nullptr && parent_->defer(op, inputs, outputs, record_as);
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

class RecomputeObserver final : public autodiff::RecordingObserver {
 public:
  explicit RecomputeObserver(Region& region) : region_(region) {}
  bool replay(const std::string& op, TensorList& outputs) override {
    ordinal_ = next_ordinal_++;
    return region_.serve(op, cursor, outputs);
  }
  bool defer(const std::string& op, const TensorList& inputs, TensorList& outputs,
             std::shared_ptr<const autodiff::OpReplay>& record_as) override {
    return region_.defer(op, ordinal_, inputs, outputs, record_as);
  }
  void after_forward(autodiff::OpEvent&) override {}
  bool suppress_recording(const TensorList&) override { return false; }
  size_t cursor = 0;

 private:
  Region& region_;
  size_t next_ordinal_ = 0, ordinal_ = 0;  // Note [skipping dead ops]
};

// Adds seconds to a field of this thread's region record `index` (when it still exists).
detail::SecondsSink record_sink(size_t index, double RegionRecord::*field) {
  return [index, field](double seconds) {
    auto& records = region_counters().records;
    if (index < records.size()) records[index].*field += seconds;
  };
}

const schedule::PlanNode* plan_node_at(const std::vector<schedule::PlanNode>& plan, int position) {
  for (const auto& node : plan)
    if (node.first <= position && position <= node.last) return &node;
  return nullptr;
}

}  // namespace

RegionCounters& region_counters() {
  thread_local RegionCounters c;
  return c;
}

bool inside_first_run() { return dynamic_cast<FirstRunObserver*>(autodiff::recording_observer()) != nullptr; }

Region::Region(Kind kind, Policy policy, std::string label, std::shared_ptr<RegionProfile> profile,
               std::vector<schedule::PlanNode> sub_plan)
    : kind_(kind), policy_(policy.keep()), label_(std::move(label)), profile_(std::move(profile)),
      sub_plan_(std::move(sub_plan)) {}

Region::~Region() {
  if (open_) autodiff::set_recording_observer(previous_observer_);
}

void Region::open(Device device) {
  REMAT_ASSERT(!open_ && !closed_, "region '", label_, "' opened twice");
  rng_ = rng_state();
  device_ = device;
  opened_at_ = backend(device_).mark_time();
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
    step.digests.push_back(recompute_digest(out));
  }
}

TensorList Region::add_call(const RegionFn& fn, const TensorList& inputs, const CallStepInfo& info) {
  REMAT_ASSERT(open_, "region '", label_, "': add_call on a closed region");
  Step step;
  step.is_call = true;
  step.fn = fn;
  step.info = info;
  step.rng = rng_state();
  TensorList args;
  args.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    REMAT_CHECK(inputs[i].defined(), "checkpoint region '", label_, "': input ", i, " is undefined");
    Ref r = ref_for_input(inputs[i]);
    step.inputs.push_back(r);
    args.push_back(r.external ? inputs[i].detach() : inputs[i]);
  }
  TensorList outputs;
  ++call_depth_;
  try {
    outputs = fn(args);
  } catch (...) {
    --call_depth_;
    throw;
  }
  --call_depth_;
  ++num_calls_;
  register_outputs(step, outputs, outputs.size(), inputs);
  steps_.push_back(std::move(step));
  return outputs;
}

void Region::on_op(autodiff::OpEvent& event) {
  read_versions_.track(event.inputs);
  if (policy_.kind == Policy::Kind::selective) {
    for (size_t i = 0; i < event.inputs.size(); ++i)
      if (event.inputs[i].defined() && event.saves_input(i))
        saved_by_ops_.emplace(event.inputs[i].storage().get(), event.inputs[i].storage());
    for (size_t i = 0; i < event.outputs.size(); ++i)
      if (event.outputs[i].defined() && event.saves_output(i))
        saved_by_ops_.emplace(event.outputs[i].storage().get(), event.outputs[i].storage());
    if (policy_.keeps_op(event.op)) cache_.push_back({event.op, event.outputs, {}, false});
  }
  if (kind_ == Kind::segment && call_depth_ == 0) {
    // an op between layer calls: traced as a step of the segment
    Step step;
    step.op = event.make_replay();
    step.rng = rng_state();
    for (const auto& in : event.inputs) step.inputs.push_back(ref_for_input(in));
    register_outputs(step, event.outputs, event.visible, event.inputs);
    steps_.push_back(std::move(step));
  }
  trace_.on_event(event);
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
  if (!policy_.keeps_op(op)) return false;
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
    rec.boundary_bytes = std::max(rec.boundary_bytes, boundary);
    rec.cached_bytes = std::max(rec.cached_bytes, cached);
    detail::add_device_seconds(device_, opened_at_, closed_at, record_sink(record_index_, &RegionRecord::forward_seconds));
  }
  if (profile_) {
    detail::add_device_seconds(device_, opened_at_, closed_at,
                               [p = profile_](double seconds) { p->forward_seconds = seconds; });
    profile_->boundary_bytes = boundary;
    profile_->output_bytes = 0;
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

TensorList Region::replay_call(const Step& step, const TensorList& inputs, std::shared_ptr<Region>& nested) {
  if (sub_plan_.empty()) return step.fn(inputs);
  const int position = step.info.position;
  const schedule::PlanNode* node = plan_node_at(sub_plan_, position);
  REMAT_CHECK(node != nullptr, "checkpoint region '", label_, "': layer call ", position,
              " is outside its plan; a model's layer calls must be the same on every run");
  if (node->kind == schedule::PlanNode::Kind::stage) {
    ScopedPolicy record_all(Policy::save_all());
    return step.fn(inputs);
  }
  if (!nested) {
    REMAT_CHECK(position == node->first, "checkpoint region '", label_, "': plan region ", schedule::format_tree({*node}),
                " entered at layer call ", position);
    nested = std::make_shared<Region>(Kind::segment, Policy::every_layer(),
                                      "R[" + std::to_string(node->first) + ".." + std::to_string(node->last) + "]",
                                      nullptr, node->children);
    nested->open(device_);
  }
  TensorList outputs = nested->add_call(step.fn, inputs, step.info);
  if (position == node->last) {
    nested->close();
    nested.reset();
  }
  return outputs;
}

// Note [recomputation check] (digest.cpp): step s's recomputed outputs against its first run's.
void Region::check_recomputed(size_t s, const TensorList& outs) const {
  const Step& step = steps_[s];
  for (size_t k = 0; k < step.digests.size(); ++k) {
    if (!step.digests[k]) continue;
    const std::optional<uint64_t> now = recompute_digest(outs[k]);
    if (!now || *now == *step.digests[k]) continue;
    const std::string& layer = step.is_call ? step.info.site.label : std::string();
    throw Error(recompute_mismatch(concat(
        "checkpoint region '", label_, "'", layer.empty() || layer == label_ ? "" : ", layer '" + layer + "'",
        ", output ", k, " of ", step.is_call ? "a layer call" : "op " + step.op->op(), " (step ", s, ")")));
  }
}

// The kept external values as fresh leaves of the sub-tape (Note [the sub-tape]), requiring grad
// like the originals.
TensorList Region::fresh_leaves() const {
  TensorList leaves;
  leaves.reserve(externals_.size());
  for (const auto& e : externals_) {
    Tensor leaf;
    try {
      leaf = e.value.get();
    } catch (const Error& err) {
      throw Error(detail::concat("checkpoint region '", label_, "': ", err.what()));
    }
    if (e.requires_grad && is_floating(leaf.dtype())) leaf.requires_grad_(true);
    leaves.push_back(leaf);
  }
  return leaves;
}

// Step s recomputed as many outputs as its first run, each of the same shape, dtype and device.
void Region::check_replayed_shapes(size_t s, const TensorList& outs) const {
  const Step& step = steps_[s];
  REMAT_CHECK(outs.size() >= step.output_slots.size(), "checkpoint region '", label_, "': step ", s,
              " returned ", outs.size(), " outputs on recomputation, ", step.output_slots.size(),
              " on the first run; a region's function must be deterministic");
  for (size_t k = 0; k < step.output_slots.size(); ++k) {
    const size_t slot = step.output_slots[k];
    if (slot == SIZE_MAX) continue;
    const autodiff::OutputMeta& first = this->outputs[slot];
    REMAT_CHECK(outs[k].defined() && outs[k].shape() == first.shape && outs[k].dtype() == first.dtype &&
                    outs[k].device() == first.device,
                "checkpoint region '", label_, "': output ", k, " of step ", s, " is ",
                outs[k].defined() ? std::string(dtype_name(outs[k].dtype())) + " " + shape_str(outs[k].shape()) + " on " +
                                        device_name(outs[k].device())
                                  : std::string("undefined"),
                " on recomputation, ", dtype_name(first.dtype), " ", shape_str(first.shape), " on ",
                device_name(first.device), " on the first run; a region's function must be deterministic");
  }
}

// Replays every step on `leaves` with recording on, under the region's RNG state and policy,
// selective caches served (Note [selective caches]); returns each step's outputs.
std::vector<TensorList> Region::replay_steps(const TensorList& leaves) {
  std::vector<TensorList> replayed(steps_.size());
  RecomputeObserver observer(*this);
  {
    ReplayScope replay(rng_);
    ScopedPolicy policy(policy_);
    EnableGradGuard grad(true);
    autodiff::ObserverScope observing(&observer);
    std::shared_ptr<Region> nested;
    try {
      for (size_t s = 0; s < steps_.size(); ++s) {
        const Step& step = steps_[s];
        TensorList args;
        args.reserve(step.inputs.size());
        for (const Ref& r : step.inputs) args.push_back(r.external ? leaves[r.index] : replayed[r.index].at(r.output));
        TensorList outs;
        if (step.is_call) {
          set_rng_state(step.rng);
          outs = replay_call(step, args, nested);
        } else {
          outs = step.op->run(args);
        }
        check_replayed_shapes(s, outs);
        check_recomputed(s, outs);
        replayed[s] = std::move(outs);
      }
    } catch (...) {
      if (nested) nested->abort();
      throw;
    }
    if (nested) nested->close();
  }
  REMAT_CHECK(observer.cursor == cache_.size(), "checkpoint region '", label_, "': its recomputation ran ",
              observer.cursor, " kept ops where the first run had ", cache_.size(),
              "; a region's function must be deterministic");
  return replayed;
}

// Backward through the sub-tape only, from the gradients of the node's outputs that reached the
// region. The sub-tape's nodes are referenced by `replayed` only; the engine frees saved values as
// it goes, and the rest goes with `replayed`.
autodiff::EngineResult Region::backward_replayed(std::vector<TensorList> replayed, const TensorList& grad_outputs,
                                                 uint64_t first_sequence_nr) const {
  std::vector<autodiff::Edge> roots;
  TensorList root_grads;
  for (size_t s = 0; s < steps_.size(); ++s) {
    for (size_t k = 0; k < steps_[s].output_slots.size(); ++k) {
      const size_t slot = steps_[s].output_slots[k];
      if (slot == SIZE_MAX || slot >= grad_outputs.size() || !grad_outputs[slot].defined()) continue;
      autodiff::Edge e = autodiff::gradient_edge(replayed[s][k]);
      if (!e.valid()) continue;
      roots.push_back(e);
      root_grads.push_back(grad_outputs[slot]);
    }
  }
  autodiff::EngineResult result = autodiff::backward_subtape(std::move(roots), std::move(root_grads), first_sequence_nr);
  replayed.clear();
  return result;
}

// One more recomputation in the counters, the region's record and its profile.
void Region::record_recomputation(const TimeMark& recompute_start, const TimeMark& backward_start,
                                  const TimeMark& backward_end, size_t recomputed_saved,
                                  const autodiff::OpCounters& ops_before, const autodiff::OpCounters& ops_after) {
  auto& rc = region_counters();
  ++rc.recomputed;
  ++rc.run_in_backward;
  if (record_index_ < rc.records.size()) {
    auto& rec = rc.records[record_index_];
    ++rec.recomputations;
    rec.recomputed_saved_bytes = recomputed_saved;
    detail::add_device_seconds(device_, recompute_start, backward_start,
                               record_sink(record_index_, &RegionRecord::recompute_seconds));
    detail::add_device_seconds(device_, backward_start, backward_end,
                               record_sink(record_index_, &RegionRecord::backward_seconds));
    rec.recomputed_flops += ops_after.recomputed_flops - ops_before.recomputed_flops;
    rec.skipped_flops += ops_after.skipped_flops - ops_before.skipped_flops;
  }
  if (profile_) {
    detail::add_device_seconds(device_, recompute_start, backward_start,
                               [p = profile_](double seconds) { p->recompute_seconds = seconds; });
    detail::add_device_seconds(device_, backward_start, backward_end,
                               [p = profile_](double seconds) { p->backward_seconds = seconds; });
    profile_->saved_bytes = recomputed_saved;
    const memory::Stats s = backend(device_).allocator().stats();
    profile_->held_peak_at_backward_end =
        s.peak(memory::Tag::parameter) + s.peak(memory::Tag::gradient) + s.peak(memory::Tag::other);
    profile_->backward_done = true;
  }
}

// The gradients that left the sub-tape, per edge of the node: the fresh leaves' to their
// externals' edges, the captured edges' to theirs (Note [finding captured tensors]).
std::vector<TensorList> Region::route_input_grads(const TensorList& leaves, const autodiff::EngineResult& result) const {
  std::vector<TensorList> input_grads(next_edges.size());
  std::unordered_map<const autodiff::Node*, size_t> leaf_slots;
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (!leaves[i].requires_grad()) continue;
    leaf_slots[autodiff::gradient_edge(leaves[i]).node.get()] = externals_[i].slot;
  }
  autodiff::route_captured(
      result, leaf_slots, captured_,
      [&](size_t slot, size_t c) {
        for (const auto& g : result.captured_grads[c]) input_grads[slot].push_back(g);
      },
      [&](const autodiff::Edge& e) {
        throw Error(detail::concat("checkpoint region '", label_, "': its recomputation used a tensor requiring grad ",
                                   "(reached through ", e.node->name(), ") that its first run did not; a region's ",
                                   "function must be deterministic"));
      });
  return input_grads;
}

std::vector<TensorList> Region::apply_contributions(TensorList&& grad_outputs) {
  REMAT_CHECK(closed_ && !open_, "checkpoint region '", label_,
              "': the backward pass reached it while its forward pass was still running");
  // The clock and the counters are those of the device the region's values live on; its time
  // marks are read later (Note [timing without waiting] in src/tensor/device_time.cpp).
  Backend& device = backend(device_);
  auto saved_live = [&device] { return device.allocator().stats().live(memory::Tag::saved); };
  const TimeMark recompute_start = device.mark_time();
  if (profile_) {
    const memory::Stats s = device.allocator().stats();
    profile_->saved_live_at_backward = s.live(memory::Tag::saved);
    profile_->saved_peak_at_backward = s.peak(memory::Tag::saved);
  }
  read_versions_.check("checkpoint region '" + label_ + "'");
  const TensorList leaves = fresh_leaves();
  const uint64_t first_sequence_nr = autodiff::next_sequence_nr();
  const size_t saved_before = saved_live();
  const autodiff::OpCounters ops_before = autodiff::op_counters();
  std::vector<TensorList> replayed = replay_steps(leaves);
  trace_.end_recomputation();
  const autodiff::OpCounters ops_after = autodiff::op_counters();
  const size_t saved_after = saved_live();
  const TimeMark backward_start = device.mark_time();

  const autodiff::EngineResult result = backward_replayed(std::move(replayed), grad_outputs, first_sequence_nr);
  const TimeMark backward_end = device.mark_time();

  record_recomputation(recompute_start, backward_start, backward_end,
                       saved_after > saved_before ? saved_after - saved_before : 0, ops_before, ops_after);
  return route_input_grads(leaves, result);
}

}  // namespace remat::detail
