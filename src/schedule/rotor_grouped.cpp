// plan_chain: the exact rotor programme for short chains, the grouped planner for long ones.
//
// Note [the grouped planner]. The chain is cut into `top_parts` near-equal parts; each part is a
// stage or a group, split recursively into at most `group` parts (stages or smaller groups) with
// all its stages at the same depth. A part offers a menu of options; an option is a plan for the
// part's stages spliced into the enclosing sequence, summarised by its time and three byte counts,
// all relative to what is live before it:
//   fwd  the peak of its forward part;
//   R    what it keeps after its forward part (its output boundary included, an input it
//        offloads taken off: R may be negative);
//   bwd  the peak of its backward part, which starts with R live (the output boundary replaced by
//        its gradient) and ends with the gradient of its input.
// The cost model is the exact programme's (docs/planners.md), gradients g counted or not as
// ChainCosts says. A stage offers two options: recorded, fwd = R = xbar + x_out and
// bwd = xbar + g_out + g_in; and, with an offload target, recorded and offloaded: the same with
// the streamed count for xbar, at c * xbar more time, with R = x_out (the record is out until
// its backward). For a group, a
// rotor-like programme over its parts (the menu programme, rotor_menu.cpp) fills, for every
// sub-range of parts and memory m in units of the group's own scale, the least time in re-run
// mode (with the incoming gradient held), and for every suffix in top-level mode (as a whole
// chain), once without offload and once with. Its choices are those of rotor with "stage a
// recorded" replaced by "part a with option k":
//   not last:        m >= max(fwd, bwd, R) (+ the gradient during fwd in re-run mode),
//                    time_k + C(a+1, b, min(M, m - R));
//   last, top level: m >= max(fwd, R + g_out, bwd);   last, re-run: m >= max(fwd + g_out, bwd);
//   region of parts [a, c-1] first: as rotor, with the region's forward sweep over its stages;
//   top level with offload, the same region with its input offloaded while [c, b] runs (not
//   a_0): c * x_in more time, and [c, b] gets min(M, m - x_c + x_in rounded down).
// An option whose plan offloads is offered in top-level sequences only: a re-run's values are read
// by the backward that follows it at once. A group's top-level plan spliced into a top-level
// sequence is top-level itself, so an offload decision is open to every layer call whatever the
// depth of its group. Every byte count is rounded up to the unit and the budget and an offloaded
// input's credit down, so a plan that fits in units fits in bytes. The group's options are read
// off its tables at 16 memories from each mode's least feasible one to its largest (quadratically
// spaced): its top-level plans (spliced; without and with offload) and the group as one region
// re-run by its re-run plan (R = x_out only). Their summaries are computed exactly from the parts'
// summaries (summarize), and dominated options are dropped (one that offloads never displaces one
// that does not). At the top, the same programme runs over the top parts at the caller's limit
// with `slots` units, and the chosen options are expanded into a PlanNode tree, which make_plan
// simulates in exact bytes.
// The work is one programme per group: O(group^3 * group_slots) for the regions plus
// O(group^2 * group_slots * options) for the parts, so O(L * group^2 * group_slots) in all, plus
// O(top_parts^3 * slots) at the top; the top-level rows with offload add about a fifth.
//
// Note [group menus built side by side]. The top parts' groups depend on their own stages alone,
// and they are most of the work. So the top parts go one at a time to ChainPlanOptions::threads
// threads (the calling one among them), each writing its own slot: the plans are the same on any
// number of threads. Only the calling thread reports progress (counting every thread's groups);
// an exception stops the others taking parts and is rethrown there. A 100,000-stage plan with a
// target takes 0.56x its one-thread time on 2 cores (bench/results/held-plans-100k-2026-12-06.md).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "chain_internal.h"
#include "remat/error.h"
#include "remat/schedule.h"
#include "rotor_menu.h"

