// Heterogeneous chains: plan trees, their action lists, the simulator and the fixed plans
// (save-all, every-layer, every-k, uniform segments). The costs' validation: chain_costs.cpp.
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "chain_internal.h"
#include "remat/schedule.h"

namespace remat::schedule {

namespace {

std::string node_name(const PlanNode& node) {
  std::ostringstream out;
  if (node.kind == PlanNode::Kind::stage)
    out << "stage " << node.first;
  else
    out << "region [" << node.first << ".." << node.last << "]";
  return out.str();
}

void validate_sequence(const std::vector<PlanNode>& sequence, int first, int last, bool in_region) {
  const std::string where = in_region ? "validate_tree: children of region [" + std::to_string(first) + ".." +
                                            std::to_string(last) + "]"
                                      : "validate_tree";
  if (sequence.empty()) invalid(where, "empty sequence (stages " + std::to_string(first) + ".." +
                                           std::to_string(last) + " not covered)");
  int expected = first;
  for (const PlanNode& node : sequence) {
    if (node.first != expected)
      invalid(where, node_name(node) + " starts at " + std::to_string(node.first) + ", expected stage " +
                         std::to_string(expected));
    if (node.kind == PlanNode::Kind::stage) {
      if (node.last != node.first) invalid(where, "a stage node needs first == last, got " + node_name(node));
      if (!node.children.empty()) invalid(where, node_name(node) + " has children");
    } else {
      if (node.last < node.first || node.last > last) invalid(where, node_name(node) + " is out of range");
      if (node.children.size() == 1 && node.children[0].kind == PlanNode::Kind::region &&
          node.children[0].first == node.first && node.children[0].last == node.last)
        invalid(where, node_name(node) + " has a single child region over the same stages");
      validate_sequence(node.children, node.first, node.last, true);
    }
    if (node.offloaded && in_region) invalid(where, node_name(node) + " is offloaded inside a region (only top-level nodes are)");
    if (node.offloaded && node.kind == PlanNode::Kind::region && node.first == 0)
      invalid(where, node_name(node) + " is offloaded, but its input is the chain input a_0, which the caller holds");
    expected = node.last + 1;
  }
  if (expected != last + 1)
    invalid(where, "covers stages " + std::to_string(first) + ".." + std::to_string(expected - 1) + ", expected " +
                       std::to_string(first) + ".." + std::to_string(last));
}

// Appends the actions of a sequence over stages [first, last]; top: the chain's top level.
void append_sequence(const std::vector<PlanNode>& sequence, int last, bool top, std::vector<Action>& out) {
  for (const PlanNode& node : sequence) {
    if (node.kind == PlanNode::Kind::stage) {
      out.push_back({ActionKind::forward_save_all, node.first});
    } else {
      out.push_back({ActionKind::forward_no_save, node.first});
      for (int j = node.first + 1; j <= node.last; ++j) {
        out.push_back({ActionKind::forward_no_save, j});
        out.push_back({ActionKind::drop, j});
      }
    }
    if (node.offloaded) out.push_back({ActionKind::offload, node.first});
  }
  out.push_back(top ? Action{ActionKind::loss, last + 1} : Action{ActionKind::drop, last + 1});
  for (size_t k = sequence.size(); k-- > 0;) {
    const PlanNode& node = sequence[k];
    if (k + 1 < sequence.size()) out.push_back({ActionKind::drop, node.last + 1});
    if (node.offloaded) out.push_back({ActionKind::fetch, node.first});
    if (node.kind == PlanNode::Kind::stage)
      out.push_back({ActionKind::backward, node.first});
    else
      append_sequence(node.children, node.last, false, out);
  }
}

// Note [reads ahead within the peak]. A read back runs on the disk worker that wrote the value. Its
// node needs it at its fetch; without reads ahead it starts there and the step waits for all of it.
// With them (ChainCosts::reads_ahead, what the runtime of a budget plan does), the read of an
// offloaded value starts at the earliest action of the backward from which the bytes live during
// every action up to the fetch, plus the value, stay within the plan's peak (so the peak is the
// same with reads ahead as without), but not before the loss (the writes have the worker until
// then) nor before the fetch ahead of it (one read in flight, in the order of the fetches). The
// compute from there to its fetch is its window; it is charged the stall, max(0, read - window).
// The windows of successive reads do not overlap, so no read waits behind another, and the whole
// search is one pass over the backward. A record counted streamed from its fetch on (Note [a
// streamed record]) is read ahead whole or not at all: only where its `whole` bytes beyond the
// streamed count also fit from the fetch through its backward.
void charge_reads(bool ahead, double read_per_byte, const std::vector<Action>& actions,
                  const std::vector<size_t>& level, const std::vector<double>& compute,
                  const std::vector<size_t>& fetched, const std::vector<size_t>& whole, SimResult& result) {
  size_t earliest = actions.size();  // no read before the loss
  for (size_t p = 0; p < actions.size(); ++p) {
    const ActionKind kind = actions[p].kind;
    if (kind == ActionKind::loss || (kind == ActionKind::offload && earliest < actions.size())) earliest = p + 1;
    if (kind != ActionKind::fetch) continue;
    ReadAhead read;
    read.index = actions[p].index;
    read.bytes = fetched[p] + whole[p];
    read.fetch_action = read.start_action = static_cast<int>(p);
    read.read_time = read_per_byte * static_cast<double>(read.bytes);
    bool fits = true;  // the whole record through its backward
    for (size_t q = p; whole[p] > 0 && q < actions.size() && fits; ++q) {
      fits = level[q] + whole[p] <= result.peak_bytes;
      if (actions[q] == Action{ActionKind::backward, read.index}) break;
    }
    size_t start = p;
    while (ahead && fits && start > earliest && level[start - 1] + read.bytes <= result.peak_bytes) {
      --start;
      read.window += compute[start];
    }
    read.start_action = static_cast<int>(start);
    read.stall = std::max(0.0, read.read_time - read.window);
    result.read_time += read.stall;
    result.total_time += read.stall;
    result.reads.push_back(read);
    earliest = std::max(earliest, p + 1);
  }
}

// Each entry's value slot: its value where >= 0, else a slot of its own after the largest;
// `count` gets the number of slots (ChainCosts::SweptValue, ChainCosts::GapSaved).
template <typename Entry>
std::vector<size_t> value_slots(const std::vector<Entry>& entries, size_t& count) {
  count = 0;
  for (const Entry& e : entries) count = std::max(count, static_cast<size_t>(std::max(e.value, -1) + 1));
  std::vector<size_t> slots(entries.size());
  for (size_t i = 0; i < entries.size(); ++i)
    slots[i] = entries[i].value >= 0 ? static_cast<size_t>(entries[i].value) : count++;
  return slots;
}

}  // namespace

void validate_tree(const std::vector<PlanNode>& tree, int num_stages) {
  if (num_stages < 1) invalid("validate_tree", "num_stages must be >= 1, got " + std::to_string(num_stages));
  validate_sequence(tree, 0, num_stages - 1, false);
}

std::vector<Action> plan_actions(const std::vector<PlanNode>& tree, int num_stages) {
  validate_tree(tree, num_stages);
  std::vector<Action> out;
  append_sequence(tree, num_stages - 1, true, out);
  return out;
}

SimResult simulate_actions(const ChainCosts& costs, const std::vector<Action>& actions) {
  costs.validate();
  const int stages = costs.num_stages();
  const auto& x = costs.boundary_bytes;
  const auto& xbar = costs.saved_bytes;
  std::vector<bool> boundary_live(static_cast<size_t>(stages) + 1, false);
  std::vector<bool> record_live(static_cast<size_t>(stages), false);
  // offloaded (live, but not in memory) until fetched
  std::vector<bool> boundary_away(static_cast<size_t>(stages) + 1, false);
  std::vector<bool> record_away(static_cast<size_t>(stages), false);
  // Note [boundaries counted while held]. With costs.boundaries_counted_when_held a boundary that
  // a forward made is pending (live, but a temporary that no saved value holds yet, and not
  // counted) until an action keeps it (`hold`): the forward of the next stage, unless that forward
  // records nothing and the next action drops the boundary (a region's forward sweep, whose
  // values pass from one layer call to the next unsaved), the loss, a backward or an offload. A
  // pending boundary dropped (a re-run's last output, a sweep's values) never counted. What a
  // sweep from a_f passing from stage j-1 to stage j reads that was made before stage f
  // (costs.swept_values: the step's token ids, a position embedding added after the next layer
  // call) is no temporary: the region keeps it with its input a_f until a_f is dropped
  // (`owned[f]`); it counts there once, however often a re-run's sweep reads it again.
  std::vector<bool> boundary_pending(static_cast<size_t>(stages) + 1, false);
  std::vector<std::vector<size_t>> read_at(static_cast<size_t>(stages));  // swept values by read_by
  for (size_t v = 0; v < costs.swept_values.size(); ++v) read_at[static_cast<size_t>(costs.swept_values[v].read_by)].push_back(v);
  size_t values = 0;  // one flag per value: entries of the same value share it
  const std::vector<size_t> value_of = value_slots(costs.swept_values, values);
  std::vector<bool> kept_by_sweep(values, false);
  std::vector<size_t> owned(static_cast<size_t>(stages) + 1, 0);
  std::vector<std::vector<size_t>> owned_of(static_cast<size_t>(stages) + 1);
  // Note [a record that keeps its input]. Where stage i's record holds its input a_i itself (a
  // Linear saves it: costs.saved_input_bytes), an offloaded record sends those bytes to the target
  // with it, so while it is away a_i counts only what the record does not hold. Where record i - 1
  // holds the same bytes as its output, the runtime packs them once (every save of a storage shares
  // one packed form): they stay in memory with record i - 1 while it is, and come back once.
  const bool held_only = costs.boundaries_counted_when_held;
  const auto input_away = [&](size_t j) -> size_t {
    if (j >= static_cast<size_t>(stages)) return 0;
    return record_live[j] && record_away[j] ? costs.input_sent_with_record(j) : 0;
  };
  const auto in_memory = [&](size_t j) { return x[j] - std::min(x[j], input_away(j)); };  // of a_j
  const auto counted = [&](size_t j) -> size_t {  // what boundary j adds to `live`
    if (!boundary_live[j] || boundary_away[j]) return 0;
    return (boundary_pending[j] ? 0 : in_memory(j)) + owned[j];
  };
  boundary_live[0] = true;
  size_t live = x[0];
  int sweep_from = -1;  // the input of the region whose forward sweep runs
  // Note [what the ops between calls save]. The ops just before stage j are recorded where stage j
  // starts a node (its first forward that is not a sweep's step), and what they save
  // (costs.gap_saved) stays until stage j's backward; a value that several gaps save counts once
  // while any of them holds it. It is counted apart from the sweeps' values and the records (a
  // value both keep counts twice: over, never under).
  std::vector<std::vector<size_t>> gap_of(static_cast<size_t>(stages));
  for (size_t g = 0; g < costs.gap_saved.size(); ++g) gap_of[static_cast<size_t>(costs.gap_saved[g].stage)].push_back(g);
  size_t gap_values = 0;
  const std::vector<size_t> gap_value = value_slots(costs.gap_saved, gap_values);
  std::vector<int> gap_holds(gap_values, 0);
  std::vector<bool> gap_recorded(static_cast<size_t>(stages), false);
  const auto gap = [&](size_t j, bool recorded) {
    if (!costs.boundaries_counted_when_held || gap_recorded[j] == recorded) return;
    gap_recorded[j] = recorded;
    for (size_t g : gap_of[j]) {
      int& holds = gap_holds[gap_value[g]];
      if (recorded ? holds++ == 0 : --holds == 0) live = recorded ? live + costs.gap_saved[g].bytes : live - costs.gap_saved[g].bytes;
    }
  };
  // Note [a record that keeps its output]. Where stage i's record holds its output a_{i+1} (an op
  // that saves its own output, like tanh), the two share saved_output_bytes[i] bytes of storage:
  // while both are in memory those bytes are counted once (`shared` is taken off `live`). When
  // either leaves memory (dropped, offloaded, freed by the backward) the other still holds them.
  size_t shared = 0;
  // Note [a streamed record]. An offloaded record is written value by value as its forward saves
  // them and read back value by value as its backward reads them (the runtime reads a node's values
  // at its node as they are needed, under the plan's cap), so from the forward that records it up
  // to its offload, and from its fetch to its backward, it counts costs.streamed(i) bytes, not the
  // whole record (Note [a record read back value by value] in src/autodiff/saved_tensor.cpp). Where
  // that is less than the record, it shares nothing with its output then (what it holds at a time
  // is not known), and a read ahead brings it back whole (charge_reads). `record_bytes` is what each
  // record adds to `live`.
  // a record streams less than itself, or counts whole (as one in memory, with what it shares)
  const auto streams = [&](size_t i) { return costs.streamed(i) < xbar[i]; };
  std::vector<size_t> record_bytes(static_cast<size_t>(stages), 0);
  std::vector<bool> record_streamed(static_cast<size_t>(stages), false);
  const auto pair_bytes = [&](size_t i) -> size_t {
    if (costs.saved_output_bytes.empty() || i >= static_cast<size_t>(stages) || record_streamed[i]) return 0;
    return record_live[i] && !record_away[i] && boundary_live[i + 1] && !boundary_away[i + 1] &&
                   !boundary_pending[i + 1]
               ? std::min(costs.saved_output_bytes[i], in_memory(i + 1))
               : 0;
  };
  // runs `change`, which touches record i and boundary i + 1 only, and recounts their shared bytes
  const auto updating = [&](size_t i, const auto& change) {
    shared -= pair_bytes(i);
    change();
    shared += pair_bytes(i);
  };
  // runs `change`, which touches boundary j only, and recounts its bytes
  const auto boundary_change = [&](size_t j, const auto& change) {
    live -= counted(j);
    if (j == 0)
      change();
    else
      updating(j - 1, change);
    live += counted(j);
  };
  const auto hold = [&](size_t j) { boundary_change(j, [&] { boundary_pending[j] = false; }); };
  const auto release = [&](size_t f) {  // what a sweep kept with boundary f goes with it
    boundary_change(f, [&] { owned[f] = 0; });
    for (size_t v : owned_of[f]) kept_by_sweep[value_of[v]] = false;
    owned_of[f].clear();
  };
  int gradient = -1;  // index j of the live gradient d_j; -1 before the loss
  // Note [writes behind the forward pass]. An offload's write goes to one disk worker, queued in
  // the order of the offloads, and runs while the forward pass goes on: the runtime keeps the
  // value in memory until it is written, within the plan's peak (Note [writes behind a plan's
  // peak] in src/saved/offload_store.cpp). The forward compute after a node is its write's window; what
  // the queue runs past the loss is a stall, charged once there: max over the offloaded nodes k of
  // (the writes from k on) - (the forward compute after k). The reads back: Note [reads ahead
  // within the peak] in charge_reads.
  double forward_clock = 0;  // forward compute so far (the writes' clock)
  double writes_done = 0;    // when the disk worker finishes the writes queued so far
  SimResult result;
  result.peak_bytes = live;
  const double read_per_byte = costs.offload_seconds_per_byte - costs.offload_write_seconds_per_byte;
  // per action: the most bytes live at any time during it, and its compute (for charge_reads)
  std::vector<size_t> level(actions.size(), 0);
  std::vector<double> compute(actions.size(), 0.0);
  std::vector<size_t> fetched(actions.size(), 0);  // a fetch's bytes
  std::vector<size_t> whole(actions.size(), 0);    // a record's fetch: its bytes beyond the streamed count
  for (size_t position = 0; position < actions.size(); ++position) {
    const Action& action = actions[position];
    const int i = action.index;
    size_t& step_level = level[position];
    step_level = live - shared;
    const auto fail = [&](const std::string& why) {
      std::ostringstream out;
      out << "simulate: action " << position << " (" << format_actions({action}) << "): " << why;
      throw Error(out.str());
    };
    const auto stage_ok = [&]() {
      if (i < 0 || i >= stages) fail("stage outside 0.." + std::to_string(stages - 1));
    };
    const auto finished = [&](int stage) { return gradient >= 0 && stage >= gradient; };
    switch (action.kind) {
      case ActionKind::forward_no_save:
      case ActionKind::forward_save_all: {
        stage_ok();
        const size_t at = static_cast<size_t>(i);
        if (!boundary_live[at]) fail("its input boundary " + std::to_string(i) + " is not live");
        if (boundary_away[at]) fail("its input boundary " + std::to_string(i) + " is offloaded (not fetched)");
        if (boundary_live[at + 1]) fail("its output boundary " + std::to_string(i + 1) + " is already live");
        if (finished(i)) fail("stage " + std::to_string(i) + " already ran its backward");
        const bool record = action.kind == ActionKind::forward_save_all;
        if (record && record_live[at]) fail("stage " + std::to_string(i) + " already holds a record");
        const bool swept = !record && position + 1 < actions.size() && actions[position + 1] == Action{ActionKind::drop, i};
        if (!swept) {
          gap(at, true);
          hold(at);
          if (!record) sweep_from = i;
        } else if (held_only && sweep_from >= 0) {
          const size_t f = static_cast<size_t>(sweep_from);
          for (size_t v : read_at[at]) {
            if (kept_by_sweep[value_of[v]] || costs.swept_values[v].made_by >= sweep_from) continue;
            kept_by_sweep[value_of[v]] = true;
            boundary_change(f, [&] { owned[f] += costs.swept_values[v].bytes; });
            owned_of[f].push_back(v);
          }
        }
        boundary_change(at + 1, [&] {
          boundary_live[at + 1] = true;
          boundary_pending[at + 1] = held_only;
        });
        if (record) {
          const bool streamed = streams(at) && position + 1 < actions.size() &&
                                actions[position + 1] == Action{ActionKind::offload, i};
          record_bytes[at] = streamed ? costs.streamed(at) : xbar[at];
          live += record_bytes[at];
          updating(at, [&] {
            record_live[at] = true;
            record_streamed[at] = streamed;
          });
        }
        result.total_time += costs.forward_time[at];
        compute[position] = costs.forward_time[at];
        if (gradient < 0) forward_clock += costs.forward_time[at];
        ++result.forward_evaluations;
        break;
      }
      case ActionKind::drop:
        if (i <= 0 || i > stages) fail("boundary outside 1.." + std::to_string(stages) + " (a_0 is the caller's)");
        if (!boundary_live[static_cast<size_t>(i)]) fail("boundary " + std::to_string(i) + " is not live");
        if (boundary_away[static_cast<size_t>(i)]) fail("boundary " + std::to_string(i) + " is offloaded (not fetched)");
        release(static_cast<size_t>(i));
        boundary_change(static_cast<size_t>(i), [&] {
          boundary_live[static_cast<size_t>(i)] = false;
          boundary_pending[static_cast<size_t>(i)] = false;
        });
        break;
      case ActionKind::loss:
        if (i != stages) fail("the loss index must be L = " + std::to_string(stages));
        if (gradient >= 0) fail("the loss already ran");
        if (!boundary_live[static_cast<size_t>(stages)]) fail("the chain output is not live");
        result.write_stall_time = std::max(0.0, writes_done - forward_clock);
        result.total_time += result.write_stall_time;
        hold(static_cast<size_t>(stages));
        live += costs.gradient_bytes(static_cast<size_t>(stages));
        result.peak_bytes = std::max(result.peak_bytes, live - shared);
        step_level = std::max(step_level, live - shared);
        release(static_cast<size_t>(stages));  // a_L freed, d_L stays
        boundary_change(static_cast<size_t>(stages), [&] { boundary_live[static_cast<size_t>(stages)] = false; });
        gradient = stages;
        break;
      case ActionKind::backward: {
        stage_ok();
        const size_t at = static_cast<size_t>(i);
        if (gradient != i + 1)
          fail(gradient < 0 ? "the loss has not run" : "the live gradient is d_" + std::to_string(gradient));
        if (!record_live[at]) fail("stage " + std::to_string(i) + " has no record");
        if (record_away[at]) fail("stage " + std::to_string(i) + "'s record is offloaded (not fetched)");
        if (!boundary_live[at] || boundary_away[at]) fail("its input boundary " + std::to_string(i) + " is not in memory");
        hold(at);
        live += costs.gradient_bytes(at);
        result.peak_bytes = std::max(result.peak_bytes, live - shared);
        step_level = std::max(step_level, live - shared);
        live -= costs.gradient_bytes(at + 1) + record_bytes[at];
        updating(at, [&] {
          record_live[at] = false;
          record_streamed[at] = false;
        });
        gap(at, false);
        gradient = i;
        result.total_time += costs.backward_time[at];
        compute[position] = costs.backward_time[at];
        break;
      }
      case ActionKind::offload:
      case ActionKind::fetch: {
        if (!costs.can_offload()) fail("the costs have no offload target (offload_seconds_per_byte < 0)");
        if (i < 0 || i >= stages) fail("stage or boundary outside 0.." + std::to_string(stages - 1));
        const size_t at = static_cast<size_t>(i);
        const bool record = record_live[at];  // else boundary a_i
        if (!record && (i == 0 || !boundary_live[at]))
          fail(i == 0 ? "stage 0 holds no record, and a_0 is the caller's" : "neither a record of stage " +
                        std::to_string(i) + " nor boundary " + std::to_string(i) + " is live");
        if (!record && boundary_pending[at]) {  // kept while it is written
          hold(at);
          result.peak_bytes = std::max(result.peak_bytes, live - shared);
          step_level = std::max(step_level, live - shared);
        }
        std::vector<bool>::reference away = record ? record_away[at] : boundary_away[at];
        const size_t bytes = record ? xbar[at] : x[at];
        const bool out = action.kind == ActionKind::offload;
        if (away == out) fail(out ? "it is offloaded already" : "it is not offloaded");
        const size_t before = live;  // a boundary takes what a sweep kept with it along
        if (!record) {
          boundary_change(at, [&] { away = out; });
        } else {
          boundary_change(at, [&] {
            updating(at, [&] {
              away = out;
              record_streamed[at] = streams(at);
            });
          });
          live -= record_bytes[at];
          record_bytes[at] = out ? 0 : costs.streamed(at);
          live += record_bytes[at];
          if (!out) whole[position] = xbar[at] - record_bytes[at];
        }
        if (out) {
          const size_t written = bytes + (record ? input_away(at) : 0);  // a record's input goes with it
          result.offloaded_bytes += written;
          const double write = costs.offload_write_seconds_per_byte * static_cast<double>(written);
          if (gradient >= 0) {  // after the loss: nothing left to hide the write behind
            result.total_time += write;
            result.write_stall_time += write;
          } else {
            writes_done = std::max(writes_done, forward_clock) + write;
          }
        } else {
          fetched[position] = live - before;
        }
        break;
      }
      default:
        fail("unknown action kind");
    }
    result.peak_bytes = std::max(result.peak_bytes, live - shared);
    step_level = std::max(step_level, live - shared);
  }
  charge_reads(costs.reads_ahead, read_per_byte, actions, level, compute, fetched, whole, result);
  if (gradient != 0)
    throw Error(gradient < 0 ? "simulate: the plan never runs the loss"
                                             : "simulate: the plan ends before stage " + std::to_string(gradient - 1) +
                                                   "'s backward");
  for (int j = 1; j <= stages; ++j)
    if (boundary_live[static_cast<size_t>(j)])
      throw Error("simulate: boundary " + std::to_string(j) + " is still live at the end");
  result.recomputed_forwards = result.forward_evaluations - stages;
  return result;
}

SimResult simulate(const ChainCosts& costs, const Plan& plan) {
  costs.validate();
  if (plan.tree.empty()) return simulate_actions(costs, plan.actions);
  std::vector<Action> actions = plan_actions(plan.tree, costs.num_stages());
  if (!plan.actions.empty() && plan.actions != actions)
    throw Error("simulate: the plan's actions differ from those of its tree " +
                                format_tree(plan.tree));
  return simulate_actions(costs, actions);
}

Plan make_plan(const ChainCosts& costs, std::vector<PlanNode> tree) {
  Plan plan;
  plan.actions = plan_actions(tree, costs.num_stages());
  plan.tree = std::move(tree);
  const SimResult result = simulate_actions(costs, plan.actions);
  plan.predicted_peak_bytes = result.peak_bytes;
  plan.predicted_time = result.total_time;
  plan.reads = result.reads;
  return plan;
}

Plan plan_save_all(const ChainCosts& costs) {
  costs.validate();
  std::vector<PlanNode> tree;
  for (int i = 0; i < costs.num_stages(); ++i) tree.push_back(PlanNode::stage(i));
  return make_plan(costs, std::move(tree));
}

Plan plan_every_k(const ChainCosts& costs, int k) {
  costs.validate();
  if (k < 1) invalid("plan_every_k", "k must be >= 1, got " + std::to_string(k));
  const int stages = costs.num_stages();
  std::vector<PlanNode> tree;
  for (int first = 0; first < stages; first += k) {
    const int last = std::min(stages - 1, first + k - 1);
    std::vector<PlanNode> children;
    for (int i = first; i <= last; ++i) children.push_back(PlanNode::stage(i));
    tree.push_back(PlanNode::region(first, last, std::move(children)));
  }
  return make_plan(costs, std::move(tree));
}

Plan plan_every_layer(const ChainCosts& costs) { return plan_every_k(costs, 1); }

Plan plan_uniform_segments(const ChainCosts& costs, int segments) {
  costs.validate();
  const int stages = costs.num_stages();
  if (segments < 1 || segments > stages)
    invalid("plan_uniform_segments", "segments must be in 1.." + std::to_string(stages) + ", got " +
                                         std::to_string(segments));
  const int size = stages / segments;
  std::vector<PlanNode> tree;
  int next = 0;
  for (int segment = 0; segment + 1 < segments; ++segment, next += size) {
    std::vector<PlanNode> children;
    for (int i = next; i < next + size; ++i) children.push_back(PlanNode::stage(i));
    tree.push_back(PlanNode::region(next, next + size - 1, std::move(children)));
  }
  for (int i = next; i < stages; ++i) tree.push_back(PlanNode::stage(i));
  return make_plan(costs, std::move(tree));
}

std::string format_tree(const std::vector<PlanNode>& tree) {
  std::string out;
  for (const PlanNode& node : tree) {
    if (!out.empty()) out += ' ';
    if (node.kind == PlanNode::Kind::stage)
      out += 'S' + std::to_string(node.first);
    else
      out += "R[" + std::to_string(node.first) + ".." + std::to_string(node.last) + "](" +
             format_tree(node.children) + ")";
    if (node.offloaded) out += "+o";
  }
  return out;
}

std::string format_actions(const std::vector<Action>& actions) {
  std::string out;
  for (const Action& action : actions) {
    if (!out.empty()) out += ' ';
    switch (action.kind) {
      case ActionKind::forward_no_save: out += "Fn"; break;
      case ActionKind::forward_save_all: out += "Fa"; break;
      case ActionKind::backward: out += "B"; break;
      case ActionKind::drop: out += "D"; break;
      case ActionKind::loss: out += "L"; break;
      case ActionKind::offload: out += "O"; break;
      case ActionKind::fetch: out += "I"; break;
      default: out += "?"; break;
    }
    if (action.kind != ActionKind::loss) out += std::to_string(action.index);
  }
  return out;
}

}  // namespace remat::schedule
