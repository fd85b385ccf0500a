// The layer-call dispatcher: which call is a layer, and how a layer call runs under each policy
// (the rule is stated in include/remat/call.h).
//
// Each call in progress on the thread is a Frame. A transparent frame (the root, a container)
// may own an every-k group (an open segment Region to which its next layer calls are added) and
// may be, or be inside, a plan scope (budget:BYTES). A layer frame marks "inside a layer": calls
// made there run plain. Layer functions are wrapped so that they push their layer frame whenever
// they run, including when a region replays them in the backward pass.
#include <map>

#include "budget_internal.h"
#include "region.h"
#include "segment.h"
#include "remat/checkpoint.h"
#include "remat/offload.h"
#include "remat/memory.h"

namespace remat {

namespace {

using detail::Segment;

// A plan scope: the outermost transparent call under a budget.
struct PlanScope {
  BudgetPlanner::State* state = nullptr;
  std::shared_ptr<BudgetPlanner> planner;  // keeps the state alive
  Policy budget;
  std::string label;
  bool profiling = false;
  std::shared_ptr<autodiff::OpListener> watch;  // while profiling (Note [what a sweep keeps] in budget.cpp)
  const std::vector<schedule::PlanNode>* plan = nullptr;
  int stages = 0;
  int position = 0;  // layer calls met so far
  // the plan's regions open at this position, outermost first: a segment each (Note [one graph])
  std::vector<std::pair<std::shared_ptr<Segment>, const schedule::PlanNode*>> open;
};

struct Frame {
  bool transparent = false;
  std::string label;
  // transparent frames: the open every-k group
  std::shared_ptr<Segment> group;
  Policy group_policy;
  std::string group_first, group_last;
  int group_count = 0;
  PlanScope* plan = nullptr;              // the plan scope this frame is in
  std::unique_ptr<PlanScope> own_plan;    // set when this frame is the plan scope
};

thread_local std::vector<Frame*> frames;

void close_group(Frame& f) {
  if (!f.group) return;
  std::shared_ptr<Segment> g = std::move(f.group);
  f.group.reset();
  g->set_label(f.group_first == f.group_last ? f.group_first : f.group_first + ".." + f.group_last);
  g->close();
}

void finish_plan(PlanScope& ps, bool unwinding) {
  if (!ps.open.empty() && !unwinding) ps.state->drop_plan();  // the plan's last region was not reached
  while (!ps.open.empty()) {
    std::shared_ptr<Segment> s = std::move(ps.open.back().first);
    ps.open.pop_back();
    if (unwinding)
      s->abort();
    else
      s->close();
  }
  if (!unwinding && !ps.profiling && ps.position != ps.stages) ps.state->drop_plan();
}

// Pushes a frame for the duration of a call; on exit closes what the frame owns.
class FrameGuard {
 public:
  explicit FrameGuard(Frame& frame) : frame_(frame), exceptions_(std::uncaught_exceptions()) { frames.push_back(&frame_); }
  ~FrameGuard() {
    const bool unwinding = std::uncaught_exceptions() > exceptions_;
    frames.pop_back();
    try {
      if (frame_.group) {
        if (unwinding) {
          frame_.group->abort();
          frame_.group.reset();
        } else {
          close_group(frame_);
        }
      }
      if (frame_.own_plan) finish_plan(*frame_.own_plan, unwinding);
    } catch (...) {
      // close() only throws on internal errors; never let one escape a destructor
    }
  }
  FrameGuard(const FrameGuard&) = delete;
  FrameGuard& operator=(const FrameGuard&) = delete;

