// plan_chain: the exact rotor programme for short chains, the grouped planner for long ones.
//
// Note (the grouped planner). The chain is cut into `top_parts` near-equal parts; each part is a
// stage or a group, split recursively into at most `group` parts (stages or smaller groups) with
// all its stages at the same depth. A part offers a
// menu of options; an option is a plan for the part's stages spliced into the enclosing
// sequence, summarised by its time and three byte counts, all relative to what is live before it:
//   fwd  the peak of its forward part;
//   R    what it keeps after its forward part (its output boundary included);
//   bwd  the peak of its backward part, which starts with R live (the output boundary replaced by
//        its gradient) and ends with the gradient of its input.
// A stage has one option, recorded: fwd = R = xbar + x_out, bwd = R + x_in. For a group, a
// rotor-like programme over its parts (the menu programme below) fills, for every sub-range of
// parts and memory m in units of the group's own scale, the least time in top-level mode (as a
// whole chain) and in re-run mode (with the incoming gradient held). Its choices are those of
// rotor with "stage a recorded" replaced by "part a with option k":
//   not last:        m >= max(fwd, bwd) (+ the gradient during fwd in re-run mode),
//                    time_k + C(a+1, b, m - R);
//   last, top level: m >= max(fwd, R + x_out, bwd);   last, re-run: m >= max(fwd + x_out, bwd);
//   region of parts [a, c-1] first: as rotor, with the region's forward sweep over its stages.
// Every byte count is rounded up to the unit and the budget down, so a plan that fits in units
// fits in bytes. The group's options are then read off its tables at 16 memories from its least
// feasible one to its largest (quadratically spaced): the top-level plan of the group (spliced),
// and the group as one region re-run by its re-run plan (R = x_out only). Their summaries are
// computed exactly from the parts' summaries (summarize), and dominated options are dropped. At the top, the same
// programme runs over the top parts at the caller's limit with `slots` units, and the chosen
// options are expanded into a PlanNode tree, which make_plan simulates in exact bytes.
// The work is one programme per group: O(group^3 * group_slots) for the regions plus
// O(group^2 * group_slots * options) for the parts, so O(L * group^2 * group_slots) in all, plus
// O(top_parts^3 * slots) at the top.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "remat/error.h"
#include "remat/schedule.h"

namespace remat::schedule {

namespace {

constexpr double kInfinite = std::numeric_limits<double>::infinity();
constexpr int kLevelsPerMenu = 16;    // memories read off each table (top-level and re-run)
constexpr int16_t kRegionBase = 1024;  // choice >= kRegionBase: a region of choice - kRegionBase parts

// A node of a plan over a group's parts: part `first` with one of its options, or a region of
// parts [first, last] re-run by `children`.
struct PartNode {
  int first = 0, last = 0;
  int option = -1;  // -1: region
  std::vector<PartNode> children;
};

struct Option {
  double time = 0;
  size_t fwd = 0, kept = 0, bwd = 0;  // fwd, R, bwd of the Note
  bool whole_region = false;          // the part as one region, re-run by `plan`
  std::vector<PartNode> plan;         // over the part's own parts (empty for a stage)
};

struct Part {
  int first = 0, last = 0;  // stages
  double forward_time = 0;
  size_t x_in = 0, x_out = 0;
  size_t sweep_first = 0, sweep_later = 0;  // forward sweep peak as a region's first / later part
  std::vector<Option> options;
  std::vector<Part> parts;  // empty for a stage
};

size_t units_of(size_t bytes, size_t unit) { return bytes / unit + (bytes % unit != 0); }
size_t pair_index(int a, int b) { return static_cast<size_t>(b) * (static_cast<size_t>(b) + 1) / 2 + static_cast<size_t>(a); }

struct Summary {
  double time = 0;
  size_t fwd = 0, kept = 0, bwd = 0;
  size_t peak() const { return std::max(fwd, bwd); }
};

size_t region_sweep(const std::vector<Part>& parts, int first, int last) {
  size_t sweep = parts[static_cast<size_t>(first)].sweep_first;
  for (int e = first + 1; e <= last; ++e) sweep = std::max(sweep, parts[static_cast<size_t>(e)].sweep_later);
  return sweep;
}

double region_time(const std::vector<Part>& parts, int first, int last) {
  double time = 0;
  for (int e = first; e <= last; ++e) time += parts[static_cast<size_t>(e)].forward_time;
  return time;
}

// The exact summary of a sequence over parts (top level: no incoming gradient; re-run: the
// gradient of the sequence's output is live from the start and fwd includes it).
Summary summarize(const std::vector<Part>& parts, const std::vector<PartNode>& sequence, bool top) {
  const size_t gradient = top ? 0 : parts[static_cast<size_t>(sequence.back().last)].x_out;
  Summary s;
  size_t live = gradient;
  std::vector<size_t> base;
  std::vector<size_t> own_bwd;
  for (const PartNode& node : sequence) {
    base.push_back(live - gradient);
    if (node.option >= 0) {
      const Option& o = parts[static_cast<size_t>(node.first)].options[static_cast<size_t>(node.option)];
      s.fwd = std::max(s.fwd, live + o.fwd);
      live += o.kept;
      s.time += o.time;
      own_bwd.push_back(o.bwd);
    } else {
      s.fwd = std::max(s.fwd, live + region_sweep(parts, node.first, node.last));
      live += parts[static_cast<size_t>(node.last)].x_out;
      const Summary rerun = summarize(parts, node.children, false);
      s.time += region_time(parts, node.first, node.last) + rerun.time;
      own_bwd.push_back(rerun.peak());
    }
  }
  s.kept = live - gradient;
  for (size_t k = 0; k < sequence.size(); ++k) s.bwd = std::max(s.bwd, base[k] + own_bwd[k]);
  return s;
}

// The menu programme over parts[0..n-1] with sizes in `unit` bytes and memories 0..budget units.
class MenuTable {
 public:
  MenuTable(const std::vector<Part>& parts, size_t unit, int64_t budget)
      : parts_(parts), n_(static_cast<int>(parts.size())), unit_(unit), width_(static_cast<size_t>(budget) + 1) {
    rerun_cost_.assign(pair_index(0, n_) * width_, kInfinite);
    rerun_choice_.assign(pair_index(0, n_) * width_, -1);
    top_cost_.assign(static_cast<size_t>(n_) * width_, kInfinite);
    top_choice_.assign(static_cast<size_t>(n_) * width_, -1);
    for (int length = 1; length <= n_; ++length)
      for (int a = 0; a + length <= n_; ++a) fill(a, a + length - 1, false);
    for (int a = n_ - 1; a >= 0; --a) fill(a, n_ - 1, true);
  }

