// The backward engine: runs the nodes reachable from the roots in reverse creation order
// (highest sequence number first), each once all gradients for it have arrived.
//
// Only "needed" nodes run: an executable node from which some terminal can be reached, where a
// terminal is a leaf accumulator (when accumulating) or a captured edge. Executable means created
// at or after task.min_sequence_nr, and not an accumulator unless accumulating. A loop (scan)
// runs the engine over a recomputed turn's sub-tape with capture_all_frontier: gradients that
// leave the sub-tape (towards its inputs, captured parameters or earlier nodes) are returned
// instead of being propagated, so the loop can hand them on along its own edges.
//
// Note [leaf gradients are transactional]. A backward pass that accumulates into leaves changes
// no leaf's .grad() until every node has run. When a leaf's AccumulateGrad node runs, all the
// contributions to that leaf's gradient have arrived (the engine runs a node only after every
// node feeding it): that is the leaf's *final point*. The node is then only staged
// (AccumulateGrad::stage: a fresh copy of the gradient if the leaf has none yet, otherwise the
// incoming gradient is held), and after the last node ran, the engine commits the staged leaves
// in staging order (AccumulateGrad::commit: install the copy, or add in place; it cannot fail).
// If anything throws before that (an op's backward, a checkpointed function during its
// recomputation, a failed allocation), the staged values are dropped and every leaf's .grad()
// is exactly as before the call. Cost: nothing extra when the leaves have no gradient yet (the
// usual zero_grad() loop); when accumulating into existing gradients, the incoming gradients
// are held until the end instead of being added one by one. A GradReadyHook (remat/grad_ready.h:
// an optimizer step in the backward, an all-reduce bucket) is called at the final point, in
// Engine::stage_leaf; the leaf is then committed at once and so opts out of the rollback.
#include <algorithm>
#include <atomic>
#include <optional>
#include <queue>
#include <unordered_map>

#include "autodiff/digest.h"
#include "autodiff/history.h"
#include "autodiff/kernels.h"
#include "autodiff/state.h"
#include "remat/autodiff.h"
#include "remat/grad_ready.h"

namespace remat::autodiff {

namespace {

struct EdgeKey {
  const Node* node;
  uint32_t input_nr;
  bool operator==(const EdgeKey&) const = default;
};
struct EdgeKeyHash {
  size_t operator()(const EdgeKey& k) const { return hash_edge(k.node, k.input_nr); }
};

struct NodeInfo {
  bool visited = false;
  bool needed = false;
  int dependencies = 0;
  TensorList buffer;
};

void accumulate(Tensor& slot, const Tensor& grad) {
  if (!grad.defined()) return;
  if (!slot.defined())
    slot = grad;
  else
    slot = kernels::binary(BinaryOp::add, slot, grad);
}

class Engine {
 public:
  explicit Engine(EngineTask& task) : task_(task) {
    for (size_t i = 0; i < task_.capture.size(); ++i) {
      // the same edge asked for twice (grad(f, {P, P})): one slot collects, the copies read it
      auto [it, inserted] = capture_index_.emplace(key(task_.capture[i]), i);
      if (!inserted) duplicate_captures_.push_back({i, it->second});
    }
    result_.captured_edges = task_.capture;
    result_.captured_grads.resize(task_.capture.size());
  }

  EngineResult run() {
    // a device's recomputation checks are read at the end (Note [device digests are read once a
    // backward pass] in digest.cpp); a region's sub-tape leaves them to the pass it runs in
    std::optional<detail::DeferredDigestChecks> digest_checks;
    if (!task_.capture_all_frontier) digest_checks.emplace();
    discover();
    std::priority_queue<std::pair<uint64_t, Node*>> ready;
    for (size_t i = 0; i < task_.roots.size(); ++i) send(task_.roots[i], task_.root_grads[i], ready, false);
    for (auto& [node, info] : info_)
      if (info.needed && info.dependencies == 0 && !info.buffer.empty()) ready.push({node->sequence_nr(), node});
    if (prefetch_wanted()) plan_prefetch();
    while (!ready.empty()) {
      Node* node = ready.top().second;
      ready.pop();
      prefetch_ahead(node);
      execute(node, ready);
    }
    // A check an asynchronous device deferred (an id out of range) fails here, before anything is
    // committed (Backend::raise_deferred_errors; waits only where a check is pending). A region's
    // sub-tape leaves it to the backward pass it runs in.
    if (!task_.capture_all_frontier) {
      digest_checks->finish();  // its read is a wait that reads the deferred checks too
      raise_deferred_errors();
    }
    // Every node ran: the commit point of the leaves' gradients (Note [leaf gradients are
    // transactional]). Nothing below throws.
    for (auto& leaf : staged_) leaf.node->commit(std::move(leaf.staged));
    staged_.clear();
    for (auto [copy, original] : duplicate_captures_) result_.captured_grads[copy] = result_.captured_grads[original];
    return std::move(result_);
  }

