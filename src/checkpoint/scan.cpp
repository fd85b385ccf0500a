// Differentiable loops with Revolve and online checkpointing (see include/remat/scan.h).
//
// Note [one node for the loop]. scan() records a single ScanNode. Its forward pass runs the steps
// without recording, keeping snapshots (with the RNG state at that step) in the slots the
// schedule names, and records only the last step, whose sub-tape is the schedule's first turn.
// Its backward pass carries out the rest of the schedule: restore a snapshot, advance without
// recording, take snapshots, and for each turn re-run step i with recording on a fresh leaf x_i,
// back-propagate the current adjoint through that sub-tape only (as a checkpoint region does) and
// free it. Gradients leaving a turn for captured tensors are summed in arrival order, which is
// the order in which the unrolled loop's backward adds them.
//
// Note [a loop checks what it recomputes]. The forward sweep takes the digest (digest.h) of the
// state each step returns, one read of it, 8 bytes per step; whatever the backward pass runs again
// (an advance from a snapshot, a turn) is compared with it, step by step, under every schedule
// that recomputes (revolve, online; store_all runs each step once). A step that reads state
// changed since the forward sweep (a captured scalar, a counter, a private generator) returns a
// different state: a remat::Error naming the loop and the step, as a region's recomputation does.
// The backward of a loop that recomputed counts as recomputation for the no-region warning
// (checkpoint.cpp), which would otherwise say that nothing was recomputed.
#include "remat/scan.h"

#include <algorithm>
#include <unordered_map>

#include "autodiff/history.h"
#include "remat/autodiff.h"
#include "remat/memory.h"
#include "remat/ops.h"
#include "remat/random.h"
#include "remat/schedule.h"
#include "autodiff/digest.h"
#include "autodiff/replay.h"
#include "region.h"
#include "versions.h"

namespace remat {

namespace {

namespace rs = remat::schedule;

thread_local std::shared_ptr<ScanStats> last_stats = std::make_shared<ScanStats>();

class ScanNode;

// Installed while steps run without recording: finds captured tensors requiring grad.
class CaptureFinder final : public autodiff::RecordingObserver {
 public:
  explicit CaptureFinder(ScanNode& node) : node_(node) {}
  void after_forward(autodiff::OpEvent& event) override;
  bool suppress_recording(const TensorList& inputs) override;

 private:
  ScanNode& node_;
};

using autodiff::ObserverScope;

class ScanNode final : public autodiff::Node {
 public:
  ScanNode(ScanStep step, int slots, std::shared_ptr<ScanStats> stats)
      : step_(std::move(step)), snapshots_(static_cast<size_t>(slots)), snapshot_rng_(static_cast<size_t>(slots)),
        snapshot_step_(static_cast<size_t>(slots), -1), stats_(std::move(stats)) {
    next_edges.emplace_back();  // edge 0: the initial state (set when the loop is recorded)
  }

  std::string name() const override { return "Scan"; }
  TensorList apply(TensorList&&) override {
    REMAT_ASSERT(false, "ScanNode::apply is not used");
    return {};
  }
  bool returns_contributions() const override { return true; }
  void release_saved() override {
    released_ = true;
    for (auto& s : snapshots_) s.release();
    turn_output_ = Tensor();
    turn_leaf_ = Tensor();
  }
  size_t saved_bytes() const override {
    size_t total = 0;
    for (auto& s : snapshots_) total += s.bytes();
    return total;
  }

  // Note [what a recomputation version-checks] (region.h): what the untaped steps read, checked before
  // they are run again.
  detail::ReadVersions read_versions;

  void add_external(const autodiff::Edge& e) { captured_.add(*this, e); }

  // ---- forward helpers
  Tensor run_untaped(const Tensor& state, int64_t t) {
    ++stats_->forward_steps;
    Tensor next = step_(state, t);
    check_state(next, t);
    check_against_first_sweep(next, t);
    return next.detach();
  }