  int64_t budget() const { return static_cast<int64_t>(width_) - 1; }
  double cost(int a, int b, int64_t m, bool top) const { return m < 0 ? kInfinite : row(a, b, top)[m]; }
  // The least memory with a plan for all parts, or -1.
  int64_t least(bool top) const {
    for (int64_t m = 0; m <= budget(); ++m)
      if (cost(0, n_ - 1, m, top) < kInfinite) return m;
    return -1;
  }

  std::vector<PartNode> build(int a, int b, int64_t m, bool top) const {
    std::vector<PartNode> sequence;
    while (a <= b) {
      const int16_t pick = choice(a, b, m, top);
      if (pick < 0) throw Error("plan_chain: reconstruction reached an infeasible entry (internal error)");
      if (pick < kRegionBase) {
        sequence.push_back(PartNode{a, a, pick, {}});
        m -= static_cast<int64_t>(units_of(option(a, pick).kept, unit_));
        a += 1;
      } else {
        const int c = a + (pick - kRegionBase);
        sequence.push_back(PartNode{a, c - 1, -1, build(a, c - 1, m, false)});
        m -= static_cast<int64_t>(units_of(parts_[static_cast<size_t>(c)].x_in, unit_));
        a = c;
      }
    }
    return sequence;
  }

 private:
  const Option& option(int a, int k) const { return parts_[static_cast<size_t>(a)].options[static_cast<size_t>(k)]; }
  size_t offset(int a, int b, bool top) const { return (top ? static_cast<size_t>(a) : pair_index(a, b)) * width_; }
  const double* row(int a, int b, bool top) const { return (top ? top_cost_ : rerun_cost_).data() + offset(a, b, top); }
  int16_t choice(int a, int b, int64_t m, bool top) const {
    return (top ? top_choice_ : rerun_choice_)[offset(a, b, top) + static_cast<size_t>(m)];
  }

