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
#include "remat/checkpoint.h"
#include "remat/offload.h"
#include "remat/memory.h"

namespace remat {

namespace {

using detail::CallStepInfo;
using detail::Region;

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
  int position = 0;                 // layer calls met so far
  std::shared_ptr<Region> segment;  // the open plan region, if any
  const schedule::PlanNode* segment_node = nullptr;
};

struct Frame {
  bool transparent = false;
  std::string label;
  // transparent frames: the open every-k group
  std::shared_ptr<Region> group;
  Policy group_policy;
  std::string group_first, group_last;
  int group_count = 0;
  PlanScope* plan = nullptr;              // the plan scope this frame is in
  std::unique_ptr<PlanScope> own_plan;    // set when this frame is the plan scope
};

thread_local std::vector<Frame*> frames;

void close_group(Frame& f) {
  if (!f.group) return;
  std::shared_ptr<Region> g = std::move(f.group);
  f.group.reset();
  g->set_label(f.group_first == f.group_last ? f.group_first : f.group_first + ".." + f.group_last);
  g->close();
}

void finish_plan(PlanScope& ps, bool unwinding) {
  if (ps.segment) {
    std::shared_ptr<Region> s = std::move(ps.segment);
    ps.segment.reset();
    if (unwinding) {
      s->abort();
    } else {
      s->close();
      ps.state->stale = true;  // the plan's last region was not reached
    }
  }
  if (!unwinding && !ps.profiling && ps.position != ps.stages) ps.state->stale = true;
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

TensorList single_region(const RegionFn& fn, const TensorList& inputs, const CallSite& site, const Policy& policy,
                         std::shared_ptr<RegionProfile> profile = nullptr, bool record_all = false) {
  auto region = std::make_shared<Region>(Region::Kind::call, policy, site.label, std::move(profile));
  ScopedPolicy scope(policy);
  region->open(detail::device_of(inputs));
  TensorList outputs;
  try {
    outputs = region->add_call(layer_function(fn, site, record_all), inputs, CallStepInfo{site, -1});
  } catch (...) {
    region->abort();
    throw;
  }
  region->close();
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

TensorList planned_call(PlanScope& ps, const RegionFn& fn, const TensorList& inputs, const CallSite& site) {
  const int position = ps.position++;
  BudgetPlanner::State& st = *ps.state;
  if (ps.profiling) {
    auto profile = std::make_shared<RegionProfile>();
    st.profile_call_start(*profile, inputs);  // what a sweep would keep (Note [what a sweep keeps])
    st.profiles.push_back(profile);
    st.stage_labels.push_back(site.label);
    TensorList outputs = single_region(fn, inputs, site, Policy::every_layer(), profile, /*record_all=*/true);
    st.profile_call_end(outputs);
    return outputs;
  }
  if (position >= ps.stages) {
    st.stale = true;  // more layer calls than planned: profile again next time
    return single_region(fn, inputs, site, Policy::every_layer());
  }
  const schedule::PlanNode* node = nullptr;
  for (const auto& n : *ps.plan)
    if (n.first <= position && position <= n.last) node = &n;
  REMAT_ASSERT(node != nullptr, "budget plan has no node for layer call ", position);
  std::optional<detail::OffloadGate> gate;
  if (node->offloaded) gate.emplace(detail::OffloadGate::Mode::every_value);  // all it keeps goes to the target
  const detail::OffloadPlanNode packed_by(node->first);  // where the backward reads its values ahead
  if (node->kind == schedule::PlanNode::Kind::stage) {
    return run_plain(fn, inputs, site, /*record_all=*/true);
  }
  if (!ps.segment) {
    if (position != node->first) {  // entered mid-region: the calls changed since the plan was made
      st.stale = true;
      return single_region(fn, inputs, site, Policy::every_layer());
    }
    ps.segment = std::make_shared<Region>(Region::Kind::segment, Policy::every_layer(),
                                          "R[" + std::to_string(node->first) + ".." + std::to_string(node->last) + "]",
                                          nullptr, node->children);
    ps.segment_node = node;
    ps.segment->open(detail::device_of(inputs));
  }
  TensorList outputs = ps.segment->add_call(layer_function(fn, site), inputs, CallStepInfo{site, position});
  if (position == node->last) {
    std::shared_ptr<Region> s = std::move(ps.segment);
    ps.segment.reset();
    s->close();
  }
  return outputs;
}

TensorList grouped_call(Frame& top, const Policy& policy, const RegionFn& fn, const TensorList& inputs,
                        const CallSite& site) {
  if (top.group && !(top.group_policy == policy)) close_group(top);
  if (!top.group) {
    top.group = std::make_shared<Region>(Region::Kind::segment, policy, site.label);
    top.group_policy = policy;
    top.group_first = site.label;
    top.group_count = 0;
    top.group->open(detail::device_of(inputs));
  }
  TensorList outputs = top.group->add_call(layer_function(fn, site), inputs, CallStepInfo{site, -1});
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
  if (!policy.keep.recomputes() || policy.keep.kind == Policy::Kind::budget || detail::inside_first_run())
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
  if (!policy.recomputes() || policy.keep.kind == Policy::Kind::budget || !grad_enabled() || detail::inside_first_run()) {
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
