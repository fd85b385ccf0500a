// Checkpoint regions. See include/remat/checkpoint.h for the design; the notes here cover the
// mechanics.
//
// Note [finding captured tensors]. While a region's function runs for the first time, a
// DiscoveryObserver is installed (autodiff/RecordingObserver). The region passes history-free
// aliases of its inputs to fn, so any tensor requiring grad that an op inside sees must come
// from outside the region: a captured parameter or an activation computed before the region.
// The observer collects their gradient edges and suppresses recording. Those edges become the
// region node's extra edges, so their gradients flow through the ordinary engine exactly once.
//
// Note [the sub-tape]. In the backward pass the region re-runs fn on fresh leaves (aliases of the
// kept inputs that require grad like the originals). Every node recorded then has a sequence
// number >= the number taken before the re-run; the engine runs only those, and captures the
// gradients that reach any other node (the fresh leaves' accumulators, captured parameters'
// accumulators, and nodes before the region). These captured gradients are the region's
// input gradients.
//
// Note [selective caches]. Under selective:OPS the first run keeps the outputs of the listed op
// kinds in order; the re-run serves them back in the same order instead of computing them. An
// inner region created while an outer one is re-run passes replay requests to the outer one and
// keeps what it is served in its own cache, so both levels stay aligned.
#include "remat/checkpoint.h"

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "remat/memory.h"
#include "remat/ops.h"
#include "remat/random.h"

namespace remat {

namespace {

constexpr size_t kMaxRegionRecords = 1 << 16;

struct RegionCounters {
  uint64_t created = 0;
  uint64_t recomputed = 0;
  std::vector<RegionRecord> records;
};
RegionCounters& region_counters() {
  thread_local RegionCounters c;
  return c;
}

struct EdgeHash {
  size_t operator()(const autodiff::Edge& e) const { return std::hash<const void*>()(e.node.get()) * 31 + e.input_nr; }
};

class RegionNode;

// Installed while a region's function runs for the first time.
class DiscoveryObserver final : public autodiff::RecordingObserver {
 public:
  DiscoveryObserver(RegionNode& region, autodiff::RecordingObserver* parent) : region_(region), parent_(parent) {}
  bool replay(const std::string& op, TensorList& outputs) override {
    return parent_ != nullptr && parent_->replay(op, outputs);
  }
  void after_forward(const std::string& op, const TensorList& outputs) override;
  bool suppress_recording(const TensorList& inputs) override;

 private:
  RegionNode& region_;
  autodiff::RecordingObserver* parent_;
};

// Installed while a region's function is re-run in the backward pass.
class RecomputeObserver final : public autodiff::RecordingObserver {
 public:
  explicit RecomputeObserver(RegionNode& region) : region_(region) {}
  bool replay(const std::string& op, TensorList& outputs) override;
  void after_forward(const std::string&, const TensorList&) override {}
  bool suppress_recording(const TensorList&) override { return false; }
  size_t cursor = 0;

 private:
  RegionNode& region_;
};

class RegionNode final : public autodiff::Node {
 public:
  RegionNode(RegionFn fn, Policy policy, std::string label, std::shared_ptr<RegionProfile> profile)
      : fn_(std::move(fn)), policy_(std::move(policy)), label_(std::move(label)), profile_(std::move(profile)) {}

  std::string name() const override { return "Checkpoint(" + label_ + ")"; }
  size_t saved_bytes() const override {
    size_t total = 0;
    for (auto& s : inputs_) total += s.bytes();
    for (auto& entry : cache_)
      for (auto& s : entry.values) total += s.bytes();
    return total;
  }

  TensorList run_forward(const TensorList& inputs) {
    rng_ = rng_state();
    num_inputs_ = inputs.size();
    TensorList aliases;
    for (const auto& in : inputs) {
      inputs_.emplace_back(in);
      input_requires_grad_.push_back(in.requires_grad());
      aliases.push_back(in.detach());
      next_edges.push_back(autodiff::gradient_edge(in));
    }
    TensorList outputs;
    {
      DiscoveryObserver observer(*this, autodiff::recording_observer());
      auto* previous = autodiff::set_recording_observer(&observer);
      try {
        outputs = fn_(aliases);
      } catch (...) {
        autodiff::set_recording_observer(previous);
        throw;
      }
      autodiff::set_recording_observer(previous);
    }
    return outputs;
  }