 private:
  static EdgeKey key(const Edge& e) { return {e.node.get(), e.input_nr}; }

  bool executable(const Node* node) const {
    return node->sequence_nr() >= task_.min_sequence_nr && (!node->is_accumulator() || task_.accumulate_into_leaves);
  }
  bool captured(const Edge& e) const {
    if (capture_index_.count(key(e))) return true;
    return task_.capture_all_frontier && !executable(e.node.get());
  }
  bool terminal(const Edge& e) const {
    return captured(e) || (executable(e.node.get()) && e.node->is_accumulator());
  }

  // Finds the executable nodes reachable from the roots (iterative DFS), then marks the needed
  // ones in creation order (a node's inputs were created before it, so their status is known when
  // it is decided: with several roots, one root may lie on another's path, which a post-order DFS
  // from the roots would decide too early), and counts dependencies between needed nodes.
  void discover() {
    std::vector<std::pair<Node*, size_t>> stack;
    std::vector<Node*> reached;
    auto visit = [&](Node* n) {
      auto& info = info_[n];
      if (info.visited) return;
      info.visited = true;
      reached.push_back(n);
      stack.push_back({n, 0});
    };
    for (auto& root : task_.roots)
      if (root.valid() && executable(root.node.get())) visit(root.node.get());
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < node->next_edges.size()) {
        const Edge& e = node->next_edges[next++];
        if (e.valid() && executable(e.node.get())) visit(e.node.get());
        continue;
      }
      stack.pop_back();
    }
    std::sort(reached.begin(), reached.end(),
              [](const Node* a, const Node* b) { return a->sequence_nr() < b->sequence_nr(); });
    for (Node* node : reached) {
      bool needed = node->is_accumulator();
      for (const Edge& e : node->next_edges) {
        if (!e.valid()) continue;
        if (terminal(e) || (executable(e.node.get()) && info_[e.node.get()].needed)) needed = true;
      }
      info_[node].needed = needed;
    }
    for (Node* node : reached) {
      if (!info_[node].needed) continue;
      for (const Edge& e : node->next_edges)
        if (e.valid() && executable(e.node.get()) && info_[e.node.get()].needed) ++info_[e.node.get()].dependencies;
    }
  }

  // Prefetching: the needed nodes in the order they will run (highest sequence number first);
  // before a node runs, the saved values of the next kPrefetchAhead nodes are asked for.
  static constexpr size_t kPrefetchAhead = 4;
  void plan_prefetch() {
    for (auto& [node, info] : info_)
      if (info.needed) prefetch_order_.push_back(node);
    std::sort(prefetch_order_.begin(), prefetch_order_.end(),
              [](const Node* a, const Node* b) { return a->sequence_nr() > b->sequence_nr(); });
  }
  void prefetch_ahead(const Node* running) {
    if (prefetch_order_.empty()) return;
    while (next_to_run_ < prefetch_order_.size() &&
           prefetch_order_[next_to_run_]->sequence_nr() >= running->sequence_nr())
      ++next_to_run_;
    const size_t until = std::min(prefetch_order_.size(), next_to_run_ + kPrefetchAhead);
    for (size_t i = std::max(prefetched_until_, next_to_run_); i < until; ++i) prefetch_order_[i]->prefetch_saved();
    prefetched_until_ = std::max(prefetched_until_, until);
  }

  void send(const Edge& e, const Tensor& grad, std::priority_queue<std::pair<uint64_t, Node*>>& ready,
            bool count_dependency) {
    if (!e.valid()) return;
    if (grad.defined()) {
      const OutputMeta& meta = e.node->outputs.at(e.input_nr);
      REMAT_ASSERT(grad.shape() == meta.shape, "gradient of shape ", shape_str(grad.shape()), " sent to ",
                   e.node->name(), " output ", e.input_nr, " of shape ", shape_str(meta.shape));
    }
    send_contributions(e, grad.defined() ? TensorList{grad} : TensorList{}, ready, count_dependency);
  }

