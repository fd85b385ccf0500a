// remat/autodiff.h - define-by-run reverse-mode differentiation.
//
// Every differentiable op called on tensors that require grad records a Node on the tape. A Node
// knows its op's backward formula, the edges to the nodes that produced its inputs, and the values
// its backward needs, each held by a SavedTensor (the one place where stored values live).
//
//   Tensor w = randn({3, 3}).requires_grad_();
//   Tensor loss = (matmul(x, w).tanh()).sum();
//   loss.backward();                      // accumulates into w.grad()
//   Tensor again = (matmul(x, w).tanh()).sum();
//   TensorList g = remat::grad({again}, {w});   // returns the gradient without touching w.grad()
//
// The backward pass frees each node's saved values as soon as the node has run (unless
// retain_graph is set), so memory falls as the backward proceeds.
//
// Custom ops wrap a hand-written kernel or another AD tool (the analogue of a ChainRules rrule):
//
//   remat::CustomOp square{
//       "square",
//       [](const TensorList& in, remat::SaveContext& ctx) {   // forward
//         ctx.save(in[0]);
//         return TensorList{remat::mul(in[0], in[0])};
//       },
//       [](const TensorList& grads, const remat::SavedValues& saved) {  // backward
//         return TensorList{remat::mul(remat::mul_scalar(saved[0], 2.0), grads[0])};
//       }};
//   Tensor y = square({x})[0];
//
// The backward may read saved values any number of times. Under checkpointing the forward may be
// run again during the backward pass, on the same inputs (so it must be a pure function of them
// apart from remat's own RNG: a recomputed value that differs from its first run's is a
// remat::Error), and the backward is called once per use of the op. An effect beyond the outputs
// goes in `side_effect`, which no recomputation repeats.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "remat/counters.h"
#include "remat/tensor.h"

namespace remat {

// ---- grad mode
bool grad_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};
class EnableGradGuard {
 public:
  explicit EnableGradGuard(bool enabled = true);
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

// ---- running the backward pass
// Accumulates d(sum of outputs[i] * grad_outputs[i]) into the .grad() of every leaf reached.
// A missing grad_output is 1 for a one-element output (and an error otherwise). Transactional
// for leaf gradients: if it throws (an op's backward, a checkpointed function that fails when it
// is recomputed, an allocation), every leaf's .grad() is as before the call. The graph is
// consumed all the same (saved values already used are released) unless retain_graph is set.
void backward(const TensorList& outputs, const TensorList& grad_outputs = {}, bool retain_graph = false);
// Returns d(sum outputs[i] * grad_outputs[i]) / d inputs[j]; leaves' .grad() are left untouched.
// An input the outputs do not depend on gets a zero gradient (allow_unused) or an error. An input
// listed twice gets the full gradient in both entries.
TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs = {},
                bool retain_graph = false, bool allow_unused = true);

namespace autodiff {

class Node;
struct Edge {
  std::shared_ptr<Node> node;
  uint32_t input_nr = 0;
  bool valid() const { return node != nullptr; }
  bool operator==(const Edge& o) const { return node == o.node && input_nr == o.input_nr; }
};
struct OutputMeta {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
};

struct PackedStorage;  // internal (saved_tensor.cpp)

// A value kept for a backward pass. It holds a history-free alias of the tensor (no reference
// cycle through the node that saved it) and counts the storage in the `saved` memory account
// while it holds it. get() throws if the value was released or overwritten in place since.
// While saved-value hooks are in force (remat/saved_hooks.h) it keeps what the hooks packed
// instead, and get() unpacks it.
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& value);
  ~SavedTensor();
  SavedTensor(SavedTensor&& other) noexcept;
  SavedTensor& operator=(SavedTensor&& other) noexcept;
  SavedTensor(const SavedTensor&) = delete;
  SavedTensor& operator=(const SavedTensor&) = delete;

  Tensor get() const;
  void release();
  bool defined() const { return value_.defined() || packed_ != nullptr; }
  size_t bytes() const;  // bytes of the storage it stands for
  bool packed() const { return packed_ != nullptr; }
  // Tells packing hooks that get() will be called soon (no effect without hooks).
  void prefetch() const;

 private:
  Tensor value_;                                 // without hooks
  std::shared_ptr<PackedStorage> packed_;  // with hooks, and the view on the storage:
  int64_t offset_ = 0;
  Shape shape_;
  Strides strides_;
  DType dtype_ = DType::f32;
  std::shared_ptr<const uint64_t> watch_;  // packed: the original storage's version, even once it is freed
  uint64_t version_ = 0;
  bool released_ = false;
};