namespace remat::schedule {

namespace {

using grouped::Mode;
using grouped::Model;
using grouped::Option;
using grouped::Part;
using grouped::PartNode;
using grouped::Summary;

constexpr double kInfinite = std::numeric_limits<double>::infinity();
constexpr int kLevelsPerMenu = 16;  // memories read off each table (each mode)

// grouped_plans_at_anchors: the levels read off each anchor's top-level table, 64 up to 8,192
// stages and 2^19 / stages above, at least 8 (from 65,536 stages): the candidates' nodes stay about
// as many as at 8,192 stages, and a ChainPlanner of 100,000 stages is built in under 10 s here
// (bench/results/held-plans-100k-2026-12-06.md).
int64_t levels_per_anchor(int stages) { return std::clamp<int64_t>((int64_t{1} << 19) / std::max(stages, 1), 8, 64); }

size_t units_of(size_t bytes, size_t unit) { return bytes / unit + (bytes % unit != 0); }

// The levels of groups of `group` parts that `stages` stages need (group^levels >= stages).
int levels_for(int64_t stages, int group) {
  int levels = 0;
  for (int64_t span = 1; span < stages; span *= group) ++levels;
  return levels;
}

// The index of the fastest option that offloads nothing (one that a re-run may use).
int fastest_in_memory(const Part& part) {
  for (size_t k = 0; k < part.options.size(); ++k)
    if (!part.options[k].offloads) return static_cast<int>(k);
  throw Error("plan_chain: a part has no option without offload (internal error)");
}

// The top-level need of every part at its fastest option without offload: the scale of a table.
size_t fastest_scale(const std::vector<Part>& parts, size_t x_out, const Model& model) {
  std::vector<PartNode> fastest;
  for (int e = 0; e < static_cast<int>(parts.size()); ++e)
    fastest.push_back(PartNode{e, e, fastest_in_memory(parts[static_cast<size_t>(e)]), false, {}});
  const Summary all = grouped::summarize(parts, fastest, true, model);
  const int64_t need = std::max({all.fwd, all.kept + model.gradient(x_out), all.bwd, int64_t{1}});
  return static_cast<size_t>(need);
}

// Builds the part tree and every group's menu, bottom-up.
class GroupBuilder {
 public:
  GroupBuilder(const ChainCosts& costs, const ChainPlanOptions& options) : costs_(costs), options_(options) {
    model_.gradients_counted = costs.gradients_counted;
    model_.offload_seconds_per_byte = costs.offload_seconds_per_byte;
    model_.offload_write_seconds_per_byte = costs.offload_write_seconds_per_byte;
    model_.reads_ahead = costs.reads_ahead;
    model_.loss_floor = static_cast<int64_t>(costs.boundary_bytes.back() + costs.gradient_bytes(costs.boundary_bytes.size() - 1));
  }
  const Model& model() const { return model_; }

  // The levels of groups a part of `stages` stages needs (group^levels >= stages).
  int levels_for(int64_t stages) const { return schedule::levels_for(stages, options_.group); }

  // The top-level parts: `count` near-equal parts, each a stage or a group of its own depth,
  // built on up to `threads` threads (Note [group menus built side by side]).
  std::vector<Part> split_top(int stages, int count, int threads) {
    std::vector<Part> out(static_cast<size_t>(count));
    std::atomic<int> next{0};
    std::mutex failure;
    std::exception_ptr failed;
    const auto build = [&] {
      for (int k = next++; k < count; k = next++) {
        const int begin = static_cast<int>(static_cast<int64_t>(stages) * k / count);
        const int end = static_cast<int>(static_cast<int64_t>(stages) * (k + 1) / count) - 1;
        try {
          out[static_cast<size_t>(k)] = end == begin ? stage(begin) : group(begin, end, levels_for(end - begin + 1));
        } catch (...) {
          const std::lock_guard<std::mutex> lock(failure);
          if (!failed) failed = std::current_exception();
          next = count;
        }
      }
    };
    std::vector<std::thread> helpers;
    for (int t = 1; t < std::min(threads, count); ++t) {
      try {
        helpers.emplace_back(build);
      } catch (const std::system_error&) {  // no more threads to be had: the ones started do the rest
        break;
      }
    }
    build();
    for (std::thread& helper : helpers) helper.join();
    if (failed) std::rethrow_exception(failed);
    return out;
  }
  int64_t count_top_groups(int stages, int count) const {
    int64_t total = 0;
    for (int64_t k = 0; k < count; ++k) {
      const int64_t size = stages * (k + 1) / count - stages * k / count;
      if (size > 1) total += 1 + count_groups(size, levels_for(size));
    }
    return total;
  }

