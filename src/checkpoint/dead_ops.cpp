// Which ops a region's recomputation may skip. See dead_ops.h.
//
// Note [skipping dead ops]. A region's recomputation exists to give the backward pass the values
// its formulas read; an op whose outputs no formula reads, and no op that must run consumes, is
// dead in the recomputation: a transformer block's last projection (its backward reads the
// projection's input and weight, not its output) and the residual add after it (whose backward
// reads nothing). The first run traces every op in the region's extent, in order, with what a
// recorded node of it would save (OpEvent::saves_input / saves_output), which earlier op produced
// each input, and the op's definition as this run made it (OpEvent::make_replay). At close, one
// pass from the last op back marks an op as running when it must (it saves one of its outputs,
// draws random numbers, or is a custom op) or when one of its outputs is needed; a running op
// needs all its inputs, and any op, running or not, needs the inputs it saves. The others are
// skipped in each recomputation: recorded on the sub-tape with the *first run's* definition (so a
// scalar the model captured and changed since is the first run's, as under save-all) and with
// their saved inputs, but their outputs are deferred tensors (Storage's deferred constructor)
// that compute the value from that definition only if something reads it after all: model code
// that reads it (a branch on a value, a printout), a value the analysis could not follow (made
// outside any op), or a saved value (SavedTensor computes it when it is saved). Random ops are
// never skipped. So every number is the one save-all computes, bit for bit, or an error: an
// input written in place between the skip and a read raises.
//
// The recomputation check (digest.cpp) compares a region's outputs with the first run's; a
// skipped op's outputs are not computed, so it checks the frontier instead, the inputs of
// skipped ops that ops which run produce: the recomputed values the skipped part would have
// carried to the outputs. Their first-run digests cost a pass over each value, so the first run
// takes only those the label's previous region needed (where its ops were the same), or, for a
// label seen first or whose ops changed, every input made inside the region of an op that may be
// skipped. A region whose frontier was not all digested skips nothing that time (and its outputs
// are checked as before). The ops are numbered by the observer's replay() calls, which the ops
// of regions nested in a re-run reach too, so a first run and its recomputation number the same
// ops alike; an op whose run the trace did not see whole (no event) turns skipping off for the
// region, and so does a DynamicScope (its lineage of values must be real values). The region's
// record counts the recomputed and the skipped FLOPs (`remat train --explain`, RegionRecord).
#include "dead_ops.h"

#include "autodiff/digest.h"
#include "remat/backend.h"
#include "remat/ops.h"
#include "tensor/allocate.h"

namespace remat::detail {

namespace {

// A skipped op's call: what computing its outputs needs, kept by the outputs standing for them.
struct DeferredCall {
  std::shared_ptr<const autodiff::OpReplay> replay;
  TensorList inputs;
  std::vector<uint64_t> versions;  // of the inputs' storages at the call
  std::vector<autodiff::OutputMeta> metas;
  TensorList results;
  bool released = false;  // the recomputation ended: nothing may read the value any more

  std::shared_ptr<Storage> value(size_t k, size_t& offset) {
    if (results.empty()) compute();
    const Tensor& r = results[k];
    offset = static_cast<size_t>(r.offset()) * dtype_size(r.dtype());
    return r.storage();
  }

