#include "autodiff/op.h"

#include <algorithm>
#include <iterator>
#include <string_view>

#include "autodiff/history.h"
#include "autodiff/kernels.h"
#include "autodiff/state.h"

namespace remat {

bool grad_enabled() { return autodiff::thread_state().grad_enabled; }
NoGradGuard::NoGradGuard() : previous_(autodiff::thread_state().grad_enabled) {
  autodiff::thread_state().grad_enabled = false;
}
NoGradGuard::~NoGradGuard() { autodiff::thread_state().grad_enabled = previous_; }
EnableGradGuard::EnableGradGuard(bool enabled) : previous_(autodiff::thread_state().grad_enabled) {
  autodiff::thread_state().grad_enabled = enabled;
}
EnableGradGuard::~EnableGradGuard() { autodiff::thread_state().grad_enabled = previous_; }

}  // namespace remat

namespace remat::autodiff {

OpCounters op_counters() { return thread_state().counters; }
void reset_op_counters() { thread_state().counters = {}; }
RecordingObserver* recording_observer() { return thread_state().observer; }
OpListener* op_listener() { return thread_state().listener; }
OpListener* set_op_listener(OpListener* listener) {
  OpListener* previous = thread_state().listener;
  thread_state().listener = listener;
  return previous;
}
RecordingObserver* set_recording_observer(RecordingObserver* observer) {
  RecordingObserver* previous = thread_state().observer;
  thread_state().observer = observer;
  return previous;
}
int recompute_depth() { return thread_state().recompute_depth; }
void set_recompute_depth(int depth) { thread_state().recompute_depth = depth; }
bool in_op_forward() { return thread_state().in_op_forward; }

namespace {
// Restores a thread-state field on scope exit (also when an exception passes).
template <class T>
class Restore {
 public:
  Restore(T& field, T value) : field_(field), previous_(field) { field_ = value; }
  ~Restore() { field_ = previous_; }

