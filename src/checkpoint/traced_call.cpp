// Layer calls replayed from their ops. See traced_call.h.
//
// Note [values that leave a layer call]. A region runs its layer calls without recording and, in
// the backward pass, calls them again with recording on. That is exact for what a call returns:
// its outputs are the region's, and their recomputed twins the roots of the sub-tape. But a layer
// can leave values elsewhere: an intermediate kept in a member (for an auxiliary loss, deep
// supervision, a regulariser on activations), pushed to a list, handed to a callback, or its input
// kept. Such a value had no gradient path (its op was not recorded), and calling the layer again
// in the backward pass assigned the member again, to the recomputed value, in reverse call order
// (a module called twice ended with its first call's value; a list got a second entry).
//
// So while a call step runs for the first time, a CallRecorder traces each op the call makes (its
// definition as the call made it, the grad mode it ran under (and, for a custom op, the RNG state
// it started with), and where each input came from: an input of the call, an earlier op of the call, an earlier step of the region,
// or a value made elsewhere, which it holds), and watches every tensor handle made meanwhile
// (detail::HandleWatcher: each new block and each detach()). When the call returns, a handle still
// alive that is not an output, and that neither the region (its selective cache) nor an enclosing
// recomputation (the inputs of an op it deferred) holds, is held by the program: the call left
// values behind. So did a call whose input handles gained holders, and one that read a value of an
// earlier step of its region other than through its inputs. Such a call is never called again: its
// step is replayed from the trace (CallTrace::replay: the same ops on the same sources, through the
// ordinary path, each under its first run's grad mode and RNG state), so what the program holds
// is the first run's tensors, untouched, as under save-all. Each value an op of the call made that
// outlives it and would require grad under save-all (grad mode on, an input requiring grad) becomes
// an output of the region node, as the call's outputs are: the program's tensor itself gets the
// region as its grad_fn, its replayed twin is a root of the sub-tape, and its first-run digest is
// checked like an output's. The engine adds the contributions that reach it from outside before
// those from inside the layer, as save-all's would (they come from later ops).
//
// A call that leaves nothing behind (the layers of the library's models) is called again as
// before; the trace it recorded is dropped when it returns. A traced call differs from a called one
// in three ways, all on the side of save-all: regions nested in it (an explicit checkpoint, a
// set_layer() module) and a budget plan's nesting inside it are not made again (its ops are
// recorded whole, as a stage's are); values its ops read that no op made (constants) are kept from
// the first run to the backward pass, counted in the region's kept bytes; and code between its ops
// does not run again, so a scalar it captured and changed since is the first run's.
#include "traced_call.h"

#include <algorithm>
#include <unordered_set>

#include "remat/memory.h"

