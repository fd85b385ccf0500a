// The checkpoint region's backward pass: the replay of its steps, the recomputation check, the
// backward of the sub-tape and the routing of its gradients. The first run is region.cpp; see
// region.h and the Notes at the top of region.cpp.
#include <map>
#include <optional>
#include <unordered_set>

#include "autodiff/digest.h"
#include "autodiff/replay.h"
#include "autodiff/state.h"
#include "region.h"
#include "remat/backend.h"
#include "remat/memory.h"
#include "tensor/device_time.h"

namespace remat::detail {

namespace {
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

const schedule::PlanNode* plan_node_at(const std::vector<schedule::PlanNode>& plan, int position) {
  for (const auto& node : plan)
    if (node.first <= position && position <= node.last) return &node;
  return nullptr;
}

}  // namespace

// A call step in the replay: the layer called again, or, for a call that left values behind, its
// ops replayed (Note [values that leave a layer call]); under a sub-plan, as a call of the nested
// region or the recorded stage its position belongs to.
TensorList Region::replay_call(const Step& step, const TensorList& inputs, std::shared_ptr<Region>& nested,
                               const std::vector<TensorList>& replayed) {
  RegionFn fn = step.fn;
  if (step.trace) {
    // the values of earlier steps it reads, captured: a nested region may run it again later
    std::map<std::pair<uint32_t, uint32_t>, Tensor> values;
    for (const auto& [s, k] : step.trace->region_values()) values[{s, k}] = replayed.at(s).at(k);
    fn = [trace = step.trace, values = std::move(values)](const TensorList& in) {
      return trace->replay(in, [&values](uint32_t s, uint32_t k) { return values.at({s, k}); });
    };
  }
  if (sub_plan_.empty()) return fn(inputs);
  const int position = step.info.position;
  const schedule::PlanNode* node = plan_node_at(sub_plan_, position);
  REMAT_CHECK(node != nullptr, "checkpoint region '", label_, "': layer call ", position,
              " is outside its plan; a model's layer calls must be the same on every run");
  if (node->kind == schedule::PlanNode::Kind::stage) {
    ScopedPolicy record_all(Policy::save_all());
    return fn(inputs);
  }
  if (!nested) {
    REMAT_CHECK(position == node->first, "checkpoint region '", label_, "': plan region ", schedule::format_tree({*node}),
                " entered at layer call ", position);
    nested = std::make_shared<Region>(Kind::segment, Policy::every_layer(),
                                      "R[" + std::to_string(node->first) + ".." + std::to_string(node->last) + "]",
                                      nullptr, node->children);
    nested->open(device_);
  }
  TensorList outputs = nested->add_call(fn, inputs, step.info);
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
    // what names the step, by value: a device's comparison is made at the end of the backward pass
    const std::string layer = step.is_call ? step.info.site.label : std::string();
    const std::string what = concat("checkpoint region '", label_, "'",
                                    layer.empty() || layer == label_ ? "" : ", layer '" + layer + "'", ", output ", k,
                                    " of ", step.is_call ? "a layer call" : "op " + step.op->op(), " (step ", s, ")");
    check_digest(step.digests[k], outs[k], [what] { return recompute_mismatch(what); });
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
          outs = replay_call(step, args, nested, replayed);
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

// Of what the re-run saved, the bytes of the region's outputs themselves (an op that saves its
// output, such as tanh): the storage the next layer call keeps as its input, counted once.
size_t Region::saved_output_bytes(const std::vector<TensorList>& replayed, const TensorList& leaves) const {
  std::unordered_set<const Storage*> seen;
  for (const auto& leaf : leaves)
    if (leaf.defined()) seen.insert(leaf.storage().get());
  size_t total = 0;
  for (size_t s = 0; s < steps_.size(); ++s) {
    for (size_t k = 0; k < steps_[s].output_slots.size() && k < replayed[s].size(); ++k) {
      const Tensor& out = replayed[s][k];
      if (steps_[s].output_slots[k] == SIZE_MAX || !out.defined() || !out.storage()) continue;
      if (out.storage()->tag() != memory::Tag::saved || !seen.insert(out.storage().get()).second) continue;
      total += out.storage()->bytes();
    }
  }
  return total;
}

// How many saved values hold each leaf, before the re-run (saved_input_bytes).
std::vector<int> Region::saved_holders_of(const TensorList& leaves) {
  std::vector<int> out;
  out.reserve(leaves.size());
  for (const auto& leaf : leaves) out.push_back(leaf.defined() && leaf.storage() ? autodiff::saved_holders(*leaf.storage()) : 0);
  return out;
}

// Of the region's inputs, the bytes the re-run's ops saved (their storage gained saved holders
// since `before`): what a record of this layer call holds of its input (ChainCosts::saved_input_bytes).
size_t Region::saved_input_bytes(const TensorList& leaves, const std::vector<int>& before) {
  std::unordered_set<const Storage*> seen;
  size_t total = 0;
  for (size_t k = 0; k < leaves.size(); ++k) {
    const Tensor& leaf = leaves[k];
    if (!leaf.defined() || !leaf.storage() || autodiff::saved_holders(*leaf.storage()) <= before[k]) continue;
    if (!autodiff::counted_as_saved(*leaf.storage()) || !seen.insert(leaf.storage().get()).second) continue;
    total += leaf.storage()->bytes();
  }
  return total;
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
  const std::vector<int> leaf_references = profile_ ? saved_holders_of(leaves) : std::vector<int>{};
  std::optional<autodiff::StreamProbe> probe;  // Note [a record read back value by value]
  if (profile_) probe.emplace();
  std::vector<TensorList> replayed = replay_steps(leaves);
  if (profile_) profile_->saved_input_bytes = saved_input_bytes(leaves, leaf_references);
  trace_.end_recomputation();
  const autodiff::OpCounters ops_after = autodiff::op_counters();
  const size_t saved_after = saved_live();
  const TimeMark backward_start = device.mark_time();
  if (profile_) profile_->saved_output_bytes = saved_output_bytes(replayed, leaves);

  if (probe) probe->reading();
  const autodiff::EngineResult result = backward_replayed(std::move(replayed), grad_outputs, first_sequence_nr);
  const TimeMark backward_end = device.mark_time();
  if (probe) profile_->streamed_bytes = probe->peak();
  probe.reset();

  record_recomputation(recompute_start, backward_start, backward_end,
                       saved_after > saved_before ? saved_after - saved_before : 0, ops_before, ops_after);
  return route_input_grads(leaves, result);
}

}  // namespace remat::detail