  void add_external(const autodiff::Edge& edge) {
    if (!edge.valid()) return;
    if (external_index_.count(edge)) return;
    external_index_[edge] = next_edges.size();
    next_edges.push_back(edge);
  }

  void keep_outputs(const std::string& op, const TensorList& outputs) {
    if (!policy_.keeps_op(op)) return;
    CacheEntry entry;
    entry.op = op;
    for (const auto& out : outputs) entry.values.emplace_back(out);
    cache_.push_back(std::move(entry));
  }

  bool serve(const std::string& op, size_t& cursor, TensorList& outputs) {
    if (!policy_.keeps_op(op)) return false;
    REMAT_CHECK(cursor < cache_.size() && cache_[cursor].op == op, "checkpoint region '", label_,
                "': its recomputation ran ops in a different order than its first run (op ", op,
                "); a region's function must be deterministic");
    for (auto& s : cache_[cursor].values) outputs.push_back(s.get());
    ++cursor;
    return true;
  }

  TensorList apply(TensorList&&) override { REMAT_ASSERT(false, "RegionNode::apply is not used"); return {}; }
  bool returns_contributions() const override { return true; }
  std::vector<TensorList> apply_contributions(TensorList&& grad_outputs) override;

  void release_saved() override {
    for (auto& s : inputs_) s.release();
    cache_.clear();
  }

  const Policy& policy() const { return policy_; }
  size_t record_index = SIZE_MAX;
  size_t cache_bytes() const {
    size_t total = 0;
    for (auto& entry : cache_)
      for (auto& s : entry.values) total += s.bytes();
    return total;
  }
  size_t input_bytes() const {
    size_t total = 0;
    for (auto& s : inputs_) total += s.bytes();
    return total;
  }

 private:
  struct CacheEntry {
    std::string op;
    std::vector<autodiff::SavedTensor> values;
  };

  RegionFn fn_;
  Policy policy_;
  std::string label_;
  RngState rng_;
  size_t num_inputs_ = 0;
  std::vector<autodiff::SavedTensor> inputs_;
  std::vector<bool> input_requires_grad_;
  std::unordered_map<autodiff::Edge, size_t, EdgeHash> external_index_;
  std::vector<CacheEntry> cache_;
  std::shared_ptr<RegionProfile> profile_;
};

void DiscoveryObserver::after_forward(const std::string& op, const TensorList& outputs) {
  region_.keep_outputs(op, outputs);
}

bool DiscoveryObserver::suppress_recording(const TensorList& inputs) {
  for (const auto& in : inputs)
    if (in.requires_grad()) region_.add_external(autodiff::gradient_edge(in));
  return true;
}

bool RecomputeObserver::replay(const std::string& op, TensorList& outputs) { return region_.serve(op, cursor, outputs); }

// Restores thread state on every exit path of a recomputation.
class RecomputeScope {
 public:
  RecomputeScope(RngState replay_state, const Policy& policy, autodiff::RecordingObserver* observer)
      : rng_(rng_state()), policy_(policy), grad_(true), observer_(autodiff::set_recording_observer(observer)) {
    set_rng_state(replay_state);
    autodiff::set_recompute_depth(autodiff::recompute_depth() + 1);
  }
  ~RecomputeScope() {
    autodiff::set_recompute_depth(autodiff::recompute_depth() - 1);
    autodiff::set_recording_observer(observer_);
    set_rng_state(rng_);
  }