  void compute() {
    REMAT_ASSERT(!released, "a value a recomputation skipped was read after the recomputation ended");
    const std::string& op = replay->op();
    for (size_t i = 0; i < inputs.size(); ++i)
      REMAT_CHECK(inputs[i].storage()->version() == versions[i], "checkpoint: a value of op ", op,
                  " that a recomputation skipped (no backward formula reads it) was read after input ", i,
                  " of that op was written in place, so it cannot be the value of the first run; read it before "
                  "the write, or write a copy");
    TensorList out = replay->run_forward(inputs);
    REMAT_CHECK(out.size() >= metas.size(), "checkpoint: op ", op, " returned ", out.size(),
                " outputs when a skipped value was computed, ", metas.size(),
                " on the first run; a region's function must be deterministic");
    for (size_t k = 0; k < metas.size(); ++k) {
      Tensor& r = out[k];
      REMAT_CHECK(r.defined() && r.shape() == metas[k].shape && r.dtype() == metas[k].dtype &&
                      r.device() == metas[k].device,
                  "checkpoint: output ", k, " of op ", op, " differs in shape, dtype or device from the first run's; ",
                  "a region's function must be deterministic");
      if (!r.is_contiguous()) {
        Tensor c = allocate_tensor(op.c_str(), r.shape(), r.dtype(), memory::Tag::other, r.device());
        copy_between_devices(r, c);
        r = c;
      }
    }
    results = std::move(out);
    inputs.clear();
    replay.reset();
  }
};

bool always_runs(const std::string& op) { return op == "dropout" || op.rfind("custom:", 0) == 0; }

// Per label, the ops of the last region of that label and the (op, input) pairs whose first-run
// digests it needed: the next first run takes them (bounded like the region records).
struct Frontier {
  std::vector<std::string> ops;
  std::vector<std::pair<uint32_t, uint32_t>> inputs;
};
constexpr size_t kMaxLabels = 4096;
std::unordered_map<std::string, Frontier>& frontiers() {
  thread_local std::unordered_map<std::string, Frontier> known;
  return known;
}

}  // namespace

void OpTrace::expect(const std::string& label) {
  label_ = label;
  auto it = frontiers().find(label);
  unpredicted_ = it == frontiers().end();
  if (unpredicted_) return;
  expected_ops_ = it->second.ops;
  expected_ = it->second.inputs;
}

void OpTrace::on_sequence(const std::string& op) {
  Op entry;
  entry.name = op;
  ops_.push_back(std::move(entry));
}

void OpTrace::on_event(const autodiff::OpEvent& event, const std::shared_ptr<autodiff::OpReplay>& replay) {
  if (ops_.empty() || ops_.back().known || ops_.back().name != event.op) return;  // not the op sequenced last
  const int ordinal = static_cast<int>(ops_.size() - 1);
  Op& op = ops_.back();
  op.known = true;
  op.forced = always_runs(event.op) || event.replayed;
  for (size_t k = 0; k < event.outputs.size(); ++k)
    op.forced = op.forced || event.saves_output(k) || !event.outputs[k].defined();
  op.first = replay;
  unpredicted_ = unpredicted_ || static_cast<size_t>(ordinal) >= expected_ops_.size() ||
                 expected_ops_[static_cast<size_t>(ordinal)] != event.op;
  for (size_t i = 0; i < event.inputs.size(); ++i) {
    Producer p;
    const Tensor& in = event.inputs[i];
    if (in.defined()) {
      auto it = producers_.find(in.impl_ptr().get());
      if (it != producers_.end() && it->second.impl.lock() == in.impl_ptr()) p = it->second.producer;
    }
    op.inputs.push_back(p);
    op.input_saved.push_back(event.saves_input(i));
    // the first-run digest of an input the recomputation may read and then skip the op
    bool wanted = false;
    if (unpredicted_)
      wanted = !op.forced && p.op >= 0;
    else
      for (const auto& [o, j] : expected_) wanted = wanted || (o == static_cast<uint32_t>(ordinal) && j == i);
    if (wanted && recomputation_check()) op.checked.emplace_back(static_cast<uint32_t>(i), take_digest(in));
  }
  for (size_t k = 0; k < event.outputs.size(); ++k) {
    const Tensor& out = event.outputs[k];
    if (!out.defined()) continue;
    op.outputs.push_back({out.shape(), out.dtype(), out.device()});
    producers_[out.impl_ptr().get()] = Seen{Producer{ordinal, static_cast<uint32_t>(k)}, out.impl_ptr()};
  }
}

void OpTrace::alias(const Tensor& from, const Tensor& to) {
  if (!from.defined() || !to.defined() || from.impl_ptr() == to.impl_ptr()) return;
  auto it = producers_.find(from.impl_ptr().get());
  if (it == producers_.end() || it->second.impl.lock() != from.impl_ptr()) return;
  producers_[to.impl_ptr().get()] = Seen{it->second.producer, to.impl_ptr()};
}

void OpTrace::finish() {
  producers_.clear();
  expected_.clear();
  skipped_ = 0;
  bool all_known = true;
  for (const Op& op : ops_) all_known = all_known && op.known;
  // from the last op back: what runs, and what it and every op's saved inputs need
  std::vector<std::vector<bool>> needed(ops_.size());
  for (size_t o = 0; o < ops_.size(); ++o) needed[o].assign(ops_[o].outputs.size(), false);
  for (size_t o = ops_.size(); o-- > 0;) {
    Op& op = ops_[o];
    bool run = !all_known || op.forced;
    for (bool n : needed[o]) run = run || n;
    op.skip = !run;
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      const Producer& p = op.inputs[i];
      if (p.op >= 0 && (run || op.input_saved[i])) needed[static_cast<size_t>(p.op)][p.output] = true;
    }
  }
  // the frontier: inputs of skipped ops made by ops that run, checked against their first-run
  // digests when the recomputation skips (taken only where the label's last region said so)
  std::vector<std::pair<uint32_t, uint32_t>> frontier;
  bool covered = true;
  for (size_t o = 0; o < ops_.size(); ++o) {
    if (!ops_[o].skip) continue;
    for (size_t i = 0; i < ops_[o].inputs.size(); ++i) {
      const Producer& p = ops_[o].inputs[i];
      if (p.op < 0 || ops_[static_cast<size_t>(p.op)].skip) continue;
      frontier.emplace_back(static_cast<uint32_t>(o), static_cast<uint32_t>(i));
      bool taken = false;
      for (const auto& c : ops_[o].checked) taken = taken || c.first == i;
      covered = covered && (taken || !recomputation_check());
    }
  }
  auto& known = frontiers();
  if (known.size() < kMaxLabels || known.count(label_)) {
    Frontier& f = known[label_];
    f.ops.clear();
    for (const Op& op : ops_) f.ops.push_back(op.name);
    f.inputs = std::move(frontier);
  }
  expected_ops_.clear();
  for (Op& op : ops_) {
    op.skip = op.skip && covered;
    skipped_ += op.skip ? 1 : 0;
    if (op.skip) {
      std::erase_if(op.checked, [&](const auto& c) {
        const Producer& p = c.first < op.inputs.size() ? op.inputs[c.first] : Producer{};
        return p.op < 0 || ops_[static_cast<size_t>(p.op)].skip;
      });
      op.inputs.clear();
      op.input_saved.clear();
      continue;
    }
    op.first.reset();
    op.inputs.clear();
    op.input_saved.clear();
    op.outputs.clear();
    op.checked.clear();
  }
}