  // Note [a loop checks what it recomputes]: on the forward sweep, the digest of step t's state;
  // afterwards, the same step run again is compared with it.
  void check_against_first_sweep(const Tensor& next, int64_t t) {
    if (!swept_) {
      if (!digests_valid_ || static_cast<size_t>(t) != first_sweep_.size()) return;
      std::optional<detail::ValueDigest> d = detail::take_digest(next);
      if (!d) {
        digests_valid_ = false;
        first_sweep_ = {};
        return;
      }
      first_sweep_.push_back(std::move(*d));
      return;
    }
    if (!digests_valid_ || t < 0 || static_cast<size_t>(t) >= first_sweep_.size()) return;
    detail::check_digest(first_sweep_[static_cast<size_t>(t)], next, [loop = while_loop_ ? "while_loop" : "scan", t] {
      return detail::recompute_mismatch(detail::concat(loop, ", step ", t, " (the state it returns)"));
    });
  }
  void end_sweep() { swept_ = true; }

  void take_snapshot(int slot, const Tensor& state, int64_t step) {
    snapshots_.at(static_cast<size_t>(slot)) = autodiff::SavedTensor(state);
    snapshot_rng_[static_cast<size_t>(slot)] = rng_state();
    snapshot_step_[static_cast<size_t>(slot)] = step;
    size_t held = saved_bytes();
    stats_->snapshot_peak_bytes = std::max(stats_->snapshot_peak_bytes, held);
  }

  // Runs step t with recording from a fresh leaf; keeps the sub-tape as the pending turn.
  void record_turn(const Tensor& state, int64_t t) {
    ++stats_->recorded_steps;
    turn_marker_ = autodiff::next_sequence_nr();
    turn_leaf_ = state.detach().requires_grad_(true);
    EnableGradGuard grad(true);
    ObserverScope no_observer(nullptr);
    turn_output_ = step_(turn_leaf_, t);
    check_state(turn_output_, t);
    if (swept_) check_against_first_sweep(turn_output_, t);
    turn_step_ = t;
  }

  // Edges from the pending turn's sub-tape to anything created before it (captured tensors).
  void collect_turn_externals() {
    autodiff::Edge root = autodiff::gradient_edge(turn_output_);
    if (!root.valid()) return;
    const autodiff::Node* leaf_accumulator = autodiff::gradient_edge(turn_leaf_).node.get();
    std::vector<autodiff::Node*> stack;
    std::unordered_map<autodiff::Node*, bool> seen;
    auto visit_edge = [&](const autodiff::Edge& e) {
      if (!e.valid()) return;
      if (e.node.get() == leaf_accumulator) return;
      if (e.node->is_accumulator() || e.node->sequence_nr() < turn_marker_) {
        add_external(e);
        return;
      }
      if (!seen[e.node.get()]) {
        seen[e.node.get()] = true;
        stack.push_back(e.node.get());
      }
    };
    visit_edge(root);
    while (!stack.empty()) {
      autodiff::Node* n = stack.back();
      stack.pop_back();
      for (const auto& e : n->next_edges) visit_edge(e);
    }
  }

  const Tensor& turn_output() const { return turn_output_; }

  void set_schedule(std::vector<rs::RevolveAction> actions, int64_t current_step, Tensor current) {
    actions_ = std::move(actions);
    current_step_ = current_step;
    current_ = std::move(current);
  }

  std::vector<TensorList> apply_contributions(TensorList&& grad_outputs) override;

  size_t state_bytes = 0;
  bool while_loop_ = false;
  Shape state_shape;
  DType state_dtype = DType::f32;
  Device state_device;

 private:
  void check_state(const Tensor& next, int64_t t) const {
    REMAT_CHECK(next.defined() && next.shape() == state_shape && next.dtype() == state_dtype, "scan: step ", t,
                " returned a state of shape ", next.defined() ? shape_str(next.shape()) : "undefined", " and dtype ",
                next.defined() ? dtype_name(next.dtype()) : "-", "; the state is ", shape_str(state_shape), " ",
                dtype_name(state_dtype));
  }

