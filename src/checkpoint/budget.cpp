// The budget planner's state and its cost model (see include/remat/budget.h).
#include "remat/budget.h"

#include "budget_internal.h"

#include <algorithm>
#include <map>
#include <unordered_set>

#include "remat/autodiff.h"
#include "remat/backend.h"
#include "remat/devices.h"
#include "remat/offload.h"
#include "remat/memory.h"
#include "tensor/device_time.h"

namespace remat {

BudgetPlanner::BudgetPlanner() : state_(std::make_unique<State>()) {}
BudgetPlanner::~BudgetPlanner() = default;

std::optional<BudgetPlanner::Report> BudgetPlanner::report() const { return state_->report; }
std::optional<schedule::ChainCosts> BudgetPlanner::costs() const { return state_->costs; }
void BudgetPlanner::set_options(schedule::ChainPlanOptions options) { state_->options = std::move(options); }
const schedule::ChainPlanOptions& BudgetPlanner::options() const { return state_->options; }

std::optional<BudgetPlanner::FeasibleRange> BudgetPlanner::feasible_range() const {
  const State& st = *state_;
  schedule::ChainCosts measured, held;
  size_t outside = 0;
  if (st.profile_complete() && st.profile_runs >= kProfilingSteps) {
    measured = st.measured_costs();
    outside = st.measured_outside_bytes();
    held = st.held_costs(measured);
  } else if (st.report) {
    measured = held = st.report->costs;
    outside = st.report->outside_bytes;
  } else {
    return std::nullopt;
  }
  measured.offload_seconds_per_byte = -1;  // the range in memory, as make_plan plans without a target
  measured.offload_write_seconds_per_byte = 0;
  measured.boundary_bytes.back() = held.boundary_bytes.back();  // as make_plan plans in memory
  const schedule::ChainPlanner planner(measured, held, st.options);
  FeasibleRange range;
  range.least_planned_peak_bytes = planner.least_planned_peak() + outside;
  range.smallest_budget_bytes =
      held.boundaries_counted_when_held ? planner.smallest_limit() + outside : range.least_planned_peak_bytes;
  range.save_all_peak_bytes = schedule::plan_save_all(measured).predicted_peak_bytes + outside;  // the planners' count
  return range;
}

std::optional<BudgetPlanner::Report> BudgetPlanner::plan_for(const Policy& budget) const {
  REMAT_CHECK(budget.keep.kind == Keep::Kind::budget, "BudgetPlanner::plan_for: ", budget.to_string(),
              " is not a budget policy");
  const State& st = *state_;
  if (!st.profile_complete() || st.profile_runs < kProfilingSteps) return std::nullopt;
  return st.plan_report(budget, st.signature, "the model");
}

bool BudgetPlanner::State::profile_complete() const {
  if (!profiling || profiles.empty()) return false;
  for (const auto& p : profiles)
    if (!p->backward_done) return false;
  return true;
}

schedule::ChainCosts BudgetPlanner::State::measured_costs() const {
  detail::settle_device_seconds();  // the profiles' times, read off the device's marks
  schedule::ChainCosts c;
  constexpr double kNominalSecondsPerFlop = 1e-9;  // ChainPlanOptions::times_from_flops
  const bool nominal = options.times_from_flops;
  for (const auto& p : profiles) {
    c.forward_time.push_back(nominal ? p->forward_flops * kNominalSecondsPerFlop : p->forward_seconds);
    c.backward_time.push_back(nominal ? 2 * p->forward_flops * kNominalSecondsPerFlop : p->backward_seconds);
    c.boundary_bytes.push_back(p->boundary_bytes);
    c.saved_bytes.push_back(p->saved_bytes);
    c.streamed_bytes.push_back(p->streamed_bytes);
  }
  // Note [saved bytes outside the chain]. What the step saves outside its layer calls is counted
  // by when it lives. What was saved before the chain started lives through the whole chain: the
  // outside bytes, added to every point of the plan. What the ops after the chain save (up to the
  // loss) lives from the chain's end until the backward reaches the chain, when the chain holds
  // only what its plan kept at the top level: it is counted with the chain's output a_L, which the
  // model holds over exactly that span (the last stage's forward and the loss; a re-run that makes
  // a_L again counts it too, which errs on the safe side), so it is not in the peak of the chain's
  // re-runs, where a deep chain's least peak lies.
  c.boundary_bytes.push_back(profiles.back()->output_bytes + measured_after_chain_bytes());
  c.gradients_counted = false;  // the budget bounds saved bytes; gradient buffers are not saved values
  return c;
}

// Note [records that keep their outputs]. A layer call whose ops save its output (a tanh layer)
// records those bytes, and the next layer call keeps the same storage as its input: a_{i+1} and
// stage i's record share it, and the allocator counts it once. The planners count it twice (in
// x[i+1] and in xbar[i], on the safe side); the prediction counts it once while both are in memory
// (simulate, Note [a record that keeps its output] in src/schedule/simulate.cpp). The sharing is
// measured, not assumed: the bytes are the re-run's outputs that its ops saved, and only where the
// next profiled layer call kept those outputs as its input (the last one's go to the loss as a_L).
std::vector<size_t> BudgetPlanner::State::measured_saved_output_bytes(const schedule::ChainCosts& c) const {
  std::vector<size_t> shared(profiles.size(), 0);
  for (size_t i = 0; i < profiles.size(); ++i) {
    const RegionProfile& p = *profiles[i];
    size_t bytes = p.saved_output_bytes;
    if (i + 1 < profiles.size())
      bytes = p.outputs_kept_by == profiles[i + 1].get() ? std::min(bytes, p.outputs_kept_bytes) : 0;
    else
      bytes = std::min(bytes, p.output_bytes);
    shared[i] = std::min({bytes, c.saved_bytes[i], c.boundary_bytes[i + 1]});
  }
  return shared;
}

// Note [what a sweep keeps]. A region keeps, besides its input, every value its steps read that
// was made before it opened: each op between two layer calls and each call reads its inputs from
// the region's own steps or from outside it, and the region keeps the latter (as its externals)
// until its backward. Passing from layer call j-1 to call j, the sweep of a region that began
// after the values were made keeps: the step's token ids, read only by call j; a position
// embedding that the model adds to call j-1's output; a constant mask multiplied into every
// call's output. The chain model sees only a_j, a temporary of the sweep; these go into
// ChainCosts::swept_values. They are measured while profiling by an op listener (SweepWatch):
// every op run inside a profiled call marks the storages it makes as made by that call; every op
// between two calls notes the storages it reads, with the call that made them (the last call
// begun when an op made it; -1 for storages no op of the scope made: its inputs, constants made
// before it). At call j, the values that the ops since call j-1 ended and call j itself read are
// swept where they were made before call j-1 began. Parameters and gradients are not saved
// values, and are skipped; a storage an op only viewed keeps the call that first made it.
// A value found is the input of a later call than the one that made it (a branch's input read by
// the next branch, a residual's input read by its add): a region starting at that call holds it
// as its input, counted as a boundary, so it is kept beyond the input only by regions starting
// later.
class BudgetPlanner::State::SweepWatch : public autodiff::OpListener {
 public:
  explicit SweepWatch(State& state) : state_(state), previous_(autodiff::set_op_listener(this)) {}
  ~SweepWatch() override {  // the forward's end: what the ops after the last call saved is after the chain
    autodiff::set_op_listener(previous_);
    state_.after_chain_saves.clear();
    for (const auto& [value, bytes] : state_.gap_saves) state_.after_chain_saves.push_back(value);
    state_.known.clear();  // what the forward made and read: measured into the profiles by now
    state_.last_input_of.clear();
    state_.reads.clear();
    state_.gap_saves.clear();
  }
  SweepWatch(const SweepWatch&) = delete;
  SweepWatch& operator=(const SweepWatch&) = delete;