 private:
  T& field_;
  T previous_;
};
}  // namespace

// ---- the op kinds

namespace {
// The names of REMAT_OP_KINDS (remat/ops.h), in its order, which is sorted.
#define REMAT_OP_KIND_NAME(kind, ...) #kind,
constexpr std::string_view kOpKinds[] = {REMAT_OP_KINDS(REMAT_OP_KIND_NAME)};
#undef REMAT_OP_KIND_NAME
static_assert(std::is_sorted(std::begin(kOpKinds), std::end(kOpKinds)), "REMAT_OP_KINDS must be sorted by kind");
}  // namespace

const char* op_kind_name(OpKind kind) { return kOpKinds[static_cast<size_t>(kind)].data(); }

bool is_op_kind(std::string_view name) {
  return std::binary_search(std::begin(kOpKinds), std::end(kOpKinds), name);
}

const std::vector<std::string>& op_kinds() {
  static const std::vector<std::string> kinds(std::begin(kOpKinds), std::end(kOpKinds));
  return kinds;
}

OpSpec::OpSpec(OpKind kind, unsigned save_, int num_aux_, uint32_t saved_inputs_mask_, uint32_t saved_outputs_mask_)
    : name(op_kind_name(kind)),
      save(save_),
      num_aux(num_aux_),
      saved_inputs_mask(saved_inputs_mask_),
      saved_outputs_mask(saved_outputs_mask_) {}

// ---- BackwardContext

BackwardContext::BackwardContext(OpNode& node, TensorList&& grad_outputs)
    : node_(node), grad_outputs_(std::move(grad_outputs)), input_grads_(node.next_edges.size()) {}

Tensor BackwardContext::grad_output(size_t i) {
  REMAT_ASSERT(i < node_.num_visible_outputs, node_.name(), ": grad_output ", i);
  if (!grad_outputs_[i].defined()) {
    const OutputMeta& m = node_.outputs[i];
    grad_outputs_[i] = zeros(m.shape, m.dtype, memory::Tag::other, m.device);
  }
  return grad_outputs_[i];
}
bool BackwardContext::has_grad_output(size_t i) const { return grad_outputs_.at(i).defined(); }
// Reads a saved value; if it was freed or overwritten, the error names the op and the value.
static Tensor read_saved(const SavedTensor& saved, const Node& node, const char* kind, size_t i, const Shape* shape) {
  try {
    return saved.get();
  } catch (const Error& e) {
    throw Error(detail::concat(node.name(), ": saved ", kind, " ", i,
                               shape ? " of shape " + shape_str(*shape) : std::string(), ": ", e.what()));
  }
}

Tensor BackwardContext::input(size_t i) const {
  REMAT_ASSERT(i < node_.saved_inputs.size(), node_.name(), ": input ", i, " was not declared as saved");
  Tensor value = read_saved(node_.saved_inputs[i], node_, "input", i, &node_.input_meta.at(i).shape);
  REMAT_ASSERT(value.defined(), node_.name(), ": input ", i, " was not declared as saved");
  return value;
}
Tensor BackwardContext::output(size_t i) const {
  REMAT_ASSERT(i < node_.saved_outputs.size(), node_.name(), ": output ", i, " does not exist");
  Tensor value = read_saved(node_.saved_outputs[i], node_, "output", i,
                            i < node_.outputs.size() ? &node_.outputs[i].shape : nullptr);
  REMAT_ASSERT(value.defined(), node_.name(), ": output ", i, " was not declared as saved");
  return value;
}
size_t BackwardContext::num_outputs() const { return node_.num_visible_outputs; }
size_t BackwardContext::num_saved_outputs() const { return node_.saved_outputs.size(); }
size_t BackwardContext::num_inputs() const { return node_.input_meta.size(); }
const OutputMeta& BackwardContext::input_meta(size_t i) const { return node_.input_meta.at(i); }
bool BackwardContext::needs_input_grad(size_t i) const { return node_.input_requires_grad.at(i); }

void BackwardContext::set_input_grad(size_t i, const Tensor& grad) {
  REMAT_ASSERT(i < input_grads_.size());
  if (!grad.defined() || !needs_input_grad(i)) return;
  const OutputMeta& m = node_.input_meta[i];
  Tensor g = grad.shape() == m.shape ? grad : sum_to(grad, m.shape);
  REMAT_ASSERT(g.dtype() == m.dtype, node_.name(), ": gradient dtype ", dtype_name(g.dtype()), " for input ", i,
               " of dtype ", dtype_name(m.dtype));
  REMAT_ASSERT(g.device() == m.device, node_.name(), ": gradient on ", device_name(g.device()), " for input ", i,
               " on ", device_name(m.device));
  input_grads_[i] = g;
}

// ---- OpNode

TensorList OpNode::apply(TensorList&& grad_outputs) {
  ThreadState& state = thread_state();
  Restore<bool> no_grad(state.grad_enabled, false);
  Restore<bool> formula(state.in_backward_formula, true);
  Restore<RecordingObserver*> no_observer(state.observer, nullptr);
  grad_outputs.resize(num_visible_outputs);
  BackwardContext ctx(*this, std::move(grad_outputs));
  try {
    backward_(ctx);
  } catch (const OutOfMemory& e) {
    throw OutOfMemory(detail::concat(spec_.name, " (backward): ", e.what()), e.bytes());
  }
  return ctx.take_input_grads();
}

void OpNode::release_saved() {
  for (auto& s : saved_inputs) s.release();
  for (auto& s : saved_outputs) s.release();
}

void OpNode::prefetch_saved() const {
  for (auto& s : saved_inputs) s.prefetch();
  for (auto& s : saved_outputs) s.prefetch();
}

size_t OpNode::saved_bytes() const {
  size_t total = 0;
  for (auto& s : saved_inputs) total += s.bytes();
  for (auto& s : saved_outputs) total += s.bytes();
  return total;
}

// ---- apply

namespace {

// An op call kept for replay (OpReplay): copies of its definition.
class StoredOp final : public OpReplay {
 public:
  StoredOp(const OpSpec& spec, ForwardFn forward, BackwardFn backward, double flops)
      : spec_(spec), forward_(std::move(forward)), backward_(std::move(backward)), flops_(flops) {}
  const std::string& op() const override { return spec_.name; }
  TensorList run(const TensorList& inputs) const override { return apply(spec_, inputs, forward_, backward_, flops_); }
  TensorList run_forward(const TensorList& inputs) const override {
    Restore<bool> nested(thread_state().in_op_forward, true);
    return forward_(inputs);
  }
  double flops() const override { return flops_; }