 private:
  RngState rng_;
  ScopedPolicy policy_;
  EnableGradGuard grad_;
  autodiff::RecordingObserver* observer_;
};

std::vector<TensorList> RegionNode::apply_contributions(TensorList&& grad_outputs) {
  using Clock = std::chrono::steady_clock;
  const auto recompute_start = Clock::now();
  if (profile_) {
    profile_->saved_live_at_backward = memory::live_bytes(memory::Tag::saved);
    profile_->saved_peak_at_backward = memory::peak_bytes(memory::Tag::saved);
  }
  // Fresh leaves for the kept inputs.
  TensorList leaves;
  for (size_t i = 0; i < num_inputs_; ++i) {
    Tensor leaf = inputs_[i].get();
    if (input_requires_grad_[i] && is_floating(leaf.dtype())) leaf.requires_grad_(true);
    leaves.push_back(leaf);
  }
  const uint64_t first_sequence_nr = autodiff::next_sequence_nr();
  const size_t saved_before = memory::live_bytes(memory::Tag::saved);
  TensorList outputs;
  RecomputeObserver observer(*this);
  {
    RecomputeScope scope(rng_, policy_, &observer);
    outputs = fn_(leaves);
  }
  const size_t saved_after = memory::live_bytes(memory::Tag::saved);
  REMAT_CHECK(observer.cursor == cache_.size(), "checkpoint region '", label_, "': its recomputation ran ",
              observer.cursor, " kept ops where the first run had ", cache_.size(),
              "; a region's function must be deterministic");
  REMAT_CHECK(outputs.size() == this->outputs.size(), "checkpoint region '", label_, "': recomputation returned ",
              outputs.size(), " outputs, the first run ", this->outputs.size());

  auto& rc = region_counters();
  ++rc.recomputed;
  if (record_index < rc.records.size()) {
    auto& rec = rc.records[record_index];
    ++rec.recomputations;
    rec.recomputed_saved_bytes = saved_after > saved_before ? saved_after - saved_before : 0;
  }

  const auto backward_start = Clock::now();
  // Backward through the sub-tape only.
  std::vector<autodiff::Edge> roots;
  TensorList root_grads;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!grad_outputs[i].defined()) continue;
    REMAT_CHECK(outputs[i].shape() == this->outputs[i].shape, "checkpoint region '", label_, "': output ", i,
                " has shape ", shape_str(outputs[i].shape()), " on recomputation, ", shape_str(this->outputs[i].shape),
                " on the first run");
    autodiff::Edge e = autodiff::gradient_edge(outputs[i]);
    if (!e.valid()) continue;
    roots.push_back(e);
    root_grads.push_back(grad_outputs[i]);
  }
  // The sub-tape's nodes are referenced by `outputs` only; the engine frees saved values as it goes.
  autodiff::EngineResult result = autodiff::backward_subtape(std::move(roots), std::move(root_grads), first_sequence_nr);
  outputs.clear();
  if (profile_) {
    profile_->recompute_seconds = std::chrono::duration<double>(backward_start - recompute_start).count();
    profile_->backward_seconds = std::chrono::duration<double>(Clock::now() - backward_start).count();
    profile_->saved_bytes = saved_after > saved_before ? saved_after - saved_before : 0;
    profile_->backward_done = true;
  }

  std::vector<TensorList> input_grads(next_edges.size());
  std::unordered_map<const autodiff::Node*, size_t> leaf_index;
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (!leaves[i].requires_grad()) continue;
    autodiff::Edge e = autodiff::gradient_edge(leaves[i]);
    leaf_index[e.node.get()] = i;
  }
  for (size_t c = 0; c < result.captured_edges.size(); ++c) {
    const autodiff::Edge& e = result.captured_edges[c];
    const TensorList& grads = result.captured_grads[c];
    if (grads.empty()) continue;
    auto li = leaf_index.find(e.node.get());
    size_t slot;
    if (li != leaf_index.end()) {
      slot = li->second;
    } else {
      auto xi = external_index_.find(e);
      REMAT_CHECK(xi != external_index_.end(), "checkpoint region '", label_, "': its recomputation used a tensor ",
                  "requiring grad (reached through ", e.node->name(), ") that its first run did not; a region's ",
                  "function must be deterministic");
      slot = xi->second;
    }
    for (const auto& g : grads) input_grads[slot].push_back(g);
  }
  return input_grads;
}