  void fill(int a, int b, bool top) {
    double* best = (top ? top_cost_ : rerun_cost_).data() + offset(a, b, top);
    int16_t* pick = (top ? top_choice_ : rerun_choice_).data() + offset(a, b, top);
    const int64_t budget = this->budget();
    const auto u = [this](size_t bytes) { return static_cast<int64_t>(units_of(bytes, unit_)); };
    const Part& part = parts_[static_cast<size_t>(a)];
    const int64_t gradient = top ? 0 : u(parts_[static_cast<size_t>(b)].x_out);
    const double* rest = a < b ? row(a + 1, b, top) : nullptr;
    for (size_t k = 0; k < part.options.size(); ++k) {
      const Option& o = part.options[k];
      const int64_t fwd = u(o.fwd), kept = u(o.kept), bwd = u(o.bwd), out = u(part.x_out);
      int64_t need = 0;
      if (a < b)
        need = std::max({fwd + gradient, bwd, kept});
      else
        need = top ? std::max({fwd, kept + out, bwd}) : std::max(fwd + out, bwd);
      for (int64_t m = need; m <= budget; ++m) {
        const double total = o.time + (rest ? rest[m - kept] : 0.0);
        if (total < best[m]) {
          best[m] = total;
          pick[m] = static_cast<int16_t>(k);
        }
      }
    }
    size_t sweep = 0;
    double sweep_time = 0;
    for (int c = a + 1; c <= b; ++c) {
      const Part& last = parts_[static_cast<size_t>(c - 1)];
      sweep = std::max(sweep, c - 1 == a ? last.sweep_first : last.sweep_later);
      sweep_time += last.forward_time;
      const int64_t keep = u(parts_[static_cast<size_t>(c)].x_in);
      const double* after = row(c, b, top);
      const double* region = row(a, c - 1, false);
      for (int64_t m = std::max(gradient + u(sweep), keep); m <= budget; ++m) {
        const double total = sweep_time + after[m - keep] + region[m];
        if (total < best[m]) {
          best[m] = total;
          pick[m] = static_cast<int16_t>(kRegionBase + (c - a));
        }
      }
    }
  }

  const std::vector<Part>& parts_;
  int n_;
  size_t unit_, width_;
  std::vector<double> rerun_cost_, top_cost_;
  std::vector<int16_t> rerun_choice_, top_choice_;
};

// Builds the part tree and every group's menu, bottom-up.
class GroupBuilder {
 public:
  GroupBuilder(const ChainCosts& costs, const ChainPlanOptions& options) : costs_(costs), options_(options) {}

  // The levels of groups a part of `stages` stages needs (group^levels >= stages).
  int levels_for(int64_t stages) const {
    int levels = 0;
    for (int64_t span = 1; span < stages; span *= options_.group) ++levels;
    return levels;
  }

  // The top-level parts: `count` near-equal parts, each a stage or a group of its own depth.
  std::vector<Part> split_top(int stages, int count) {
    std::vector<Part> out;
    for (int k = 0; k < count; ++k) {
      const int begin = static_cast<int>(static_cast<int64_t>(stages) * k / count);
      const int end = static_cast<int>(static_cast<int64_t>(stages) * (k + 1) / count) - 1;
      out.push_back(end == begin ? stage(begin) : group(begin, end, levels_for(end - begin + 1)));
    }
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
    if (!options_.progress) return;
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
    p.x_in = x[at];
    p.x_out = x[at + 1];
    p.sweep_first = x[at + 1];
    p.sweep_later = x[at] + x[at + 1];
    Option o;
    o.time = costs_.forward_time[at] + costs_.backward_time[at];
    o.fwd = o.kept = costs_.saved_bytes[at] + x[at + 1];
    o.bwd = o.kept + x[at];
    p.options.push_back(std::move(o));
    return p;
  }

  Part group(int first, int last, int levels);