namespace remat::detail {

// ---- CallTrace

Tensor CallTrace::input(const TracedSource& source, const TensorList& inputs, const std::vector<TensorList>& values,
                        const std::function<Tensor(uint32_t, uint32_t)>& region_value) const {
  switch (source.kind) {
    case TracedSource::Kind::undefined: return Tensor();
    case TracedSource::Kind::call_input: return inputs.at(source.index);
    case TracedSource::Kind::op_output: {
      const Tensor& t = values.at(source.index).at(source.output);
      REMAT_ASSERT(t.defined(), "a traced layer call read an op output it had released");
      return t;
    }
    case TracedSource::Kind::region_value: return region_value(source.index, source.output);
    case TracedSource::Kind::kept: {
      const Kept& k = kept_.at(source.index);
      return k.with_history.defined() ? k.with_history : k.value.get();
    }
  }
  return Tensor();
}

TensorList CallTrace::replay(const TensorList& inputs, const std::function<Tensor(uint32_t, uint32_t)>& region_value) const {
  // each op's outputs are let go after their last reader, as the call's own locals would be
  constexpr size_t kUnread = SIZE_MAX, kResult = SIZE_MAX - 1;
  std::vector<size_t> last_read(ops_.size(), kUnread);
  for (size_t j = 0; j < ops_.size(); ++j)
    for (const auto& s : ops_[j].inputs)
      if (s.kind == TracedSource::Kind::op_output && last_read[s.index] != kResult) last_read[s.index] = j;
  for (const auto& s : results_)
    if (s.kind == TracedSource::Kind::op_output) last_read[s.index] = kResult;
  std::vector<TensorList> values(ops_.size());
  for (size_t j = 0; j < ops_.size(); ++j) {
    const Op& op = ops_[j];
    TensorList args;
    args.reserve(op.inputs.size());
    for (const auto& s : op.inputs) args.push_back(input(s, inputs, values, region_value));
    if (op.rng) set_rng_state(*op.rng);
    {
      EnableGradGuard grad(op.grad_enabled);
      values[j] = op.op->run(args);
    }
    for (const auto& s : op.inputs)
      if (s.kind == TracedSource::Kind::op_output && last_read[s.index] == j) values[s.index].clear();
    if (last_read[j] == kUnread) values[j].clear();
  }
  TensorList results;
  results.reserve(results_.size());
  for (const auto& s : results_) results.push_back(input(s, inputs, values, region_value));
  return results;
}

std::vector<std::pair<uint32_t, uint32_t>> CallTrace::region_values() const {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  auto add = [&out](const TracedSource& s) {
    if (s.kind == TracedSource::Kind::region_value) out.emplace_back(s.index, s.output);
  };
  for (const auto& op : ops_)
    for (const auto& s : op.inputs) add(s);
  for (const auto& s : results_) add(s);
  return out;
}

size_t CallTrace::kept_bytes() const {
  size_t total = 0;
  for (const auto& k : kept_) total += k.value.bytes();
  return total;
}

// ---- CallRecorder

CallRecorder::CallRecorder(const TensorList& inputs, RegionLookup region_lookup)
    : previous_(handle_watcher()), region_lookup_(std::move(region_lookup)), inputs_(inputs) {
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const Tensor& t = inputs_[i];
    input_uses_.push_back(t.defined() ? t.impl_ptr().use_count() : 0);
    if (t.defined()) known_[t.impl_ptr().get()] = Known{{TracedSource::Kind::call_input, static_cast<uint32_t>(i), 0}, t.impl_ptr()};
  }
  set_handle_watcher(this);  // last: a constructor that throws leaves nothing installed
}

CallRecorder::~CallRecorder() {
  if (watching_) set_handle_watcher(previous_);
}

void CallRecorder::on_new_handle(const std::shared_ptr<TensorImpl>& impl) {
  made_.push_back(impl);
  if (previous_) previous_->on_new_handle(impl);
}

void CallRecorder::before_op(const std::string& op) {
  // (one still pending was an op that threw, and that the layer caught: it made nothing)
  const bool custom = op.rfind("custom:", 0) == 0;
  pending_.emplace(custom ? std::optional<RngState>(rng_state()) : std::nullopt, grad_enabled());
}

TracedSource CallRecorder::resolve(const Tensor& t) {
  if (!t.defined()) return {};
  auto it = known_.find(t.impl_ptr().get());
  if (it != known_.end() && it->second.impl.lock() == t.impl_ptr()) return it->second.source;
  TracedSource source;
  if (const auto value = region_lookup_(t)) {
    reads_region_values_ = true;
    source = {TracedSource::Kind::region_value, value->first, value->second};
  } else {
    source = {TracedSource::Kind::kept, static_cast<uint32_t>(kept_.size()), 0};
    kept_.push_back(t);
  }
  known_[t.impl_ptr().get()] = Known{source, t.impl_ptr()};
  return source;
}

bool CallRecorder::differentiable(const TracedSource& source, const Tensor& t) const {
  if (source.kind == TracedSource::Kind::op_output) return op_differentiable_.at(source.index);
  return t.requires_grad();
}

void CallRecorder::after_op(const autodiff::OpEvent& event, const std::shared_ptr<autodiff::OpReplay>& replay) {
  if (!pending_) {
    complete_ = false;
    return;
  }
  CallTrace::Op op;
  op.op = replay;
  op.rng = pending_->first;
  op.grad_enabled = pending_->second;
  pending_.reset();
  bool reads_differentiable = false;
  for (const auto& in : event.inputs) {
    const TracedSource source = resolve(in);
    op.inputs.push_back(source);
    reads_differentiable = reads_differentiable || (in.defined() && differentiable(source, in));
  }
  const uint32_t index = static_cast<uint32_t>(ops_.size());
  std::vector<std::weak_ptr<TensorImpl>> outputs;
  for (size_t k = 0; k < event.visible; ++k) {
    const Tensor& out = event.outputs[k];
    outputs.push_back(out.defined() ? std::weak_ptr<TensorImpl>(out.impl_ptr()) : std::weak_ptr<TensorImpl>());
    if (out.defined())
      known_[out.impl_ptr().get()] = Known{{TracedSource::Kind::op_output, index, static_cast<uint32_t>(k)}, out.impl_ptr()};
  }
  op_differentiable_.push_back(op.grad_enabled && reads_differentiable);
  op_outputs_.push_back(std::move(outputs));
  ops_.push_back(std::move(op));
}