Policy effective_policy(const std::optional<Policy>& override_policy) {
  return override_policy.value_or(current_policy());
}

}  // namespace

bool is_recomputing() { return autodiff::recompute_depth() > 0; }

TensorList checkpoint(const RegionFn& fn, const TensorList& inputs, const CheckpointOptions& options) {
  REMAT_CHECK(static_cast<bool>(fn), "checkpoint: the region function is empty");
  for (size_t i = 0; i < inputs.size(); ++i) REMAT_CHECK(inputs[i].defined(), "checkpoint: input ", i, " is undefined");
  Policy policy = effective_policy(options.policy);
  REMAT_CHECK(policy.kind != Policy::Kind::budget,
              "checkpoint: a budget policy applies to a Chain (the planner chooses its regions), not to a single region");
  // A plain call: no recomputation wanted, nothing to record, or already inside a region's first
  // run (the enclosing region covers this one; it becomes a region of its own when re-run).
  auto* observer = autodiff::recording_observer();
  bool inside_first_run = observer != nullptr && dynamic_cast<DiscoveryObserver*>(observer) != nullptr;
  if (!policy.recomputes() || !grad_enabled() || inside_first_run) {
    ScopedPolicy scope(policy);
    return fn(inputs);
  }
  auto region = std::make_shared<RegionNode>(fn, policy, options.label.empty() ? "region" : options.label,
                                             options.profile);
  TensorList outputs;
  const auto forward_start = std::chrono::steady_clock::now();
  {
    ScopedPolicy scope(policy);
    outputs = region->run_forward(inputs);
  }
  if (options.profile) {
    options.profile->forward_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - forward_start).count();
    options.profile->boundary_bytes = region->input_bytes();
    options.profile->output_bytes = 0;
    for (const auto& out : outputs) options.profile->output_bytes += out.nbytes();
    options.profile->backward_done = false;
  }
  bool any_edge = false;
  for (const auto& e : region->next_edges) any_edge = any_edge || e.valid();
  auto& rc = region_counters();
  ++rc.created;
  if (!any_edge) return outputs;  // nothing to differentiate: the region node is dropped
  if (rc.records.size() < kMaxRegionRecords) {
    region->record_index = rc.records.size();
    rc.records.push_back({options.label.empty() ? "region" : options.label, region->input_bytes(),
                          region->cache_bytes(), 0, 0});
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    REMAT_CHECK(outputs[i].defined(), "checkpoint: region output ", i, " is undefined");
    Tensor out = outputs[i].detach();  // a new handle: never rewire a tensor the caller passed in
    region->outputs.push_back({out.shape(), out.dtype(), out.device()});
    if (is_floating(out.dtype())) {
      out.impl().grad_fn = region;
      out.impl().output_nr = static_cast<uint32_t>(i);
      out.impl().requires_grad = true;
    }
    outputs[i] = out;
  }
  return outputs;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input, const CheckpointOptions& options) {
  REMAT_CHECK(static_cast<bool>(fn), "checkpoint: the region function is empty");
  return checkpoint([fn](const TensorList& in) { return TensorList{fn(in[0])}; }, TensorList{input}, options)[0];
}

TensorList grad(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs, const GradOptions& options) {
  std::optional<ScopedPolicy> scope;
  if (options.policy) scope.emplace(*options.policy);
  Tensor loss = f(inputs);
  scope.reset();
  return grad(TensorList{loss}, inputs, TensorList{}, options.retain_graph);
}

Tensor backward(const std::function<Tensor()>& f, const GradOptions& options) {
  std::optional<ScopedPolicy> scope;
  if (options.policy) scope.emplace(*options.policy);
  Tensor loss = f();
  scope.reset();
  backward(TensorList{loss}, TensorList{}, options.retain_graph);
  return loss;
}

Counters counters() {
  Counters c;
  c.ops = autodiff::op_counters();
  c.regions_created = region_counters().created;
  c.regions_recomputed = region_counters().recomputed;
  c.regions = region_counters().records;
  return c;
}

void reset_counters() {
  autodiff::reset_op_counters();
  region_counters() = {};
}

}  // namespace remat