  void send_contributions(const Edge& e, const TensorList& grads, std::priority_queue<std::pair<uint64_t, Node*>>& ready,
                          bool count_dependency) {
    if (!e.valid()) return;
    if (captured(e)) {
      auto it = capture_index_.find(key(e));
      size_t slot;
      if (it == capture_index_.end()) {
        slot = result_.captured_edges.size();
        capture_index_[key(e)] = slot;
        result_.captured_edges.push_back(e);
        result_.captured_grads.emplace_back();
      } else {
        slot = it->second;
      }
      for (const auto& g : grads)
        if (g.defined()) result_.captured_grads[slot].push_back(g);
    }
    if (!executable(e.node.get())) return;
    auto it = info_.find(e.node.get());
    if (it == info_.end() || !it->second.needed) return;
    NodeInfo& info = it->second;
    if (info.buffer.empty()) info.buffer.resize(e.node->outputs.size());
    for (const auto& g : grads) {
      if (!g.defined()) continue;
      const OutputMeta& meta = e.node->outputs.at(e.input_nr);
      REMAT_ASSERT(g.shape() == meta.shape, "gradient of shape ", shape_str(g.shape()), " sent to ", e.node->name(),
                   " output ", e.input_nr, " of shape ", shape_str(meta.shape));
      accumulate(info.buffer[e.input_nr], g);
    }
    if (count_dependency && --info.dependencies == 0) ready.push({e.node->sequence_nr(), e.node.get()});
  }

  void execute(Node* node, std::priority_queue<std::pair<uint64_t, Node*>>& ready) {
    NodeInfo& info = info_[node];
    TensorList grads = std::move(info.buffer);
    info.buffer.clear();
    grads.resize(node->outputs.size());
    bool any = false;
    for (auto& g : grads) any = any || g.defined();
    std::vector<TensorList> contributions;
    if (any) {
      ++thread_state().counters.backward_nodes;
      if (node->is_accumulator()) {
        stage_leaf(node, grads.at(0));
      } else if (node->returns_contributions()) {
        contributions = node->apply_contributions(std::move(grads));
      } else {
        TensorList input_grads = node->apply(std::move(grads));
        for (auto& g : input_grads) contributions.push_back(g.defined() ? TensorList{std::move(g)} : TensorList{});
      }
    }
    if (!task_.retain_graph) node->release_saved();
    contributions.resize(node->next_edges.size());
    std::vector<Edge> edges = node->next_edges;
    for (size_t i = 0; i < edges.size(); ++i) send_contributions(edges[i], contributions[i], ready, true);
  }

  // A leaf's final point: all of its gradient for this backward has arrived.
  void stage_leaf(Node* node, const Tensor& grad) {
    auto accumulator = std::dynamic_pointer_cast<AccumulateGrad>(node->shared_from_this());
    REMAT_ASSERT(accumulator != nullptr, node->name(), " is an accumulator but not an AccumulateGrad");
    StagedLeaf staged{accumulator, accumulator->stage(grad)};
    if (GradReadyHook* hook = GradReadyHook::current()) {
      accumulator->commit(std::move(staged.staged));
      (*hook)(Tensor(accumulator->leaf()));
      return;
    }
    staged_.push_back(std::move(staged));
  }

  struct StagedLeaf {
    std::shared_ptr<AccumulateGrad> node;
    AccumulateGrad::Staged staged;
  };

  EngineTask& task_;
  EngineResult result_;
  std::vector<StagedLeaf> staged_;  // in staging order; committed when every node has run
  std::vector<std::pair<size_t, size_t>> duplicate_captures_;  // (repeated slot, first slot)
  std::unordered_map<EdgeKey, size_t, EdgeKeyHash> capture_index_;
  std::unordered_map<Node*, NodeInfo> info_;
  std::vector<Node*> prefetch_order_;
  size_t next_to_run_ = 0, prefetched_until_ = 0;
};

}  // namespace

Tensor EngineResult::summed(size_t i) const {
  Tensor total;
  for (const auto& g : captured_grads.at(i)) accumulate(total, g);
  return total;
}

EngineResult run_engine(EngineTask task) {
  REMAT_ASSERT(task.roots.size() == task.root_grads.size());
  Engine engine(task);
  return engine.run();
}

EngineResult backward_subtape(std::vector<Edge> roots, TensorList root_grads, uint64_t min_sequence_nr) {
  EngineTask task;
  task.roots = std::move(roots);
  task.root_grads = std::move(root_grads);
  task.accumulate_into_leaves = false;
  task.min_sequence_nr = min_sequence_nr;
  task.capture_all_frontier = true;
  NoGradGuard no_grad;
  return run_engine(std::move(task));
}

// ---- public entry points

namespace {
std::atomic<BackwardListener> backward_listener{nullptr};

// Counts a top-level backward run while it lives; the outermost one notifies the listener when
// it ends normally (a run inside another's backward belongs to that one).
class BackwardRun {
 public:
  BackwardRun() { ++thread_state().backward_depth; }
  ~BackwardRun() { --thread_state().backward_depth; }
  BackwardRun(const BackwardRun&) = delete;
  BackwardRun& operator=(const BackwardRun&) = delete;
  void finished() {
    const ThreadState& state = thread_state();
    if (state.backward_depth != 1) return;
    if (BackwardListener l = backward_listener.load()) l(state.quiet_backward == 0);
  }
};
}  // namespace