// A node of the tape: one recorded op (or a checkpoint region, or a leaf's accumulator).
class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  virtual std::string name() const = 0;
  // One gradient per output (undefined when none reached it) -> one per next edge (undefined
  // when that input gets no gradient).
  virtual TensorList apply(TensorList&& grad_outputs) = 0;
  // Nodes that forward gradients computed elsewhere (checkpoint regions) may return, per input
  // edge, several contributions in the order they arose; the engine adds them one by one, so
  // the floating-point sum is the same as if the contributing ops had been recorded here.
  virtual bool returns_contributions() const { return false; }
  virtual std::vector<TensorList> apply_contributions(TensorList&& grad_outputs) { return {}; }
  // Drops the values kept for apply(); called after apply() unless the graph is retained.
  virtual void release_saved() {}
  virtual bool is_accumulator() const { return false; }
  // Bytes this node keeps for its backward (for counters and tests).
  virtual size_t saved_bytes() const { return 0; }
  // Called by the engine a few nodes before this one runs: saved values that packing hooks moved
  // away may be brought back meanwhile.
  virtual void prefetch_saved() const {}

  uint64_t sequence_nr() const { return sequence_nr_; }
  std::vector<Edge> next_edges;     // one per input
  std::vector<OutputMeta> outputs;  // one per output

 private:
  uint64_t sequence_nr_;
};

// True while some packed saved value has hooks that can prefetch (the engine then looks ahead).
bool prefetch_wanted();

// The next sequence number a new node will get (nodes are numbered in creation order).
uint64_t next_sequence_nr();

// The edge along which a gradient for `t` flows: its grad_fn, or its leaf accumulator.
// Invalid when t does not require grad.
Edge gradient_edge(const Tensor& t);

// Accumulates into a leaf's .grad(), in two steps so that a backward pass can be transactional
// (the engine stages every leaf as it is reached and commits them all once every node has run):
//   stage(g):  validates g and prepares the update without touching the leaf: a fresh gradient
//              buffer holding a copy of g when the leaf has no gradient yet, else g itself;
//   commit():  installs that buffer, or adds g in place into the existing .grad(); cannot fail.
// apply() does both at once.
class AccumulateGrad final : public Node {
 public:
  struct Staged {
    Tensor fresh;      // the leaf's new .grad() (it had none)
    Tensor increment;  // to add to the leaf's existing .grad()
    bool adopt = false;  // fresh is the incoming gradient's own buffer, retagged at commit
  };
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf);
  std::string name() const override { return "AccumulateGrad"; }
  Staged stage(const Tensor& grad) const;
  void commit(Staged staged) noexcept;
  TensorList apply(TensorList&& grad_outputs) override;
  bool is_accumulator() const override { return true; }
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

// The engine. `min_sequence_nr` limits execution to nodes created at or after it (a loop uses this
// to run the backward of a recomputed turn's sub-tape only); edges to any node that
// is not executed are "captured": the gradient arriving there is summed and returned.
struct EngineTask {
  std::vector<Edge> roots;
  TensorList root_grads;
  bool accumulate_into_leaves = true;  // run AccumulateGrad nodes
  uint64_t min_sequence_nr = 0;
  bool capture_all_frontier = false;   // capture every edge to a node that is not executed
  std::vector<Edge> capture;           // edges whose incoming gradient is returned
  bool retain_graph = false;
};
struct EngineResult {
  std::vector<Edge> captured_edges;
  // parallel to captured_edges (capture order, then frontier order): the gradients that arrived
  // there, in arrival order (not summed; see Node::apply_contributions)
  std::vector<TensorList> captured_grads;
  Tensor summed(size_t i) const;  // their sum, added in arrival order
};
EngineResult run_engine(EngineTask task);
// The backward of a sub-tape (nodes created at or after min_sequence_nr), run under no-grad:
// every gradient that leaves it (to leaves' accumulators or older nodes) is captured, in arrival
// order. Used by scan turns.
EngineResult backward_subtape(std::vector<Edge> roots, TensorList root_grads, uint64_t min_sequence_nr);

// Called when an outermost backward() or grad() has finished (not for one run inside another's
// backward, as in a custom backward, nor for the sub-tape backward of a loop's turn).
// `may_warn` is false for gradcheck's passes. The checkpoint layer uses it to warn when a
// recomputing policy met no region.
using BackwardListener = void (*)(bool may_warn);
void set_backward_listener(BackwardListener listener);