  void on_op(autodiff::OpEvent& event) override {
    if (autodiff::recompute_depth() == 0) {
      const int by = state_.profiled_calls - 1;
      for (const auto& out : event.outputs) state_.note_made(out, by);
      if (!state_.in_call) {
        for (const auto& in : event.inputs) state_.note_read(in);
        if (recorded(event.inputs)) {  // what its node keeps (Note [what the ops between calls save] in simulate.cpp)
          for (size_t i = 0; i < event.inputs.size(); ++i)
            if (event.saves_input && event.saves_input(i)) state_.note_gap_saved(event.inputs[i]);
          for (size_t i = 0; i < event.outputs.size(); ++i)
            if (event.saves_output && event.saves_output(i)) state_.note_gap_saved(event.outputs[i]);
        }
      }
    }
    if (previous_) previous_->on_op(event);
  }

 private:
  static bool recorded(const TensorList& inputs) {
    return grad_enabled() && std::any_of(inputs.begin(), inputs.end(), [](const Tensor& t) { return t.requires_grad(); });
  }
  State& state_;
  autodiff::OpListener* previous_;
};

std::shared_ptr<autodiff::OpListener> BudgetPlanner::State::watch_sweeps() { return std::make_shared<SweepWatch>(*this); }

BudgetPlanner::State::Known* BudgetPlanner::State::known_of(const Tensor& t) {
  if (!t.defined() || !t.storage()) return nullptr;
  const memory::Tag tag = t.storage()->tag();
  if (tag != memory::Tag::other && tag != memory::Tag::saved) return nullptr;  // parameters, gradients
  Known& k = known[t.storage().get()];
  if (k.storage.lock() != t.storage()) k = Known{t.storage(), -1, next_value++};  // new, or a reused address
  return &k;
}

void BudgetPlanner::State::note_made(const Tensor& t, int by) {
  if (!t.defined() || !t.storage()) return;
  const auto k = known.find(t.storage().get());
  if (k != known.end() && k->second.storage.lock() == t.storage()) return;  // a view: its maker stays
  if (Known* made = known_of(t)) made->made_by = by;
}

void BudgetPlanner::State::note_read(const Tensor& t) {
  if (Known* k = known_of(t)) reads.push_back({t.storage(), k->made_by, k->value, t.storage()->bytes()});
}

void BudgetPlanner::State::note_gap_saved(const Tensor& t) {
  if (Known* k = known_of(t)) gap_saves.emplace_back(k->value, t.storage()->bytes());
}

void BudgetPlanner::State::profile_call_start(RegionProfile& profile, const TensorList& inputs) {
  std::unordered_set<int> saved;
  for (const auto& [value, bytes] : gap_saves)
    if (saved.insert(value).second) profile.gap_saved.push_back({profiled_calls, bytes, value});
  gap_saves.clear();
  for (const auto& t : inputs) note_read(t);
  if (profiled_calls > 0) measure_sweep_kept(profile);
  reads.clear();
  for (const auto& t : inputs)
    if (t.defined() && t.storage()) last_input_of[t.storage().get()] = {t.storage(), profiled_calls};
  ++profiled_calls;
  in_call = true;
}

void BudgetPlanner::State::measure_sweep_kept(RegionProfile& profile) const {
  const int stage = profiled_calls;
  std::unordered_set<int> seen;
  for (const Read& r : reads) {
    if (!seen.insert(r.value).second) continue;  // read twice
    const std::shared_ptr<Storage> storage = r.storage.lock();  // null: freed since, kept by a region's sweep all the same
    if (storage && std::any_of(last_outputs.begin(), last_outputs.end(),
                               [&](const std::weak_ptr<Storage>& w) { return w.lock() == storage; }))
      continue;  // call j-1's output, passed on (a_j)
    int made = r.made_by;
    if (const auto in = storage ? last_input_of.find(storage.get()) : last_input_of.end();
        in != last_input_of.end() && in->second.first.lock() == storage)
      made = std::max(made, in->second.second);  // the latest call that took it as its input
    if (made <= stage - 2) profile.sweep_kept.push_back({stage, made, r.bytes, r.value});
  }
}

void BudgetPlanner::State::profile_call_end(const TensorList& outputs) {
  in_call = false;
  last_outputs.clear();
  for (const auto& t : outputs)
    if (t.defined() && t.storage()) last_outputs.push_back(t.storage());
}

schedule::ChainCosts BudgetPlanner::State::held_costs(const schedule::ChainCosts& measured) const {
  schedule::ChainCosts held = measured;
  held.saved_output_bytes = measured_saved_output_bytes(measured);
  held.saved_input_bytes.clear();
  for (size_t i = 0; i < profiles.size(); ++i)
    held.saved_input_bytes.push_back(std::min(profiles[i]->saved_input_bytes, measured.boundary_bytes[i]));
  held.boundaries_counted_when_held = true;
  std::unordered_map<int, int> gap_index;  // the profile's value numbers, 0.. in order
  const auto number = [](std::unordered_map<int, int>& index, int value) {
    return index.emplace(value, static_cast<int>(index.size())).first->second;
  };
  // a swept value's number is per maker: one storage that two sweeps see as made by different
  // stages (the input of two layer calls, a layer that returns its input) is two values to the
  // chain model, counted twice at most (on the safe side), never one value with two makers
  std::map<std::pair<int, int>, int> swept_index;
  // What the ops between calls save was live when the profiled backward reached the chain (they
  // all ran recorded), so measured_after_chain_bytes holds it; gap_saved counts it now, where it
  // lives (but what the ops after the chain save too, such as a mask they read as well).
  std::unordered_map<int, size_t> gap_bytes;
  for (const auto& p : profiles)
    for (const auto& g : p->gap_saved) gap_bytes.emplace(g.value, g.bytes);
  size_t in_gaps = 0;
  for (const auto& [value, bytes] : gap_bytes)
    if (std::find(after_chain_saves.begin(), after_chain_saves.end(), value) == after_chain_saves.end()) in_gaps += bytes;
  held.boundary_bytes.back() -= std::min(in_gaps, measured_after_chain_bytes());
  for (const auto& p : profiles) {
    for (schedule::ChainCosts::SweptValue v : p->sweep_kept) {
      v.value = swept_index.emplace(std::make_pair(v.value, v.made_by), static_cast<int>(swept_index.size())).first->second;
      held.swept_values.push_back(v);
    }
    for (schedule::ChainCosts::GapSaved g : p->gap_saved) {
      g.value = number(gap_index, g.value);
      held.gap_saved.push_back(g);
    }
  }
  return held;
}

size_t BudgetPlanner::State::measured_after_chain_bytes() const {
  // the step's saved peak when the backward reached the chain, beyond what was live at entry
  // plus the chain's own boundaries, if that peak was reached during this step
  size_t boundaries = 0;
  for (const auto& p : profiles) boundaries += p->boundary_bytes;
  const RegionProfile& last = *profiles.back();
  if (last.saved_peak_at_backward > saved_peak_at_entry &&
      last.saved_peak_at_backward > saved_live_at_entry + boundaries)
    return last.saved_peak_at_backward - saved_live_at_entry - boundaries;
  return 0;
}

size_t BudgetPlanner::State::measured_outside_bytes() const { return saved_live_at_entry; }

}  // namespace remat