  // The parts of stages [first, last] split at `levels` levels above the stages.
  std::vector<Part> split(int first, int last, int levels) {
    const int stages = last - first + 1;
    if (levels == 0) {
      std::vector<Part> out;
      for (int i = first; i <= last; ++i) out.push_back(stage(i));
      return out;
    }
    int64_t span = 1;
    for (int l = 1; l < levels; ++l) span *= options_.group;
    const int count = static_cast<int>((stages + span - 1) / span);
    std::vector<Part> out;
    for (int k = 0; k < count; ++k) {
      const int begin = first + static_cast<int>(static_cast<int64_t>(stages) * k / count);
      const int end = first + static_cast<int>(static_cast<int64_t>(stages) * (k + 1) / count) - 1;
      out.push_back(end == begin ? stage(begin) : group(begin, end, levels - 1));
    }
    return out;
  }

  // The number of groups split() builds for `stages` stages at `levels` levels.
  int64_t count_groups(int64_t stages, int levels) const {
    if (levels == 0) return 0;
    int64_t span = 1;
    for (int l = 1; l < levels; ++l) span *= options_.group;
    const int64_t count = (stages + span - 1) / span;
    int64_t total = 0;
    for (int64_t k = 0; k < count; ++k) {
      const int64_t size = stages * (k + 1) / count - stages * k / count;
      if (size > 1) total += 1 + count_groups(size, levels - 1);
    }
    return total;
  }
  void set_total(int64_t total) { total_ = std::max<int64_t>(total, 1); }
  void report(int64_t done) {
    if (!options_.progress || std::this_thread::get_id() != caller_) return;
    const int percent = static_cast<int>(100 * done / total_);
    if (percent > reported_) {
      reported_ = percent;
      options_.progress(std::min(1.0, static_cast<double>(done) / static_cast<double>(total_)));
    }
  }
  void finished_group() { report(++done_); }

 private:
  Part stage(int i) const {
    const size_t at = static_cast<size_t>(i);
    const auto& x = costs_.boundary_bytes;
    Part p;
    p.first = p.last = i;
    p.forward_time = costs_.forward_time[at];
    p.backward_time = costs_.backward_time[at];
    p.x_in = x[at];
    p.x_out = x[at + 1];
    p.sweep_first = x[at + 1];
    p.sweep_later = x[at] + x[at + 1];
    const int64_t record = static_cast<int64_t>(costs_.saved_bytes[at]), out = static_cast<int64_t>(x[at + 1]);
    Option o;  // recorded
    o.time = costs_.forward_time[at] + costs_.backward_time[at];
    o.fwd = o.kept = record + out;
    o.at_loss = o.kept - static_cast<int64_t>(costs_.saved_output_bytes.empty() ? 0 : costs_.saved_output_bytes[at]);
    o.bwd = record + model_.gradient(x[at + 1]) + model_.gradient(x[at]);
    p.options.push_back(o);
    if (model_.can_offload()) {  // recorded, the record (and the input it holds) offloaded until its backward
      const size_t input = costs_.input_sent_with_record(at), moved = costs_.saved_bytes[at] + input;
      o.time += model_.read_time(moved);
      o.queue = WriteQueue::single(model_.write_time(moved));
      o.kept = o.at_loss = out - static_cast<int64_t>(input);
      o.read_bytes = moved;
      o.offloads = o.offload_record = true;
      const int64_t streamed = static_cast<int64_t>(costs_.streamed(at));  // Note [a streamed record] in simulate.cpp
      o.fwd = streamed + out;
      o.bwd = streamed + model_.gradient(x[at + 1]) + model_.gradient(x[at]);
      p.options.push_back(o);
    }
    return p;
  }

  Part group(int first, int last, int levels);