// ---- op kinds
// The built-in op kinds, sorted ("add", "matmul", "tanh", ...): the names a selective policy may
// list and a RecordingObserver sees (custom ops are "custom:NAME").
const std::vector<std::string>& op_kinds();
bool is_op_kind(std::string_view name);

// ---- op counters (thread-local totals, reset by reset_op_counters; OpCounters: remat/counters.h)
OpCounters op_counters();
void reset_op_counters();

// ---- recording observer: how the checkpoint layer (remat/checkpoint.h) watches ops without
// autodiff knowing about policies. At most one is active per thread (the innermost region).

// One op, run again: the same op kind, forward, backward formula and FLOP count, applied to new
// inputs through the ordinary path (recorded when grad mode is on and an input requires grad).
// Checkpoint segments and dynamic: keep these to make a dropped value again (run_forward).
class OpReplay {
 public:
  virtual ~OpReplay() = default;
  virtual const std::string& op() const = 0;
  virtual TensorList run(const TensorList& inputs) const = 0;  // the visible outputs
  // The forward alone, untaped and unobserved: every output, visible then aux (what dynamic
  // rematerialization needs to bring an evicted value back).
  virtual TensorList run_forward(const TensorList& inputs) const = 0;
  virtual double flops() const = 0;  // the estimate counted for the call that made this replay
};

// What an observer is told about one op call, after its forward ran.
struct OpEvent {
  const std::string& op;
  const TensorList& inputs;
  TensorList& outputs;   // visible outputs, then aux outputs
  size_t visible = 0;
  double flops = 0;       // the op's FLOP estimate
  // Whether a recorded node of this op would keep input i / output i (visible or aux) for its backward.
  std::function<bool(size_t)> saves_input, saves_output;
  // Builds an OpReplay of this call (copies the op's definition; valid after the call returns).
  std::function<std::shared_ptr<OpReplay>()> make_replay;
};

class RecordingObserver {
 public:
  virtual ~RecordingObserver() = default;
  // Called before an op's forward runs.
  virtual void before_op(const std::string& op) { (void)op; }
  // Called after an op's forward ran.
  virtual void after_forward(OpEvent& event) = 0;
  // Called when the op's inputs require grad; returning true suppresses recording of a node.
  virtual bool suppress_recording(const TensorList& inputs) = 0;
};
// Told of every op's forward outside backward formulas, whatever the recording observer (the
// checkpoint layer's dynamic rematerialization keeps each op's lineage through it). One per thread.
class OpListener {
 public:
  virtual ~OpListener() = default;
  virtual void on_op(OpEvent& event) = 0;
};
OpListener* op_listener();
OpListener* set_op_listener(OpListener* listener);  // returns the previous one

RecordingObserver* recording_observer();
// Installs `observer` for this thread; returns the previous one (restore it afterwards).
RecordingObserver* set_recording_observer(RecordingObserver* observer);
// Depth of recomputation in progress on this thread (0 = a first forward run).
int recompute_depth();
void set_recompute_depth(int depth);

}  // namespace autodiff

// ---- custom ops
class SaveContext {
 public:
  // Keeps a value for the backward pass (inputs, outputs or anything else).
  void save(const Tensor& value) { values_.push_back(value); }
  const TensorList& values() const { return values_; }

 private:
  TensorList values_;
};
using SavedValues = TensorList;

struct CustomOp {
  std::string name;
  // Computes the outputs from the inputs; runs without recording (ops inside are not taped).
  std::function<TensorList(const TensorList& inputs, SaveContext& ctx)> forward;
  // Returns one gradient per input (an undefined Tensor for "no gradient"). Gradients for
  // unused outputs arrive as zeros.
  std::function<TensorList(const TensorList& grad_outputs, const SavedValues& saved)> backward;
  // Optional: the op's effect beyond its outputs (updating a counter, running statistics, a
  // cache). It runs after the forward on a first run only, never when any form of
  // recomputation runs the forward again. The forward itself must not have effects.
  std::function<void(const TensorList& inputs, const TensorList& outputs)> side_effect;
  TensorList operator()(const TensorList& inputs) const;
};

// The recomputation check (on by default, process-wide): what each form of recomputation compares
// with its first run, how, on which devices and at what cost is stated once, in
// docs/checkpointing.md ("What recomputation checks"). Off, a recomputation that differs from its
// first run gives a gradient that differs from save-all's, silently.
void set_recomputation_check(bool enabled);
bool recomputation_check();

}  // namespace remat