void OpTrace::end_recomputation() const {
  for (const auto& weak : deferred_)
    if (std::shared_ptr<DeferredCall> call = std::static_pointer_cast<DeferredCall>(weak.lock())) {
      call->inputs.clear();
      call->replay.reset();
      call->released = true;
    }
  deferred_.clear();
}

bool OpTrace::skips(size_t ordinal, const std::string& op) const {
  return ordinal < ops_.size() && ops_[ordinal].skip && ops_[ordinal].name == op;
}

TensorList OpTrace::defer(size_t ordinal, const TensorList& inputs, std::shared_ptr<const autodiff::OpReplay>& record_as,
                          const std::string& region) const {
  const Op& op = ops_.at(ordinal);
  for (const auto& [i, digest] : op.checked) {
    if (!digest || i >= inputs.size()) continue;
    check_digest(digest, inputs[i], [what = concat("checkpoint region '", region, "', input ", i, " of op ", op.name,
                                                   " (its recomputation reads the value, then skips the op)")] {
      return recompute_mismatch(what);
    });
  }
  auto call = std::make_shared<DeferredCall>();
  deferred_.push_back(call);
  call->replay = op.first;
  call->inputs = inputs;
  for (const auto& in : inputs) call->versions.push_back(in.storage()->version());
  call->metas = op.outputs;
  TensorList outputs;
  for (size_t k = 0; k < op.outputs.size(); ++k) {
    const autodiff::OutputMeta& m = op.outputs[k];
    outputs.push_back(deferred_tensor(m.shape, m.dtype, m.device,
                                      [call, k](size_t& offset) { return call->value(k, offset); }));
  }
  record_as = op.first;
  return outputs;
}

}  // namespace remat::detail