 private:
  OpSpec spec_;
  ForwardFn forward_;
  BackwardFn backward_;
  double flops_;
};

void check_inputs(const OpSpec& spec, const TensorList& inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    REMAT_CHECK(inputs[i].defined(), spec.name, ": input ", i, " is undefined");
    REMAT_CHECK(inputs[i].device() == inputs[0].device(), spec.name, ": input ", i, " is on ",
                device_name(inputs[i].device()), ", input 0 on ", device_name(inputs[0].device()),
                "; move one with .to(device) first");
  }
}

// The op's outputs, auxiliary ones included.
TensorList forward_outputs(const OpSpec& spec, const TensorList& inputs, const ForwardFn& forward, ThreadState& state) {
  if (state.observer && !state.in_backward_formula) state.observer->before_op(spec.name);
  TensorList outputs;
  {
    Restore<bool> nested(state.in_op_forward, true);
    try {
      outputs = forward(inputs);
    } catch (const OutOfMemory& e) {  // the kernels' allocations do not know the op's name
      throw OutOfMemory(detail::concat(spec.name, ": ", e.what()), e.bytes());
    }
  }
  REMAT_ASSERT(outputs.size() > static_cast<size_t>(spec.num_aux), spec.name, ": forward returned ",
               outputs.size(), " results");
  return outputs;
}

// Whether output i of an op with `visible` visible outputs is kept for its backward.
bool saves_output(const OpSpec& spec, size_t i, size_t visible) {
  if (i >= visible) return true;
  return (spec.save & save_outputs) != 0 && i < 32 && ((spec.saved_outputs_mask >> i) & 1u) != 0;
}

// The op's flops: as given, or (negative) one per element of the visible outputs.
double op_flops(double flops, const TensorList& outputs, size_t visible) {
  double f = flops;
  if (f < 0) {
    f = 0;
    for (size_t i = 0; i < visible; ++i) f += static_cast<double>(outputs[i].numel());
  }
  return f;
}

void count_op(ThreadState& state, double f) {
  ++state.counters.forward_ops;
  state.counters.forward_flops += f;
  if (state.recompute_depth > 0) {
    ++state.counters.recomputed_ops;
    state.counters.recomputed_flops += f;
  }
}

// The OpEvent for the observer and the listener.
void notify(const OpSpec& spec, const TensorList& inputs, TensorList& outputs, size_t visible, double f,
            const ForwardFn& forward, const BackwardFn& backward, ThreadState& state) {
  OpEvent event{spec.name, inputs, outputs, visible, 0.0, {}, {}, {}};
  event.saves_input = [&spec](size_t i) {
    return (spec.save & save_inputs) != 0 && i < 32 && ((spec.saved_inputs_mask >> i) & 1u) != 0;
  };
  event.saves_output = [&spec, visible](size_t i) { return saves_output(spec, i, visible); };
  event.flops = f;
  event.make_replay = [&spec, &forward, &backward, f]() -> std::shared_ptr<OpReplay> {
    return std::make_shared<StoredOp>(spec, forward, backward, f);
  };
  if (state.observer) state.observer->after_forward(event);
  if (state.listener) state.listener->on_op(event);
}

// Whether the op goes on the tape: grad mode on, some input requiring grad, and no observer
// suppressing it.
bool should_record(const TensorList& inputs, ThreadState& state) {
  bool record = state.grad_enabled;
  if (record) {
    bool any = false;
    for (const auto& in : inputs) any = any || in.requires_grad();
    record = any;
  }
  if (record && state.observer && !state.in_backward_formula && state.observer->suppress_recording(inputs))
    record = false;
  return record;
}

// The op's node on the tape: its edges, what its backward reads, and the visible outputs attached
// to it (those that need it as new handles).
void record(const OpSpec& spec, const TensorList& inputs, TensorList& outputs, size_t visible, BackwardFn backward) {
  auto node = std::make_shared<OpNode>(spec, std::move(backward));
  node->num_visible_outputs = visible;
  for (const auto& in : inputs) {
    node->next_edges.push_back(gradient_edge(in));
    node->input_meta.push_back({in.shape(), in.dtype(), in.device()});
    node->input_requires_grad.push_back(in.requires_grad());
  }
  if (spec.save & save_inputs)
    for (size_t i = 0; i < inputs.size(); ++i)
      node->saved_inputs.emplace_back(i < 32 && ((spec.saved_inputs_mask >> i) & 1u) ? inputs[i] : Tensor());
  for (size_t i = 0; i < outputs.size(); ++i)
    node->saved_outputs.emplace_back(saves_output(spec, i, visible) ? outputs[i] : Tensor());
  outputs.resize(visible);
  for (size_t i = 0; i < visible; ++i) {
    Tensor& out = outputs[i];
    bool alias_needed = out.grad_fn() != nullptr || out.requires_grad();
    for (const auto& in : inputs) alias_needed = alias_needed || out.same(in);
    if (alias_needed) out = out.detach();
    if (!is_floating(out.dtype())) {
      node->outputs.push_back({out.shape(), out.dtype(), out.device()});
      continue;  // index outputs carry no gradient
    }
    attach_output(out, node);  // output i of the node
  }
}

}  // namespace

TensorList apply(const OpSpec& spec, const TensorList& inputs, const ForwardFn& forward, BackwardFn backward,
                 double flops) {
  ThreadState& state = thread_state();
  if (state.in_op_forward) {
    TensorList outputs = forward(inputs);
    outputs.resize(outputs.size() - static_cast<size_t>(spec.num_aux));
    return outputs;
  }
  check_inputs(spec, inputs);
  TensorList outputs = forward_outputs(spec, inputs, forward, state);
  const size_t visible = outputs.size() - static_cast<size_t>(spec.num_aux);
  if (!state.in_backward_formula) count_op(state, op_flops(flops, outputs, visible));
  if ((state.observer || state.listener) && !state.in_backward_formula)
    notify(spec, inputs, outputs, visible, op_flops(flops, outputs, visible), forward, backward, state);
  if (!should_record(inputs, state)) {
    outputs.resize(visible);
    return outputs;
  }
  record(spec, inputs, outputs, visible, std::move(backward));
  return outputs;
}

}  // namespace remat::autodiff