  // Back-propagates `adjoint` through the pending turn; returns the adjoint of its input state.
  Tensor backprop_turn(const Tensor& adjoint, std::vector<Tensor>& external_sums) {
    Tensor result;
    autodiff::Edge root = autodiff::gradient_edge(turn_output_);
    if (root.valid()) {
      autodiff::EngineResult r = autodiff::backward_subtape({root}, {adjoint}, turn_marker_);
      // slot 0 is the input state (the turn's fresh leaf), the others captured tensors
      const std::unordered_map<const autodiff::Node*, size_t> leaf_slots{
          {autodiff::gradient_edge(turn_leaf_).node.get(), 0}};
      autodiff::route_captured(
          r, leaf_slots, captured_,
          [&](size_t slot, size_t c) {
            if (slot == 0) {
              result = r.summed(c);
              return;
            }
            Tensor& sum = external_sums[slot - 1];
            for (const auto& g : r.captured_grads[c]) sum = sum.defined() ? add(sum, g) : g;
          },
          [&](const autodiff::Edge& e) {
            throw Error(detail::concat("scan: step ", turn_step_, " used a tensor requiring grad (through ",
                                       e.node->name(), ") that its first run did not; the step function must be ",
                                       "deterministic"));
          });
    } else if (turn_output_.same(turn_leaf_)) {
      result = adjoint;  // the step returned its input unchanged
    }
    turn_output_ = Tensor();
    turn_leaf_ = Tensor();
    if (!result.defined()) result = zeros(state_shape, state_dtype, memory::Tag::other, state_device);
    return result;
  }