namespace remat {

bool BudgetPlanner::State::planned_for(const std::vector<Shape>& shapes, const Policy& budget) const {
  const std::string target = budget.saved.offload ? budget.saved.offload->to_string() : "";
  return !stale && report && report->signature == shapes && report->policy == budget.keep.to_string() &&
         report->offload_target == target;
}

bool BudgetPlanner::State::can_plan(const std::vector<Shape>& shapes) const {
  return profiling && signature == shapes && profile_complete() && profile_runs >= kProfilingSteps;
}

void BudgetPlanner::State::start_profiling(const std::vector<Shape>& shapes, Device device) {
  profile_runs = profiling && signature == shapes ? profile_runs + 1 : 1;
  profiling = true;
  stale = false;
  signature = shapes;
  this->device = device;
  report.reset();
  profiles.clear();
  stage_labels.clear();
  stage_keys.clear();
  // the counters of the device the profiled values live on (those the regions read, segment.cpp)
  const memory::Stats s = memory_stats(device);
  saved_live_at_entry = s.live(memory::Tag::saved);
  saved_peak_at_entry = s.peak(memory::Tag::saved);
  profiled_calls = 0;
  last_input_of.clear();
  last_outputs.clear();
  known.clear();
  reads.clear();
  gap_saves.clear();
  after_chain_saves.clear();
  next_value = 0;
  in_call = false;
}

// budget:auto: the memory the run may use, less what it held besides saved values (the profiled
// step's per-tag peaks when its backward left the chain; the first stage's backward ends last).
void BudgetPlanner::State::derive_budget(const Policy& budget, Report& r) const {
  const DeviceMemory device_memory_now = device_memory(device);
  const memory::Stats stats = memory_stats(device);
  r.automatic = true;
  r.memory_capacity_bytes = device_memory_now.free_bytes + stats.live_total + stats.cached_bytes;
  r.capacity_source = device_memory_now.limited_by + " plus what remat holds";
  if (budget.keep.memory_limit_bytes > 0 && budget.keep.memory_limit_bytes < r.memory_capacity_bytes) {
    r.memory_capacity_bytes = budget.keep.memory_limit_bytes;
    r.capacity_source = "the memory limit";
  }
  for (const auto& p : profiles) r.held_besides_saved_bytes = std::max(r.held_besides_saved_bytes, p->held_peak_at_backward_end);
  REMAT_CHECK(r.memory_capacity_bytes > r.held_besides_saved_bytes, "budget policy: ", budget.to_string(),
              ": the run holds ", r.held_besides_saved_bytes, " bytes (",
              memory::format_bytes(static_cast<double>(r.held_besides_saved_bytes)),
              ") besides saved values (parameters, gradients, optimizer state and temporaries at their peaks) but may "
              "use only ", r.memory_capacity_bytes, " bytes (",
              memory::format_bytes(static_cast<double>(r.memory_capacity_bytes)), ", ", r.capacity_source,
              "): no budget is left for saved values");
  r.budget_bytes = r.memory_capacity_bytes - r.held_besides_saved_bytes;
}

namespace {

// The runtime's reads ahead of a plan (Note [reads ahead of a plan's nodes] in
// src/saved/offload_store.cpp): a read the plan starts at action s begins when the backward reaches the
// first top-level node (in the backward's order) whose part of the backward starts at s or later,
// so the read occupies memory no earlier than the plan counted it. A node's part starts after the
// backward of the node behind it (after the loss, for the last node); the reads and these starts
// both move forward through the backward, so one pass pairs them.
std::shared_ptr<const detail::OffloadReadPlan> read_plan_of(const schedule::Plan& plan) {
  if (plan.reads.empty()) return nullptr;
  const auto& tree = plan.tree;
  const int stages = tree.back().last + 1;
  std::vector<int> backward_at(static_cast<size_t>(stages), 0);
  int loss = 0;
  for (size_t p = 0; p < plan.actions.size(); ++p) {
    if (plan.actions[p].kind == schedule::ActionKind::backward) backward_at[static_cast<size_t>(plan.actions[p].index)] = static_cast<int>(p);
    if (plan.actions[p].kind == schedule::ActionKind::loss) loss = static_cast<int>(p);
  }
  std::vector<int> part_start(tree.size()), node_of(static_cast<size_t>(stages), -1);
  for (size_t t = tree.size(); t-- > 0;) {
    part_start[t] = t + 1 == tree.size() ? loss + 1 : backward_at[static_cast<size_t>(tree[t + 1].first)] + 1;
    node_of[static_cast<size_t>(tree[t].first)] = static_cast<int>(t);
  }
  auto out = std::make_shared<detail::OffloadReadPlan>(static_cast<size_t>(stages));
  int t = static_cast<int>(tree.size()) - 1;
  for (const schedule::ReadAhead& read : plan.reads) {
    const int own = node_of[static_cast<size_t>(read.index)];
    if (read.start_action >= read.fetch_action || own < 0) continue;
    while (t > own && part_start[static_cast<size_t>(t)] < read.start_action) --t;
    if (t > own) (*out)[static_cast<size_t>(tree[static_cast<size_t>(t)].first)].push_back(read.index);
  }
  return out;
}

}  // namespace

// The offload target's price (charge_offload), in the report and in the costs, or the cost per
// byte the options give.
void BudgetPlanner::State::price_offload(const OffloadTarget& target, schedule::ChainCosts& measured, Report& r) const {
  const OffloadCharge charge = charge_offload(target.directory, device, measured);
  r.offload_target = target.to_string();
  r.offload_write_bytes_per_second = charge.price.write_bytes_per_second;
  r.offload_read_bytes_per_second = charge.price.read_bytes_per_second;
  r.offload_priced_as = charge.price.page_cache ? "page cache" : "disk";
  r.offload_to_host_bytes_per_second = charge.copies.to_host_bytes_per_second;
  r.offload_from_host_bytes_per_second = charge.copies.from_host_bytes_per_second;
  r.offload_in_full = charge.in_full;
  if (options.offload_seconds_per_byte >= 0) {  // a given cost: no queued write part, reads ahead
    measured.offload_seconds_per_byte = options.offload_seconds_per_byte;
    measured.offload_write_seconds_per_byte = 0;
    measured.reads_ahead = true;
    r.offload_in_full = false;
  }
}

BudgetPlanner::Report BudgetPlanner::State::plan_report(const Policy& budget, const std::vector<Shape>& shapes,
                                                        const std::string& scope) const {
  schedule::ChainCosts measured = measured_costs();
  const schedule::ChainCosts held = held_costs(measured);  // as an allocator counts (see below)
  const size_t outside = measured_outside_bytes();
  Report r;
  r.policy = budget.keep.to_string();
  r.budget_bytes = budget.keep.budget_bytes;
  if (budget.keep.budget_auto) derive_budget(budget, r);
  if (budget.saved.offload) price_offload(*budget.saved.offload, measured, r);
  const size_t limit = r.budget_bytes > outside ? r.budget_bytes - outside : 0;
  r.input_shape = shapes.empty() ? Shape{} : shapes[0];
  r.signature = shapes;
  r.stage_labels = stage_labels;
  r.outside_bytes = outside;
  r.after_chain_bytes = measured_after_chain_bytes();
  r.chain_limit_bytes = limit;
  r.costs = measured;
  std::string inputs;
  for (const auto& s : shapes) inputs += (inputs.empty() ? "" : ", ") + shape_str(s);
  // The plan is predicted as the allocator counts (Note [plans within the allocator's count] in
  // src/schedule/chain_planner.cpp), with an offload target too: an offloaded record takes the
  // input it holds along (Note [a record that keeps its input] in src/schedule/simulate.cpp), and the
  // runtime holds the saved bytes at the prediction by waiting for writes still under way (Note
  // [writes behind a plan's peak] in src/saved/offload_store.cpp). Below the smallest budget with
  // offload a plan in memory may still fit (offload never lowers the planners' least peak, and the
  // held count may lie below theirs): it offloads nothing.
  // The one chain planner derives the planning costs in memory and with the target (Note [one
  // chain planner] in src/schedule/chain_planner.cpp).
  bool in_memory = true;
  std::optional<schedule::ChainPlanner> planner;
  schedule::ChainCosts planning = measured;
  // in memory what the ops between calls save is in held's gap_saved, not after the chain
  if (!budget.saved.offload) planning.boundary_bytes.back() = held.boundary_bytes.back();
  try {
    planner.emplace(planning, held, options);
    schedule::ChainPlan chosen = planner->plan(limit, &in_memory);
    r.plan = std::move(chosen.plan);
    r.planner = chosen.describe();
    r.method = chosen.method;
  } catch (const schedule::InfeasibleError& e) {
    const size_t smallest = e.min_feasible_bytes + outside;
    throw Error(detail::concat("budget policy: ", budget.to_string(), " (",
                               budget.keep.budget_auto ? "derived: " : "",
                               memory::format_bytes(static_cast<double>(r.budget_bytes)),
                               ") is below the smallest feasible budget for ", scope, " with input ", inputs, ": ",
                               smallest, " bytes (", memory::format_bytes(static_cast<double>(smallest)), "; its ",
                               measured.num_stages(), " layer calls need ", e.min_feasible_bytes, " bytes and ", outside,
                               " bytes are saved outside them)"));
  } catch (const std::exception& e) {
    throw Error(detail::concat("budget policy: ", budget.to_string(), ": cannot plan ", scope, " (",
                               measured.num_stages(), " layer calls): ", e.what()));
  }
  measured = planner->predicted_costs(in_memory);
  r.costs = measured;
  r.tree = schedule::format_tree(r.plan.tree);
  r.predicted_peak_bytes = r.plan.predicted_peak_bytes + outside;
  r.predicted_seconds = r.plan.predicted_time;
  r.predicted_offloaded_bytes = schedule::simulate(measured, r.plan).offloaded_bytes;
  for (const auto& p : profiles) {
    r.profiled_chain_seconds += p->forward_seconds + p->recompute_seconds + p->backward_seconds;
    r.stage_forward_flops.push_back(p->forward_flops);
  }
  return r;
}

void BudgetPlanner::State::make_plan(const Policy& budget, const std::vector<Shape>& shapes, const std::string& scope) {
  Report r = plan_report(budget, shapes, scope);
  read_plan = read_plan_of(r.plan);
  costs = r.costs;
  planned_keys = stage_keys;
  report = std::move(r);  // the profile is kept: another budget re-plans from it
  std::erase_if(cache, [&](const Cached& c) { return c.signature == shapes; });
  cache.push_back({shapes, report->policy, report->offload_target, planned_keys, *report, *costs, read_plan});
  if (cache.size() > kCachedPlans) cache.erase(cache.begin());
}

// Note [what a plan is for]. A plan is made for one sequence of layer calls: the calls its
// profile met, each with its label and its inputs' shapes and dtypes (stage_key). Each call of a
// planned step is compared with the stage its position plans for; a call that differs (a router
// that picked another layer, another count) makes the plan stale: the step finishes under it and
// the next one profiles again. Plans for other input shapes (bucketed lengths, a last partial
// batch) are kept, a few, and put back in force when those shapes come again, instead of
// profiling each time. Whatever the plan, the measured peak of each step is compared with the
// budget (Note [a budget compared at every step] in call.cpp).
bool BudgetPlanner::State::restore_plan(const std::vector<Shape>& shapes, const Policy& budget) {
  const std::string target = budget.saved.offload ? budget.saved.offload->to_string() : "";
  for (size_t i = cache.size(); i-- > 0;) {
    Cached& c = cache[i];
    if (c.signature != shapes || c.policy != budget.keep.to_string() || c.target != target) continue;
    report = c.report;
    costs = c.costs;
    read_plan = c.read_plan;
    planned_keys = c.keys;
    stale = false;
    std::rotate(cache.begin() + static_cast<std::ptrdiff_t>(i), cache.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                cache.end());
    return true;
  }
  return false;
}

void BudgetPlanner::State::drop_plan() {
  stale = true;
  if (report) std::erase_if(cache, [&](const Cached& c) { return c.signature == report->signature; });
}

OffloadCharge charge_offload(const std::string& directory, Device device, schedule::ChainCosts& costs) {
  OffloadCharge charge;
  charge.price = offload_price(offload_bandwidth(directory), costs.offloadable_bytes(),
                               device_memory(Device{}).free_bytes);  // the host's
  // a device's values go to host memory before they are written and come back after they are read
  charge.copies = host_copy_bandwidth(device);
  charge.in_full = offload_copies_share_the_cores(device);
  costs.offload_seconds_per_byte = charge.price.seconds_per_byte() + charge.copies.to_host_seconds_per_byte() +
                                   charge.copies.from_host_seconds_per_byte();
  // the write runs behind the forward compute after its node, a read ahead of its node where the
  // plan's peak leaves room (read_plan_of), unless the copies share the step's cores
  costs.offload_write_seconds_per_byte =
      charge.in_full ? 0.0 : charge.price.write_seconds_per_byte() + charge.copies.to_host_seconds_per_byte();
  costs.reads_ahead = !charge.in_full;
  return charge;
}

}  // namespace remat