void CallRecorder::on_deferred(const TensorList& inputs, const TensorList& outputs) {
  std::vector<std::weak_ptr<Storage>> storages;
  for (const auto& o : outputs)
    if (o.defined()) storages.push_back(o.storage());
  deferred_.emplace_back(inputs, std::move(storages));
}

CallRecorder::Outcome CallRecorder::finish(const TensorList& outputs, const std::vector<const TensorImpl*>& held) {
  set_handle_watcher(previous_);
  watching_ = false;
  Outcome outcome;
  REMAT_ASSERT(complete_, "a layer call's op was seen after it ran but not before");
  // holds known to be the region's: the outputs it was handed, its selective cache, its kept
  // inputs, and an enclosing recomputation's deferred ops whose results are still pending
  std::unordered_map<const TensorImpl*, long> internal;
  auto count = [&internal](const Tensor& t) {
    if (t.defined()) ++internal[t.impl_ptr().get()];
  };
  for (const auto& t : outputs) count(t);
  for (const TensorImpl* impl : held) ++internal[impl];
  for (const auto& t : kept_) count(t);
  for (const auto& [inputs, storages] : deferred_) {
    bool pending = false;
    for (const auto& w : storages)
      if (auto s = w.lock()) pending = pending || s->pending();
    for (const auto& t : inputs) {
      count(t);  // our own copy in deferred_
      if (pending) count(t);  // the deferred op's
    }
  }
  auto outside = [&internal](const std::shared_ptr<TensorImpl>& impl, long baseline) {
    auto it = internal.find(impl.get());
    return impl.use_count() - 1 - (it == internal.end() ? 0 : it->second) > baseline;
  };
  std::unordered_set<const TensorImpl*> returned, seen;
  for (const auto& t : outputs)
    if (t.defined()) returned.insert(t.impl_ptr().get());
  bool left_behind = reads_region_values_;
  std::vector<TracedSource> escaped;
  for (size_t j = 0; j < op_outputs_.size(); ++j)
    for (size_t k = 0; k < op_outputs_[j].size(); ++k) {
      std::shared_ptr<TensorImpl> impl = op_outputs_[j][k].lock();
      if (!impl || !seen.insert(impl.get()).second || !outside(impl, 0)) continue;
      left_behind = true;
      if (returned.count(impl.get()) || !op_differentiable_[j] || !is_floating(impl->dtype) || impl->grad_fn ||
          impl->requires_grad)
        continue;
      escaped.push_back({TracedSource::Kind::op_output, static_cast<uint32_t>(j), static_cast<uint32_t>(k)});
      outcome.escaped.push_back(Tensor(impl));
    }
  for (const auto& weak : made_) {
    std::shared_ptr<TensorImpl> impl = weak.lock();
    if (impl && seen.insert(impl.get()).second && outside(impl, 0)) left_behind = true;
  }
  for (size_t i = 0; i < inputs_.size(); ++i)
    if (inputs_[i].defined() && outside(inputs_[i].impl_ptr(), input_uses_[i] - 1)) left_behind = true;
  made_.clear();
  deferred_.clear();
  if (!left_behind) return outcome;

  auto trace = std::make_unique<CallTrace>();
  for (const auto& t : outputs) trace->results_.push_back(resolve(t));
  trace->results_.insert(trace->results_.end(), escaped.begin(), escaped.end());
  trace->ops_ = std::move(ops_);
  for (const auto& t : kept_) {
    CallTrace::Kept k;
    if (t.requires_grad() || t.storage()->tag() == memory::Tag::parameter)
      k.with_history = t;
    else
      k.value = autodiff::SavedTensor(t);
    trace->kept_.push_back(std::move(k));
  }
  kept_.clear();
  known_.clear();
  outcome.trace = std::move(trace);
  return outcome;
}

}  // namespace remat::detail