  ScanStep step_;
  std::vector<autodiff::SavedTensor> snapshots_;
  std::vector<RngState> snapshot_rng_;
  std::vector<int64_t> snapshot_step_;
  std::shared_ptr<ScanStats> stats_;
  autodiff::CapturedEdges captured_;  // next edge 0 is the initial state; captured tensors follow
  std::vector<rs::RevolveAction> actions_;  // what is left of the schedule
  int64_t current_step_ = 0;
  Tensor current_;
  Tensor turn_leaf_, turn_output_;
  uint64_t turn_marker_ = 0;
  int64_t turn_step_ = -1;
  // Note [a loop checks what it recomputes]
  std::vector<detail::ValueDigest> first_sweep_;  // digest of the state step t returned on the forward sweep
  bool digests_valid_ = recomputation_check();
  bool swept_ = false;
  bool ran_ = false, released_ = false;  // the backward pass ran; its saved values were freed
};

void CaptureFinder::after_forward(autodiff::OpEvent& event) { node_.read_versions.track(event.inputs); }

bool CaptureFinder::suppress_recording(const TensorList& inputs) {
  for (const auto& in : inputs)
    if (in.requires_grad()) node_.add_external(autodiff::gradient_edge(in));
  return true;
}

std::vector<TensorList> ScanNode::apply_contributions(TensorList&& grad_outputs) {
  const char* loop = while_loop_ ? "while_loop" : "scan";
  // The schedule is consumed by the one backward pass: its snapshots are rewritten as it runs.
  REMAT_CHECK(!released_, loop, ": a value saved for the backward pass was already freed: the graph was run backward ",
              "once already (pass retain_graph=true to run it again)");
  REMAT_CHECK(!ran_, loop, ": its backward pass ran once already and, under the ",
              while_loop_ ? "online" : "revolve", " schedule, cannot run again (retain_graph): the snapshots were ",
              "rewritten by the first; use the store_all schedule to run the backward pass several times");
  ran_ = true;
  read_versions.check(loop);
  ++detail::region_counters().loops_run_in_backward;
  Tensor adjoint = grad_outputs.at(0).defined() ? grad_outputs[0]
                                                 : zeros(state_shape, state_dtype, memory::Tag::other, state_device);
  std::vector<Tensor> external_sums(next_edges.size() - 1);
  detail::ReplayScope replay;  // the steps re-run here leave the RNG state and recompute depth as they were

  if (turn_output_.defined()) adjoint = backprop_turn(adjoint, external_sums);
  for (const auto& action : actions_) {
    switch (action.kind) {
      case rs::RevolveAction::Kind::restore: {
        size_t slot = static_cast<size_t>(action.slot);
        current_ = snapshots_.at(slot).get();
        current_step_ = snapshot_step_[slot];
        set_rng_state(snapshot_rng_[slot]);
        break;
      }
      case rs::RevolveAction::Kind::takeshot:
        REMAT_ASSERT(current_step_ == action.step, "scan: takeshot of state ", action.step, " at state ", current_step_);
        take_snapshot(action.slot, current_, current_step_);
        break;
      case rs::RevolveAction::Kind::advance: {
        NoGradGuard no_grad;
        while (current_step_ < action.step) {
          current_ = run_untaped(current_, current_step_);
          ++current_step_;
        }
        break;
      }
      case rs::RevolveAction::Kind::firsturn:
      case rs::RevolveAction::Kind::youturn:
        REMAT_ASSERT(current_step_ == action.step, "scan: turn of step ", action.step, " at state ", current_step_);
        record_turn(current_, action.step);
        adjoint = backprop_turn(adjoint, external_sums);
        break;
    }
  }
  actions_.clear();
  current_ = Tensor();
  std::vector<TensorList> result(next_edges.size());
  result[0] = {adjoint};
  for (size_t j = 0; j < external_sums.size(); ++j)
    if (external_sums[j].defined()) result[j + 1] = {external_sums[j]};
  return result;
}

Tensor plain_loop(const ScanStep& step, const Tensor& state0, int64_t n, const ScanCondition* cond,
                  ScanStats& stats) {
  Tensor state = state0;
  for (int64_t t = 0; n < 0 || t < n; ++t) {
    if (cond && !(*cond)(state, t)) break;
    state = step(state, t);
    ++stats.recorded_steps;
    ++stats.steps;
  }
  return state;
}

Tensor finish(std::shared_ptr<ScanNode> node, const Tensor& state0, const Tensor& output) {
  node->read_versions.freeze();
  node->end_sweep();
  node->next_edges[0] = autodiff::gradient_edge(state0);
  bool any = false;
  for (const auto& e : node->next_edges) any = any || e.valid();
  Tensor out = output.detach();
  if (!any) return out;
  autodiff::attach_output(out, node);  // output 0
  return out;
}

constexpr int kMaxOnlineSnapshots = 1 << 20;

void check_arguments(const Tensor& state0, const ScanOptions& options, const char* op) {
  REMAT_CHECK(state0.defined(), op, ": the initial state is undefined");
  REMAT_CHECK(is_floating(state0.dtype()), op, ": the state must be f32 or f64, got ", dtype_name(state0.dtype()));
  REMAT_CHECK(options.snapshots >= 1, op, ": snapshots must be at least 1, got ", options.snapshots);
}

}  // namespace

ScanStats last_scan_stats() { return *last_stats; }

Tensor scan(const ScanStep& step, const Tensor& state0, int64_t n_steps, const ScanOptions& options) {
  REMAT_CHECK(static_cast<bool>(step), "scan: the step function is empty");
  check_arguments(state0, options, "scan");
  REMAT_CHECK(n_steps >= 0, "scan: the number of steps must be non-negative, got ", n_steps);
  REMAT_CHECK(options.schedule != ScanSchedule::online,
              "scan: the online schedule is for loops of unknown length (use while_loop); use revolve when n is known");
  const bool revolve = options.schedule == ScanSchedule::revolve && grad_enabled() && n_steps > 0;
  REMAT_CHECK(!revolve || n_steps <= schedule::kMaxScheduleSteps, "scan: ", n_steps, " steps with the revolve schedule ",
              "is more than its limit of ", schedule::kMaxScheduleSteps, " (2^24) steps; split the loop into ",
              "nested scans or use store_all");
  int64_t optimal_forward_steps = 0;
  try {
    optimal_forward_steps = n_steps > 0 ? schedule::revolve_optimal_forward_steps(n_steps, options.snapshots) : 0;
  } catch (const Error& e) {  // e.g. r > INT_MAX: n = 2^40 steps with one snapshot
    if (revolve) throw Error(detail::concat("scan: ", n_steps, " steps with ", options.snapshots, " snapshots: ", e.what()));
    optimal_forward_steps = -1;  // a statistic only, when no schedule is needed
  }
  last_stats = std::make_shared<ScanStats>();
  ScanStats& stats = *last_stats;
  stats.state_bytes = state0.nbytes();
  stats.optimal_forward_steps = optimal_forward_steps;
  if (!revolve) return plain_loop(step, state0, n_steps, nullptr, stats);

  stats.steps = n_steps;
  // more slots than steps are never used (the schedule stores all with n - 1)
  const int slots = static_cast<int>(std::min<int64_t>(options.snapshots, n_steps));
  auto node = std::make_shared<ScanNode>(step, slots, last_stats);
  node->state_bytes = state0.nbytes();
  node->state_shape = state0.shape();
  node->state_dtype = state0.dtype();
  node->state_device = state0.device();
  std::vector<schedule::RevolveAction> actions = schedule::revolve_schedule(n_steps, slots);
  Tensor current = state0.detach();
  int64_t current_step = 0;
  size_t a = 0;
  {
    CaptureFinder finder(*node);
    for (; a < actions.size(); ++a) {
      const auto& action = actions[a];
      if (action.kind == schedule::RevolveAction::Kind::firsturn) break;
      if (action.kind == schedule::RevolveAction::Kind::takeshot) {
        node->take_snapshot(action.slot, current, current_step);
      } else if (action.kind == schedule::RevolveAction::Kind::advance) {
        ObserverScope scope(&finder);
        while (current_step < action.step) {
          current = node->run_untaped(current, current_step);
          ++current_step;
        }
      } else {
        REMAT_ASSERT(false, "scan: unexpected ", schedule::to_string(action), " before the first turn");
      }
    }
  }
  REMAT_ASSERT(a < actions.size() && current_step == n_steps - 1, "scan: the schedule has no first turn at step ",
               n_steps - 1);
  node->record_turn(current, n_steps - 1);
  // the recorded last step is the first turn: its output is the loop's result
  Tensor output = node->turn_output();
  node->collect_turn_externals();
  node->set_schedule(std::vector<schedule::RevolveAction>(actions.begin() + static_cast<std::ptrdiff_t>(a) + 1, actions.end()),
                     n_steps - 1, Tensor());
  return finish(node, state0, output);
}

Tensor while_loop(const ScanCondition& cond, const ScanStep& step, const Tensor& state0, const ScanOptions& options) {
  REMAT_CHECK(static_cast<bool>(cond) && static_cast<bool>(step), "while_loop: the condition or step function is empty");
  check_arguments(state0, options, "while_loop");
  last_stats = std::make_shared<ScanStats>();
  ScanStats& stats = *last_stats;
  stats.state_bytes = state0.nbytes();
  if (options.schedule == ScanSchedule::store_all || !grad_enabled())
    return plain_loop(step, state0, -1, &cond, stats);
  REMAT_CHECK(options.schedule == ScanSchedule::online,
              "while_loop: the revolve schedule needs the number of steps in advance (use scan), or use online");
  REMAT_CHECK(options.snapshots <= kMaxOnlineSnapshots, "while_loop: ", options.snapshots,
              " snapshots is more than the online schedule's limit of ", kMaxOnlineSnapshots,
              " (each has a slot from the start)");
  auto node = std::make_shared<ScanNode>(step, options.snapshots, last_stats);
  node->while_loop_ = true;
  node->state_bytes = state0.nbytes();
  node->state_shape = state0.shape();
  node->state_dtype = state0.dtype();
  node->state_device = state0.device();
  schedule::OnlineCheckpointer online(options.snapshots);
  Tensor current = state0.detach();
  int64_t t = 0;
  {
    CaptureFinder finder(*node);
    while (true) {
      bool go;
      {
        NoGradGuard no_grad;
        go = cond(current, t);
      }
      if (!go) break;
      auto decision = online.on_step();
      if (decision.take_snapshot) node->take_snapshot(decision.slot, current, t);
      ObserverScope scope(&finder);
      current = node->run_untaped(current, t);
      ++t;
    }
  }
  stats.steps = t;
  stats.optimal_forward_steps = t > 0 ? schedule::revolve_optimal_forward_steps(t, options.snapshots) : 0;
  if (t == 0) return state0;
  node->set_schedule(online.reverse_schedule(), t, current);
  return finish(node, state0, current);
}

}  // namespace remat