  const ChainCosts& costs_;
  const ChainPlanOptions& options_;
  Model model_;
  int64_t total_ = 1;
  std::atomic<int64_t> done_{0};
  int reported_ = -1;  // the calling thread's alone
  std::thread::id caller_ = std::this_thread::get_id();
};

// Drops options no better than another in every respect (time, fwd, R, bwd, and usable where it
// is: one that offloads does not replace one that a re-run may use).
void prune(std::vector<Option>& options) {
  std::stable_sort(options.begin(), options.end(), [](const Option& l, const Option& r) {
    return l.time < r.time || (l.time == r.time && !l.offloads && r.offloads);
  });
  std::vector<Option> kept;
  for (Option& o : options) {
    bool dominated = false;
    for (const Option& k : kept)
      if (k.time <= o.time && k.fwd <= o.fwd && k.kept <= o.kept && k.bwd <= o.bwd && (!k.offloads || o.offloads) &&
          k.queue.no_worse_than(o.queue))
        dominated = true;
    if (!dominated) kept.push_back(std::move(o));
  }
  options = std::move(kept);
}

// The group's option read off its table at memory m: its top-level plan spliced into the enclosing
// sequence, or (re-run mode) the whole group as one region re-run by that plan.
Option option_at(const Part& g, const grouped::MenuTable& table, int64_t m, Mode mode, const Model& model) {
  const std::vector<Part>& parts = g.parts;
  Option o;
  o.plan = table.build(0, static_cast<int>(parts.size()) - 1, m, mode);
  const Summary s = grouped::summarize(parts, o.plan, mode != Mode::rerun, model);
  o.time = s.time;
  if (mode != Mode::rerun) {
    o.fwd = s.fwd;
    o.kept = s.kept;
    o.at_loss = s.at_loss;
    o.bwd = s.bwd;
    o.queue = s.queue;
    o.offloads = grouped::offloads(parts, o.plan);
  } else {
    o.whole_region = true;
    o.time += g.forward_time;
    o.fwd = static_cast<int64_t>(g.sweep_first);
    o.kept = o.at_loss = static_cast<int64_t>(g.x_out);
    o.bwd = s.peak();
  }
  return o;
}

Part GroupBuilder::group(int first, int last, int levels) {
  Part g;
  g.first = first;
  g.last = last;
  g.parts = split(first, last, levels);
  const std::vector<Part>& parts = g.parts;
  const int n = static_cast<int>(parts.size());
  g.x_in = parts.front().x_in;
  g.x_out = parts.back().x_out;
  g.forward_time = grouped::region_time(parts, 0, n - 1);
  g.sweep_first = grouped::region_sweep(parts, 0, n - 1);
  g.sweep_later = std::max(g.sweep_first, parts.front().sweep_later);
  const size_t scale = fastest_scale(parts, g.x_out, model_);
  const size_t unit = std::max<size_t>(1, units_of(scale, static_cast<size_t>(options_.group_slots)));
  // Each part's sizes are rounded up to the unit, so the fastest plan may need up to one unit a
  // part more than its scale: a group with no plan at its scale is read at that much more.
  const int64_t scaled = static_cast<int64_t>(units_of(scale, unit));
  std::optional<grouped::MenuTable> fitted;
  fitted.emplace(parts, model_, unit, scaled, true, true);
  if (fitted->least(Mode::top) < 0 && fitted->least(Mode::rerun) < 0) fitted.emplace(parts, model_, unit, scaled + n, true, true);
  const grouped::MenuTable& table = *fitted;
  for (const Mode mode : {Mode::top, Mode::rerun, Mode::top_offload}) {
    if (mode == Mode::top_offload && !model_.can_offload()) continue;
    const int64_t least = table.least(mode);
    if (least < 0) continue;
    int64_t previous = -1;
    for (int level = 0; level < kLevelsPerMenu; ++level) {
      // denser near the least memory, where the choice matters most
      const int64_t span = table.budget() - least, steps = kLevelsPerMenu - 1;
      const int64_t m = least + span * level * level / (steps * steps);
      if (m == previous) continue;
      previous = m;
      g.options.push_back(option_at(g, table, m, mode, model_));
    }
  }
  if (g.options.empty()) throw Error("plan_chain: a group has no plan (internal error)");
  prune(g.options);
  finished_group();
  return g;
}

// Fine plan nodes of a part's option (spliced into `out`).
void expand_sequence(const std::vector<Part>& parts, const std::vector<PartNode>& sequence, std::vector<PlanNode>& out);

PlanNode make_region(int first, int last, std::vector<PlanNode> children) {
  // A region re-run by one region over the same stages is that region.
  if (children.size() == 1 && children[0].kind == PlanNode::Kind::region && children[0].first == first &&
      children[0].last == last)
    return std::move(children[0]);
  return PlanNode::region(first, last, std::move(children));
}

void expand_option(const Part& part, int k, std::vector<PlanNode>& out) {
  const Option& o = part.options[static_cast<size_t>(k)];
  if (part.parts.empty()) {
    out.push_back(PlanNode::stage(part.first));
    if (o.offload_record) out.back().offload();
    return;
  }
  if (!o.whole_region) {
    expand_sequence(part.parts, o.plan, out);
    return;
  }
  std::vector<PlanNode> children;
  expand_sequence(part.parts, o.plan, children);
  out.push_back(make_region(part.first, part.last, std::move(children)));
}

void expand_sequence(const std::vector<Part>& parts, const std::vector<PartNode>& sequence, std::vector<PlanNode>& out) {
  for (const PartNode& node : sequence) {
    if (node.option >= 0) {
      expand_option(parts[static_cast<size_t>(node.first)], node.option, out);
      continue;
    }
    std::vector<PlanNode> children;
    expand_sequence(parts, node.children, children);
    out.push_back(make_region(parts[static_cast<size_t>(node.first)].first, parts[static_cast<size_t>(node.last)].last,
                              std::move(children)));
    if (node.offloaded) out.back().offload();  // its input goes to the offload target
  }
}


// The least peak reachable: the plans of least memory of the top-level programme at the scale of
// the fastest plan. Both top-level modes with an offload target: the plan that offloads has the
// least memory in units, but the one that does not may simulate lower in bytes; the caller takes
// the lower, so an offload target never raises the least peak.
std::vector<std::vector<PlanNode>> least_peak_trees(const std::vector<Part>& parts, const Model& model,
                                                    const ChainCosts& costs, size_t slots) {
  const size_t scale = fastest_scale(parts, costs.boundary_bytes.back(), model);
  const size_t unit = std::max<size_t>(1, units_of(scale, slots));
  const int last = static_cast<int>(parts.size()) - 1;
  const grouped::MenuTable table(parts, model, unit, static_cast<int64_t>(units_of(scale, unit) + parts.size()), true,
                                 model.can_offload());
  std::vector<std::vector<PlanNode>> out;
  for (const Mode at : {Mode::top, Mode::top_offload}) {
    if (at == Mode::top_offload && !model.can_offload()) continue;
    const int64_t least = table.least(at);
    if (least < 0) continue;
    out.emplace_back();
    expand_sequence(parts, table.build(0, last, least, at), out.back());
  }
  return out;
}

// The grouped planner's top level: the group menus, built once, and the top-level programme's
// parts and mode; plan_grouped and grouped_plans_at_anchors read plans off its tables.
struct TopLevel {
  GroupBuilder builder;
  std::vector<Part> parts;
  Mode mode;
  int last;
  size_t slots;
  size_t x0;  // the chain input, held beside the table's memory