  const ChainCosts& costs_;
  const ChainPlanOptions& options_;
  int64_t total_ = 1, done_ = 0;
  int reported_ = -1;
};

// Drops options no better than another in every respect (time, fwd, R, bwd).
void prune(std::vector<Option>& options) {
  std::sort(options.begin(), options.end(), [](const Option& l, const Option& r) { return l.time < r.time; });
  std::vector<Option> kept;
  for (Option& o : options) {
    bool dominated = false;
    for (const Option& k : kept)
      if (k.time <= o.time && k.fwd <= o.fwd && k.kept <= o.kept && k.bwd <= o.bwd) dominated = true;
    if (!dominated) kept.push_back(std::move(o));
  }
  options = std::move(kept);
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
  g.forward_time = region_time(parts, 0, n - 1);
  g.sweep_first = region_sweep(parts, 0, n - 1);
  g.sweep_later = std::max(g.sweep_first, parts.front().sweep_later);
  // The scale: the top-level need of every part at its fastest option (options are sorted).
  std::vector<PartNode> fastest;
  for (int e = 0; e < n; ++e) fastest.push_back(PartNode{e, e, 0, {}});
  const Summary all = summarize(parts, fastest, true);
  const size_t scale = std::max({all.fwd, all.kept + g.x_out, all.bwd, size_t{1}});
  const size_t unit = std::max<size_t>(1, units_of(scale, static_cast<size_t>(options_.group_slots)));
  const MenuTable table(parts, unit, static_cast<int64_t>(units_of(scale, unit)));
  for (const bool top : {true, false}) {
    const int64_t least = table.least(top);
    if (least < 0) continue;
    int64_t previous = -1;
    for (int level = 0; level < kLevelsPerMenu; ++level) {
      // denser near the least memory, where the choice matters most
      const int64_t span = table.budget() - least, steps = kLevelsPerMenu - 1;
      const int64_t m = least + span * level * level / (steps * steps);
      if (m == previous) continue;
      previous = m;
      Option o;
      o.plan = table.build(0, n - 1, m, top);
      const Summary s = summarize(parts, o.plan, top);
      o.time = s.time;
      if (top) {
        o.fwd = s.fwd;
        o.kept = s.kept;
        o.bwd = s.bwd;
      } else {
        o.whole_region = true;
        o.time += g.forward_time;
        o.fwd = g.sweep_first;
        o.kept = g.x_out;
        o.bwd = s.peak();
      }
      g.options.push_back(std::move(o));
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
  if (part.parts.empty()) {
    out.push_back(PlanNode::stage(part.first));
    return;
  }
  const Option& o = part.options[static_cast<size_t>(k)];
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
  }
}

// The grouped planner at the top level: the fastest plan within memory_limit, or else the plan
// of least peak it reaches when that fits, or else InfeasibleError.
ChainPlan plan_grouped(const ChainCosts& costs, size_t memory_limit, const ChainPlanOptions& options) {
  const int stages = costs.num_stages();
  GroupBuilder builder(costs, options);
  const int count = std::min(stages, options.top_parts);
  const int levels = builder.levels_for((stages + count - 1) / count);
  builder.set_total(builder.count_top_groups(stages, count) + 1);  // + 1: the top-level programme
  const std::vector<Part> parts = builder.split_top(stages, count);
  const size_t slots = static_cast<size_t>(options.slots);
  const auto plan_at = [&](size_t available) -> std::vector<PlanNode> {
    const size_t unit = std::max<size_t>(1, units_of(available, slots));
    const MenuTable table(parts, unit, static_cast<int64_t>(available / unit));
    const int64_t budget = table.budget();
    std::vector<PlanNode> tree;
    if (table.cost(0, static_cast<int>(parts.size()) - 1, budget, true) == kInfinite) return tree;
    expand_sequence(parts, table.build(0, static_cast<int>(parts.size()) - 1, budget, true), tree);
    return tree;
  };
  const size_t x0 = costs.boundary_bytes[0];
  std::vector<PlanNode> tree = plan_at(memory_limit > x0 ? memory_limit - x0 : 0);
  ChainPlan result;
  result.method = RotorMethod::grouped;
  result.levels = levels;
  if (tree.empty()) {
    // The least peak reachable: the least memory of the programme at the scale of the fastest plan.
    std::vector<PartNode> fastest;
    for (int e = 0; e < static_cast<int>(parts.size()); ++e) fastest.push_back(PartNode{e, e, 0, {}});
    const Summary all = summarize(parts, fastest, true);
    const size_t scale = std::max({all.fwd, all.kept + costs.boundary_bytes.back(), all.bwd, size_t{1}});
    const size_t unit = std::max<size_t>(1, units_of(scale, slots));
    const MenuTable table(parts, unit, static_cast<int64_t>(units_of(scale, unit)));
    const int64_t least = table.least(true);
    if (least < 0) throw Error("plan_chain: the grouped planner found no plan at any memory (internal error)");
    std::vector<PlanNode> smallest;
    expand_sequence(parts, table.build(0, static_cast<int>(parts.size()) - 1, least, true), smallest);
    Plan plan = make_plan(costs, std::move(smallest));
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

// Whether plan_chain runs the exact programme for this chain.
bool runs_exact(const ChainCosts& costs, const ChainPlanOptions& options) {
  const double stages = costs.num_stages();
  const double work = stages * stages * stages * (options.slots + 1.0) / 6;
  return options.method == RotorMethod::exact ||
         (options.method == RotorMethod::automatic && (work <= options.exact_max_work || stages < 2));
}

}  // namespace

std::string ChainPlan::describe() const {
  if (method == RotorMethod::grouped)
    return "grouped rotor (" + std::to_string(levels) + (levels == 1 ? " level" : " levels") + " of groups)";
  return "exact rotor";
}

ChainPlan plan_chain(const ChainCosts& costs, size_t memory_limit, const ChainPlanOptions& options) {
  costs.validate();
  if (options.slots < 1) throw Error("plan_chain: slots must be >= 1, got " + std::to_string(options.slots));
  if (options.group < 2 || options.group > 256)
    throw Error("plan_chain: group must be from 2 to 256, got " + std::to_string(options.group));
  if (options.top_parts < 2 || options.top_parts > 1000)
    throw Error("plan_chain: top_parts must be from 2 to 1000, got " + std::to_string(options.top_parts));
  if (options.group_slots < 8 || options.group_slots > 100000)
    throw Error("plan_chain: group_slots must be from 8 to 100000, got " + std::to_string(options.group_slots));
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