void set_backward_listener(BackwardListener listener) { backward_listener.store(listener); }

static void prepare_roots(const TensorList& outputs, const TensorList& grad_outputs, const char* op,
                          std::vector<Edge>& roots, TensorList& grads) {
  REMAT_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(), op, ": ", outputs.size(),
              " outputs but ", grad_outputs.size(), " output gradients");
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    REMAT_CHECK(out.defined(), op, ": output ", i, " is undefined");
    Edge e = gradient_edge(out);
    REMAT_CHECK(e.valid(), op, ": output ", i, " (shape ", shape_str(out.shape()),
                ") does not require grad and has no grad_fn");
    Tensor g = grad_outputs.empty() ? Tensor() : grad_outputs[i];
    if (!g.defined()) {
      REMAT_CHECK(out.numel() == 1, op, ": output ", i, " of shape ", shape_str(out.shape()),
                  " is not a scalar; pass its gradient explicitly");
      g = ones(out.shape(), out.dtype(), memory::Tag::other, out.device());
    }
    REMAT_CHECK(g.shape() == out.shape(), op, ": gradient of shape ", shape_str(g.shape()), " for output ", i,
                " of shape ", shape_str(out.shape()));
    REMAT_CHECK(g.dtype() == out.dtype(), op, ": gradient dtype ", dtype_name(g.dtype()), " for output ", i,
                " of dtype ", dtype_name(out.dtype()));
    roots.push_back(e);
    grads.push_back(g);
  }
}

}  // namespace remat::autodiff

namespace remat {

namespace {
thread_local GradReadyHook* active_grad_ready_hook = nullptr;
}

GradReadyHook::GradReadyHook(GradReadyFn fn) : fn_(std::move(fn)), previous_(active_grad_ready_hook) {
  REMAT_CHECK(static_cast<bool>(fn_), "GradReadyHook: the function is empty");
  active_grad_ready_hook = this;
}

GradReadyHook::~GradReadyHook() { active_grad_ready_hook = previous_; }

GradReadyHook* GradReadyHook::current() { return active_grad_ready_hook; }

void GradReadyHook::operator()(const Tensor& leaf) const {
  // not active while it runs: a backward() inside the hook reports to the enclosing one
  GradReadyHook* self = active_grad_ready_hook;
  active_grad_ready_hook = previous_;
  struct Restore {
    GradReadyHook* hook;
    ~Restore() { active_grad_ready_hook = hook; }
  } restore{self};
  fn_(leaf);
}

void backward(const TensorList& outputs, const TensorList& grad_outputs, bool retain_graph) {
  autodiff::EngineTask task;
  autodiff::prepare_roots(outputs, grad_outputs, "backward", task.roots, task.root_grads);
  task.retain_graph = retain_graph;
  NoGradGuard no_grad;
  autodiff::BackwardRun run;
  autodiff::run_engine(std::move(task));
  run.finished();
}

TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs,
                bool retain_graph, bool allow_unused) {
  autodiff::EngineTask task;
  autodiff::prepare_roots(outputs, grad_outputs, "grad", task.roots, task.root_grads);
  for (size_t i = 0; i < inputs.size(); ++i) {
    REMAT_CHECK(inputs[i].defined() && inputs[i].requires_grad(), "grad: input ", i,
                " does not require grad");
    task.capture.push_back(autodiff::gradient_edge(inputs[i]));
  }
  task.accumulate_into_leaves = false;
  task.retain_graph = retain_graph;
  NoGradGuard no_grad;
  autodiff::BackwardRun run;
  auto result = autodiff::run_engine(std::move(task));
  run.finished();
  TensorList grads(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    grads[i] = result.summed(i);
    // an input listed twice gets its own copy of the same gradient, never a shared handle
    for (size_t j = 0; j < i && grads[i].defined(); ++j)
      if (result.captured_edges[j] == result.captured_edges[i] && grads[j].same(grads[i]))
        grads[i] = kernels::copy(grads[i]);
    if (!grads[i].defined()) {
      REMAT_CHECK(allow_unused, "grad: the outputs do not depend on input ", i);
      grads[i] = zeros(inputs[i].shape(), inputs[i].dtype(), memory::Tag::other, inputs[i].device());
    }
  }
  return grads;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  remat::backward({*this}, gradient.defined() ? TensorList{gradient} : TensorList{}, retain_graph);
}

}  // namespace remat