  TopLevel(const ChainCosts& costs, const ChainPlanOptions& options) : builder(costs, options) {
    const int stages = costs.num_stages();
    const int count = std::min(stages, options.top_parts);
    builder.set_total(builder.count_top_groups(stages, count) + 1);  // + 1: the top-level programme
    parts = builder.split_top(stages, count, planning_threads(options));
    mode = model().can_offload() ? Mode::top_offload : Mode::top;
    last = static_cast<int>(parts.size()) - 1;
    slots = static_cast<size_t>(options.slots);
    x0 = costs.boundary_bytes[0];
  }
  const Model& model() const { return builder.model(); }
  // The top-level table within `limit` bytes: slots units of what the chain input leaves.
  grouped::MenuTable table(size_t limit) const {
    const size_t available = limit > x0 ? limit - x0 : 0;
    const size_t unit = std::max<size_t>(1, units_of(available, slots));
    return grouped::MenuTable(parts, model(), unit, static_cast<int64_t>(available / unit), mode == Mode::top,
                              mode == Mode::top_offload);
  }
  // The plan of `table` at memory level m.
  std::vector<PlanNode> expand(const grouped::MenuTable& table, int64_t m) const {
    std::vector<PlanNode> tree;
    expand_sequence(parts, table.build(0, last, m, mode), tree);
    return tree;
  }
};

// The grouped planner at the top level: the fastest plan within memory_limit, or else the plan
// of least peak it reaches (or, where that is cheap, the exact least-peak plan) when that fits,
// or else InfeasibleError.
ChainPlan plan_grouped(const ChainCosts& costs, size_t memory_limit, const ChainPlanOptions& options) {
  const int stages = costs.num_stages();
  const TopLevel top(costs, options);
  const grouped::MenuTable table = top.table(memory_limit);
  std::vector<PlanNode> tree;
  if (table.cost(0, top.last, table.budget(), top.mode) != kInfinite) tree = top.expand(table, table.budget());
  ChainPlan result;
  result.method = RotorMethod::grouped;
  result.levels = grouped_levels(stages, options);
  if (tree.empty()) {
    std::optional<Plan> lowest;
    for (std::vector<PlanNode>& smallest : least_peak_trees(top.parts, top.model(), costs, top.slots)) {
      Plan candidate = make_plan(costs, std::move(smallest));
      if (!lowest || candidate.predicted_peak_bytes < lowest->predicted_peak_bytes) lowest = std::move(candidate);
    }
    if (!lowest) throw Error("plan_chain: the grouped planner found no plan at any memory (internal error)");
    Plan plan = std::move(*lowest);
    if (plan.predicted_peak_bytes > memory_limit && least_peak_is_cheap(stages, options)) {
      // Below the grouped planner's least peak: the exact least-peak plan, where it is cheap
      // (its regions need not end on part boundaries, so it may reach lower).
      Plan least = plan_min_memory(costs);
      if (least.predicted_peak_bytes < plan.predicted_peak_bytes) {
        plan = std::move(least);
        result.method = RotorMethod::exact;
        result.levels = 0;
      }
    }
    if (plan.predicted_peak_bytes > memory_limit) {
      std::ostringstream out;
      out << "plan_chain: memory limit " << memory_limit << " bytes is below the smallest peak the grouped planner "
          << "reaches, " << plan.predicted_peak_bytes << " bytes, for this chain of " << stages << " stages";
      throw InfeasibleError(out.str(), plan.predicted_peak_bytes);
    }
    result.plan = std::move(plan);
  } else {
    result.plan = make_plan(costs, std::move(tree));
  }
  if (result.plan.predicted_peak_bytes > memory_limit)
    throw Error("plan_chain: the plan's simulated peak " + std::to_string(result.plan.predicted_peak_bytes) +
                " exceeds the limit " + std::to_string(memory_limit) + " (internal error)");
  if (options.progress) options.progress(1.0);
  return result;
}

}  // namespace

// Whether the exact least-peak programme (min_feasible_memory: L^2 entries, L^3 / 6 steps)
// is cheap next to the grouped planner: the same work bound as the exact rotor programme's,
// without its memory units (about 840 stages with the default bound, under a second).
bool least_peak_is_cheap(int stages, const ChainPlanOptions& options) {
  const double l = stages;
  return l * l * l / 6 <= options.exact_max_work;
}

int grouped_levels(int stages, const ChainPlanOptions& options) {
  const int64_t count = std::max(1, std::min(stages, options.top_parts));
  return levels_for((stages + count - 1) / count, options.group);
}

bool runs_exact(const ChainCosts& costs, const ChainPlanOptions& options) {
  const double stages = costs.num_stages();
  const double work = stages * stages * stages * (options.slots + 1.0) / 6;
  return options.method == RotorMethod::exact ||
         (options.method == RotorMethod::automatic && (work <= options.exact_max_work || stages < 2));
}

void grouped_plans_at_anchors(const ChainCosts& costs, const ChainPlanOptions& options,
                              const std::function<void(std::vector<PlanNode>)>& sink) {
  costs.validate();
  const int stages = costs.num_stages();
  if (stages < 2) throw Error("plan_chain: the grouped planner needs at least 2 stages");
  const TopLevel top(costs, options);
  size_t least = SIZE_MAX;
  for (std::vector<PlanNode>& tree : least_peak_trees(top.parts, top.model(), costs, top.slots)) {
    least = std::min(least, make_plan(costs, tree).predicted_peak_bytes);
    sink(std::move(tree));
  }
  const int64_t levels = levels_per_anchor(stages);
  for (size_t anchor = plan_save_all(costs).predicted_peak_bytes;; anchor /= 2) {
    const grouped::MenuTable table = top.table(std::max(anchor, least));
    // every stride-th level down from the anchor's: a rule that does not depend on any limit
    const int64_t stride = std::max<int64_t>(1, (table.budget() + levels - 1) / levels);
    double previous = kInfinite;
    for (int64_t m = table.budget(); m >= 0; m -= stride) {
      const double cost = table.cost(0, top.last, m, top.mode);
      if (cost == kInfinite) break;
      if (cost == previous) continue;
      previous = cost;
      sink(top.expand(table, m));
    }
    if (anchor <= least) break;
  }
  if (options.progress) options.progress(1.0);
}

std::string ChainPlan::describe() const {
  if (method == RotorMethod::grouped)
    return "grouped rotor (" + std::to_string(levels) + (levels == 1 ? " level" : " levels") + " of groups)";
  return "exact rotor";
}

int planning_threads(const ChainPlanOptions& options) {
  if (options.threads > 0) return options.threads;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

void check_options(const ChainPlanOptions& options) {
  if (options.slots < 1) throw Error("plan_chain: slots must be >= 1, got " + std::to_string(options.slots));
  if (options.group < 2 || options.group > 256)
    throw Error("plan_chain: group must be from 2 to 256, got " + std::to_string(options.group));
  if (options.top_parts < 2 || options.top_parts > 1000)
    throw Error("plan_chain: top_parts must be from 2 to 1000, got " + std::to_string(options.top_parts));
  if (options.group_slots < 8 || options.group_slots > 100000)
    throw Error("plan_chain: group_slots must be from 8 to 100000, got " + std::to_string(options.group_slots));
  if (options.threads < 0 || options.threads > 1024)
    throw Error("plan_chain: threads must be from 0 (the hardware's cores) to 1024, got " +
                std::to_string(options.threads));
}

ChainPlan plan_chain(const ChainCosts& costs, size_t memory_limit, const ChainPlanOptions& options) {
  costs.validate();
  check_options(options);
  const bool exact = runs_exact(costs, options);
  if (!exact && costs.num_stages() < 2) throw Error("plan_chain: the grouped planner needs at least 2 stages");
  if (!exact && options.method == RotorMethod::automatic) {
    // Save-all, when it fits, is the fastest plan (every forward runs once): the exact optimum.
    Plan save_all = plan_save_all(costs);
    if (save_all.predicted_peak_bytes <= memory_limit) {
      if (options.progress) options.progress(1.0);
      return ChainPlan{std::move(save_all), RotorMethod::exact, 0};
    }
  }
  if (exact) {
    ChainPlan result;
    result.plan = plan_rotor(costs, memory_limit, options.slots);
    result.method = RotorMethod::exact;
    return result;
  }
  return plan_grouped(costs, memory_limit, options);
}

size_t chain_min_feasible_memory(const ChainCosts& costs, const ChainPlanOptions& options) {
  try {
    return plan_chain(costs, 0, options).plan.predicted_peak_bytes;  // a chain of empty values fits in 0 bytes
  } catch (const InfeasibleError& e) {
    if (options.progress) options.progress(1.0);  // done: the grouped planner's infeasible path reports no end
    return e.min_feasible_bytes;
  }
}

}  // namespace remat::schedule