 private:
  Frame& frame_;
  int exceptions_;
};

// The function a layer call runs, first and on replay: inside a layer frame, under its own policy.
RegionFn layer_function(const RegionFn& fn, const CallSite& site, bool record_all = false) {
  return [fn, label = site.label, policy = site.policy, record_all](const TensorList& in) {
    Frame frame;
    frame.label = label;
    FrameGuard guard(frame);
    std::optional<ScopedPolicy> scope;
    if (record_all)
      scope.emplace(Policy::save_all());
    else if (policy && policy->keep.kind != Policy::Kind::budget)
      scope.emplace(*policy);
    return fn(in);
  };
}

TensorList run_plain(const RegionFn& fn, const TensorList& inputs, const CallSite& site, bool record_all = false) {
  return layer_function(fn, site, record_all)(inputs);
}

// One layer call as a region: a segment of its own (Note [one graph] in segment.cpp), which writes
// `profile` where given (budget planning).
TensorList single_region(const RegionFn& fn, const TensorList& inputs, const CallSite& site, const Policy& policy,
                         std::shared_ptr<RegionProfile> profile = nullptr, bool record_all = false) {
  auto segment = std::make_shared<Segment>(site.label, detail::device_of(inputs), /*group=*/false);
  if (policy.keep.kind == Policy::Kind::selective) segment->keep_outputs_of(policy.keep);
  if (profile) segment->set_profile(std::move(profile));
  segment->set_inputs(inputs);
  ScopedPolicy scope(policy);
  segment->open();
  TensorList outputs;
  try {
    Segment::InCall in_call(*segment, site.label);
    outputs = run_plain(fn, inputs, site, record_all);
  } catch (...) {
    segment->abort();
    throw;
  }
  segment->set_outputs(outputs);
  segment->close();
  return outputs;
}

std::shared_ptr<BudgetPlanner> fallback_planner(const std::string& label) {
  thread_local std::map<std::string, std::shared_ptr<BudgetPlanner>> planners;
  auto& p = planners[label];
  if (!p) p = std::make_shared<BudgetPlanner>();
  return p;
}

std::unique_ptr<PlanScope> begin_plan(const CallSite& site, const Policy& budget, const TensorList& inputs) {
  auto ps = std::make_unique<PlanScope>();
  ps->planner = site.planner ? site.planner : fallback_planner(site.label);
  ps->state = &ps->planner->state();
  ps->budget = budget;
  ps->label = site.label.empty() ? "the model" : "'" + site.label + "'";
  std::vector<Shape> shapes;
  for (const auto& t : inputs) shapes.push_back(t.defined() ? t.shape() : Shape{});
  BudgetPlanner::State& st = *ps->state;
  if (!st.planned_for(shapes, budget)) st.restore_plan(shapes, budget);  // Note [what a plan is for]
  if (!st.stale && !st.planned_for(shapes, budget) && st.can_plan(shapes))
    st.make_plan(budget, shapes, ps->label);
  if (st.planned_for(shapes, budget)) {
    ps->plan = &st.report->plan.tree;
    ps->stages = st.report->costs.num_stages();
  } else {
    st.start_profiling(shapes, detail::device_of(inputs));
    ps->profiling = true;
    ps->watch = st.watch_sweeps();
  }
  detail::begin_budget_check(ps->planner, budget, ps->label, shapes, detail::device_of(inputs));
  return ps;
}

TensorList run_transparent(const RegionFn& fn, const TensorList& inputs, const CallSite& site, Frame* parent) {
  if (parent) close_group(*parent);
  Frame frame;
  frame.transparent = true;
  frame.label = site.label;
  frame.plan = parent ? parent->plan : nullptr;
  std::optional<ScopedPolicy> scope;
  if (site.policy) scope.emplace(*site.policy);
  const Policy effective = current_policy();
  std::optional<detail::OffloadGate> gate;  // in a plan scope, only the nodes the plan offloads are written
  if (frame.plan == nullptr && effective.keep.kind == Policy::Kind::budget && grad_enabled()) {
    frame.own_plan = begin_plan(site, effective, inputs);
    frame.plan = frame.own_plan.get();
    if (effective.saved.offload) {  // writes overlap later nodes, within the plan's peak (on the CPU)
      const bool capped = frame.own_plan->plan != nullptr && detail::device_of(inputs).type == DeviceType::cpu;
      gate.emplace(detail::OffloadGate::Mode::closed,
                   capped ? frame.own_plan->state->report->predicted_peak_bytes : size_t{0},
                   capped ? frame.own_plan->state->read_plan : nullptr);
    }
  }
  FrameGuard guard(frame);
  return fn(inputs);
}

// The node of `plan` (a plan tree's level) that holds layer call `position`, or null.
const schedule::PlanNode* plan_node_at(const std::vector<schedule::PlanNode>& plan, int position) {
  for (const auto& n : plan)
    if (n.first <= position && position <= n.last) return &n;
  return nullptr;
}

TensorList planned_call(PlanScope& ps, const RegionFn& fn, const TensorList& inputs, const CallSite& site) {
  const int position = ps.position++;
  BudgetPlanner::State& st = *ps.state;
  if (ps.profiling) {
    auto profile = std::make_shared<RegionProfile>();
    st.profile_call_start(*profile, inputs);  // what a sweep would keep (Note [what a sweep keeps])
    st.profiles.push_back(profile);
    st.stage_labels.push_back(site.label);
    st.stage_keys.push_back(detail::stage_key(site.label, inputs));
    TensorList outputs = single_region(fn, inputs, site, Policy::every_layer(), profile, /*record_all=*/true);
    st.profile_call_end(outputs);
    return outputs;
  }
  if (position >= ps.stages) {
    st.drop_plan();  // more layer calls than planned: profile again next time
    return single_region(fn, inputs, site, Policy::every_layer());
  }
  // another call than planned here (Note [what a plan is for]): the step runs on, the next profiles
  if (st.planned_keys.size() == static_cast<size_t>(ps.stages) &&
      st.planned_keys[static_cast<size_t>(position)] != detail::stage_key(site.label, inputs))
    st.drop_plan();
  const schedule::PlanNode* node = plan_node_at(*ps.plan, position);
  REMAT_ASSERT(node != nullptr, "budget plan has no node for layer call ", position);
  std::optional<detail::OffloadGate> gate;
  if (node->offloaded) gate.emplace(detail::OffloadGate::Mode::every_value);  // all it keeps goes to the target
  const detail::OffloadPlanNode packed_by(node->first);  // where the backward reads its values ahead
  if (node->kind == schedule::PlanNode::Kind::stage) return run_plain(fn, inputs, site, /*record_all=*/true);
  if (ps.open.empty() && position != node->first) {  // entered mid-region: the calls changed since the plan
    st.drop_plan();
    return single_region(fn, inputs, site, Policy::every_layer());
  }
  // the regions of the plan tree that hold this position, each a segment opened at its first call
  for (size_t level = 0; node != nullptr && node->kind == schedule::PlanNode::Kind::region; ++level) {
    REMAT_ASSERT(level >= ps.open.size() || ps.open[level].second == node, "budget plan: layer call ", position,
                 " is outside the open region ", schedule::format_tree({*ps.open[std::min(level, ps.open.size() - 1)].second}));
    if (level == ps.open.size()) {
      REMAT_ASSERT(position == node->first, "budget plan region ", schedule::format_tree({*node}),
                   " entered at layer call ", position);
      auto segment = std::make_shared<Segment>(
          "R[" + std::to_string(node->first) + ".." + std::to_string(node->last) + "]", detail::device_of(inputs),
          /*group=*/true);
      segment->open();
      ps.open.emplace_back(std::move(segment), node);
    }
    node = plan_node_at(node->children, position);
  }
  TensorList outputs;
  {
    std::vector<std::unique_ptr<Segment::InCall>> in_call;
    for (auto& [segment, open_node] : ps.open) in_call.push_back(std::make_unique<Segment::InCall>(*segment, site.label));
    outputs = run_plain(fn, inputs, site, /*record_all=*/true);
  }
  while (!ps.open.empty() && ps.open.back().second->last == position) {
    std::shared_ptr<Segment> s = std::move(ps.open.back().first);
    ps.open.pop_back();
    s->close();
  }
  return outputs;
}

TensorList grouped_call(Frame& top, const Policy& policy, const RegionFn& fn, const TensorList& inputs,
                        const CallSite& site) {
  if (top.group && !(top.group_policy == policy)) close_group(top);
  if (!top.group) {
    top.group = std::make_shared<Segment>(site.label, detail::device_of(inputs), /*group=*/true);
    top.group_policy = policy;
    top.group_first = site.label;
    top.group_count = 0;
    top.group->open();
  }
  TensorList outputs;
  {
    Segment::InCall in_call(*top.group, site.label);
    outputs = run_plain(fn, inputs, site);
  }
  top.group_last = site.label;
  if (++top.group_count >= policy.keep.k) close_group(top);
  return outputs;
}

TensorList layer_call(Frame& top, const RegionFn& fn, const TensorList& inputs, const CallSite& site) {
  ++detail::region_counters().layer_calls;
  ++detail::region_counters().layer_calls_since_backward;
  const bool own = site.policy.has_value();
  if (own && site.policy->keep.kind == Policy::Kind::budget && top.plan == nullptr)
    return run_transparent(fn, inputs, site, &top);  // a layer with its own budget plans its own calls
  if (!grad_enabled()) return run_plain(fn, inputs, site);
  if (top.plan != nullptr && (!own || site.policy->keep.kind == Policy::Kind::budget))
    return planned_call(*top.plan, fn, inputs, site);
  const Policy policy = site.policy.value_or(current_policy());
  if (policy.keep.kind == Policy::Kind::every_k && policy.keep.k > 1 && !own) return grouped_call(top, policy, fn, inputs, site);
  close_group(top);
  // Inside an open segment (a plan region spanning this call's container): the segment covers it.
  if (!policy.keep.recomputes() || policy.keep.kind == Policy::Kind::budget || detail::segment_open())
    return run_plain(fn, inputs, site);
  return single_region(fn, inputs, site, policy);
}

}  // namespace

TensorList detail::explicit_region(const RegionFn& fn, const TensorList& inputs, const CallSite& site,
                                   std::shared_ptr<RegionProfile> profile) {
  // Regions nested inside regions: the backward pass recurses once per level (a region's replay
  // runs the backward of the next one), so the depth is bounded to keep the stack bounded, also
  // in sanitizer builds whose frames are several times larger.
  thread_local int depth = 0;
  REMAT_CHECK(depth < kMaxRegionNesting, "checkpoint region '", site.label, "': regions are nested ", depth + 1,
              " deep; remat supports at most ", kMaxRegionNesting,
              " nested regions (the backward pass recurses once per level)");
  struct Depth {
    Depth() { ++depth; }
    ~Depth() { --depth; }
  } level;
  const Policy policy = site.policy.value_or(current_policy());
  if (!policy.recomputes() || policy.keep.kind == Policy::Kind::budget || !grad_enabled()) {
    // the enclosing region (if any) covers this one; it becomes a region of its own when re-run
    CallSite plain = site;
    plain.policy = policy;
    return run_plain(fn, inputs, plain);
  }
  return single_region(fn, inputs, site, policy, std::move(profile));
}

TensorList call(const RegionFn& fn, const TensorList& inputs, const CallSite& site) {
  REMAT_CHECK(static_cast<bool>(fn), "call '", site.label, "': the function is empty");
  for (size_t i = 0; i < inputs.size(); ++i)
    REMAT_CHECK(inputs[i].defined(), "call '", site.label, "': input ", i, " is undefined");
  Frame* top = frames.empty() ? nullptr : frames.back();
  if (top == nullptr) return run_transparent(fn, inputs, site, nullptr);  // the root
  if (!top->transparent) {
    if (site.role == CallRole::layer) return detail::explicit_region(fn, inputs, site, nullptr);
    return run_plain(fn, inputs, site);
  }
  if (site.role == CallRole::transparent) return run_transparent(fn, inputs, site, top);
  return layer_call(*top, fn, inputs, site);
}

bool in_layer_call() { return !frames.empty() && !frames.back()->transparent; }

}  // namespace remat
