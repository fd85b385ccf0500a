// The simulator: a plan's actions executed on the cost model (docs/planners.md, "memory model"),
// its peak of live bytes, its time, and the reads back of what it offloads.
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "remat/error.h"
#include "remat/schedule.h"

namespace remat::schedule {

namespace {

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


// One run of simulate_actions: the chain's values, which are live, away or pending, what `live`
// counts of them, and the clocks; one method per kind of action.
class Simulator {
 public:
  Simulator(const ChainCosts& costs, const std::vector<Action>& actions);
  SimResult run();

 private:
  [[noreturn]] void fail(const std::string& why) const;
  void stage_ok() const {
    if (i_ < 0 || i_ >= stages_) fail("stage outside 0.." + std::to_string(stages_ - 1));
  }
  bool finished(int stage) const { return gradient_ >= 0 && stage >= gradient_; }
  void note_peak() {
    result_.peak_bytes = std::max(result_.peak_bytes, live_ - shared_);
    level_[position_] = std::max(level_[position_], live_ - shared_);
  }
  void forward(bool record);
  void sweep_keeps(size_t at);
  void drop();
  void loss();
  void backward();
  void transfer(bool out);

  // Note [a record that keeps its input]. Where stage i's record holds its input a_i itself (a
  // Linear saves it: costs.saved_input_bytes), an offloaded record sends those bytes to the target
  // with it, so while it is away a_i counts only what the record does not hold. Where record i - 1
  // holds the same bytes as its output, the runtime packs them once (every save of a storage shares
  // one packed form): they stay in memory with record i - 1 while it is, and come back once.
  size_t input_away(size_t j) const {
    if (j >= static_cast<size_t>(stages_)) return 0;
    return record_live_[j] && record_away_[j] ? costs_.input_sent_with_record(j) : 0;
  }
  size_t in_memory(size_t j) const { return x_[j] - std::min(x_[j], input_away(j)); }  // of a_j
  size_t counted(size_t j) const {  // what boundary j adds to `live`
    if (!boundary_live_[j] || boundary_away_[j]) return 0;
    return (boundary_pending_[j] ? 0 : in_memory(j)) + owned_[j];
  }
  void gap(size_t j, bool recorded);
  // a record streams less than itself, or counts whole (as one in memory, with what it shares)
  bool streams(size_t i) const { return costs_.streamed(i) < xbar_[i]; }
  size_t pair_bytes(size_t i) const;
  // runs `change`, which touches record i and boundary i + 1 only, and recounts their shared bytes
  template <typename Change>
  void updating(size_t i, const Change& change) {
    shared_ -= pair_bytes(i);
    change();
    shared_ += pair_bytes(i);
  }
  // runs `change`, which touches boundary j only, and recounts its bytes
  template <typename Change>
  void boundary_change(size_t j, const Change& change) {
    live_ -= counted(j);
    if (j == 0)
      change();
    else
      updating(j - 1, change);
    live_ += counted(j);
  }
  void hold(size_t j) {
    boundary_change(j, [&] { boundary_pending_[j] = false; });
  }
  void release(size_t f);  // what a sweep kept with boundary f goes with it

  const ChainCosts& costs_;
  const std::vector<Action>& actions_;
  const int stages_;
  const std::vector<size_t>& x_;
  const std::vector<size_t>& xbar_;
  const bool held_only_;
  std::vector<bool> boundary_live_, record_live_;
  std::vector<bool> boundary_away_, record_away_;  // offloaded (live, but not in memory) until fetched
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
  std::vector<bool> boundary_pending_;
  std::vector<std::vector<size_t>> read_at_;  // swept values by read_by
  size_t values_ = 0;                          // one flag per value: entries of the same value share it
  std::vector<size_t> value_of_;
  std::vector<bool> kept_by_sweep_;
  std::vector<size_t> owned_;
  std::vector<std::vector<size_t>> owned_of_;
  // Note [what the ops between calls save]. The ops just before stage j are recorded where stage j
  // starts a node (its first forward that is not a sweep's step), and what they save
  // (costs.gap_saved) stays until stage j's backward; a value that several gaps save counts once
  // while any of them holds it. It is counted apart from the sweeps' values and the records (a
  // value both keep counts twice: over, never under).
  std::vector<std::vector<size_t>> gap_of_;
  size_t gap_values_ = 0;
  std::vector<size_t> gap_value_;
  std::vector<int> gap_holds_;
  std::vector<bool> gap_recorded_;
  // Note [a record that keeps its output]. Where stage i's record holds its output a_{i+1} (an op
  // that saves its own output, like tanh), the two share saved_output_bytes[i] bytes of storage:
  // while both are in memory those bytes are counted once (`shared` is taken off `live`). When
  // either leaves memory (dropped, offloaded, freed by the backward) the other still holds them.
  size_t shared_ = 0;
  // Note [a streamed record]. An offloaded record is written value by value as its forward saves
  // them and read back value by value as its backward reads them (the runtime reads a node's values
  // at its node as they are needed, under the plan's cap), so from the forward that records it up
  // to its offload, and from its fetch to its backward, it counts costs.streamed(i) bytes, not the
  // whole record (Note [a record read back value by value] in src/autodiff/saved_tensor.cpp). Where
  // that is less than the record, it shares nothing with its output then (what it holds at a time
  // is not known), and a read ahead brings it back whole (charge_reads). `record_bytes` is what each
  // record adds to `live`.
  std::vector<size_t> record_bytes_;
  std::vector<bool> record_streamed_;
  size_t live_ = 0;
  int sweep_from_ = -1;  // the input of the region whose forward sweep runs
  int gradient_ = -1;    // index j of the live gradient d_j; -1 before the loss
  // Note [writes behind the forward pass]. An offload's write goes to one disk worker, queued in
  // the order of the offloads, and runs while the forward pass goes on: the runtime keeps the
  // value in memory until it is written, within the plan's peak (Note [writes behind a plan's
  // peak] in src/saved/offload_store.cpp). The forward compute after a node is its write's window; what
  // the queue runs past the loss is a stall, charged once there: max over the offloaded nodes k of
  // (the writes from k on) - (the forward compute after k). The reads back: Note [reads ahead
  // within the peak] in charge_reads.
  double forward_clock_ = 0;  // forward compute so far (the writes' clock)
  double writes_done_ = 0;    // when the disk worker finishes the writes queued so far
  SimResult result_;
  // per action: the most bytes live at any time during it, and its compute (for charge_reads)
  std::vector<size_t> level_;
  std::vector<double> compute_;
  std::vector<size_t> fetched_;  // a fetch's bytes
  std::vector<size_t> whole_;    // a record's fetch: its bytes beyond the streamed count
  size_t position_ = 0;          // the action running, and its index
  int i_ = 0;
};

Simulator::Simulator(const ChainCosts& costs, const std::vector<Action>& actions)
    : costs_(costs), actions_(actions), stages_(costs.num_stages()), x_(costs.boundary_bytes), xbar_(costs.saved_bytes),
      held_only_(costs.boundaries_counted_when_held) {
  const size_t n = static_cast<size_t>(stages_);
  boundary_live_.assign(n + 1, false);
  record_live_.assign(n, false);
  boundary_away_.assign(n + 1, false);
  record_away_.assign(n, false);
  boundary_pending_.assign(n + 1, false);
  read_at_.resize(n);
  for (size_t v = 0; v < costs.swept_values.size(); ++v)
    read_at_[static_cast<size_t>(costs.swept_values[v].read_by)].push_back(v);
  value_of_ = value_slots(costs.swept_values, values_);
  kept_by_sweep_.assign(values_, false);
  owned_.assign(n + 1, 0);
  owned_of_.resize(n + 1);
  gap_of_.resize(n);
  for (size_t g = 0; g < costs.gap_saved.size(); ++g)
    gap_of_[static_cast<size_t>(costs.gap_saved[g].stage)].push_back(g);
  gap_value_ = value_slots(costs.gap_saved, gap_values_);
  gap_holds_.assign(gap_values_, 0);
  gap_recorded_.assign(n, false);
  record_bytes_.assign(n, 0);
  record_streamed_.assign(n, false);
  boundary_live_[0] = true;
  live_ = x_[0];
  result_.peak_bytes = live_;
  level_.assign(actions.size(), 0);
  compute_.assign(actions.size(), 0.0);
  fetched_.assign(actions.size(), 0);
  whole_.assign(actions.size(), 0);
}

void Simulator::fail(const std::string& why) const {
  std::ostringstream out;
  out << "simulate: action " << position_ << " (" << format_actions({actions_[position_]}) << "): " << why;
  throw Error(out.str());
}

void Simulator::gap(size_t j, bool recorded) {
  if (!costs_.boundaries_counted_when_held || gap_recorded_[j] == recorded) return;
  gap_recorded_[j] = recorded;
  for (size_t g : gap_of_[j]) {
    int& holds = gap_holds_[gap_value_[g]];
    if (recorded ? holds++ == 0 : --holds == 0)
      live_ = recorded ? live_ + costs_.gap_saved[g].bytes : live_ - costs_.gap_saved[g].bytes;
  }
}

size_t Simulator::pair_bytes(size_t i) const {
  if (costs_.saved_output_bytes.empty() || i >= static_cast<size_t>(stages_) || record_streamed_[i]) return 0;
  return record_live_[i] && !record_away_[i] && boundary_live_[i + 1] && !boundary_away_[i + 1] &&
                 !boundary_pending_[i + 1]
             ? std::min(costs_.saved_output_bytes[i], in_memory(i + 1))
             : 0;
}

void Simulator::release(size_t f) {
  boundary_change(f, [&] { owned_[f] = 0; });
  for (size_t v : owned_of_[f]) kept_by_sweep_[value_of_[v]] = false;
  owned_of_[f].clear();
}

SimResult Simulator::run() {
  for (position_ = 0; position_ < actions_.size(); ++position_) {
    const Action& action = actions_[position_];
    i_ = action.index;
    level_[position_] = live_ - shared_;
    switch (action.kind) {
      case ActionKind::forward_no_save:
      case ActionKind::forward_save_all: forward(action.kind == ActionKind::forward_save_all); break;
      case ActionKind::drop: drop(); break;
      case ActionKind::loss: loss(); break;
      case ActionKind::backward: backward(); break;
      case ActionKind::offload:
      case ActionKind::fetch: transfer(action.kind == ActionKind::offload); break;
      default: fail("unknown action kind");
    }
    note_peak();
  }
  const double read_per_byte = costs_.offload_seconds_per_byte - costs_.offload_write_seconds_per_byte;
  charge_reads(costs_.reads_ahead, read_per_byte, actions_, level_, compute_, fetched_, whole_, result_);
  if (gradient_ != 0)
    throw Error(gradient_ < 0 ? "simulate: the plan never runs the loss"
                              : "simulate: the plan ends before stage " + std::to_string(gradient_ - 1) +
                                    "'s backward");
  for (int j = 1; j <= stages_; ++j)
    if (boundary_live_[static_cast<size_t>(j)])
      throw Error("simulate: boundary " + std::to_string(j) + " is still live at the end");
  result_.recomputed_forwards = result_.forward_evaluations - stages_;
  return result_;
}

void Simulator::forward(bool record) {
  stage_ok();
  const int i = i_;
  const size_t at = static_cast<size_t>(i);
  if (!boundary_live_[at]) fail("its input boundary " + std::to_string(i) + " is not live");
  if (boundary_away_[at]) fail("its input boundary " + std::to_string(i) + " is offloaded (not fetched)");
  if (boundary_live_[at + 1]) fail("its output boundary " + std::to_string(i + 1) + " is already live");
  if (finished(i)) fail("stage " + std::to_string(i) + " already ran its backward");
  if (record && record_live_[at]) fail("stage " + std::to_string(i) + " already holds a record");
  const auto next_is = [&](ActionKind kind) {
    return position_ + 1 < actions_.size() && actions_[position_ + 1] == Action{kind, i};
  };
  const bool swept = !record && next_is(ActionKind::drop);
  if (!swept) {
    gap(at, true);
    hold(at);
    if (!record) sweep_from_ = i;
  } else if (held_only_ && sweep_from_ >= 0) {
    sweep_keeps(at);
  }
  boundary_change(at + 1, [&] {
    boundary_live_[at + 1] = true;
    boundary_pending_[at + 1] = held_only_;
  });
  if (record) {
    const bool streamed = streams(at) && next_is(ActionKind::offload);
    record_bytes_[at] = streamed ? costs_.streamed(at) : xbar_[at];
    live_ += record_bytes_[at];
    updating(at, [&] {
      record_live_[at] = true;
      record_streamed_[at] = streamed;
    });
  }
  result_.total_time += costs_.forward_time[at];
  compute_[position_] = costs_.forward_time[at];
  if (gradient_ < 0) forward_clock_ += costs_.forward_time[at];
  ++result_.forward_evaluations;
}

// A sweep's step into stage `at`: what it reads that was made before the sweep's region started is
// kept with the region's input (Note [boundaries counted while held]).
void Simulator::sweep_keeps(size_t at) {
  const size_t f = static_cast<size_t>(sweep_from_);
  for (size_t v : read_at_[at]) {
    if (kept_by_sweep_[value_of_[v]] || costs_.swept_values[v].made_by >= sweep_from_) continue;
    kept_by_sweep_[value_of_[v]] = true;
    boundary_change(f, [&] { owned_[f] += costs_.swept_values[v].bytes; });
    owned_of_[f].push_back(v);
  }
}

void Simulator::drop() {
  const int i = i_;
  if (i <= 0 || i > stages_) fail("boundary outside 1.." + std::to_string(stages_) + " (a_0 is the caller's)");
  const size_t at = static_cast<size_t>(i);
  if (!boundary_live_[at]) fail("boundary " + std::to_string(i) + " is not live");
  if (boundary_away_[at]) fail("boundary " + std::to_string(i) + " is offloaded (not fetched)");
  release(at);
  boundary_change(at, [&] {
    boundary_live_[at] = false;
    boundary_pending_[at] = false;
  });
}

void Simulator::loss() {
  const size_t end = static_cast<size_t>(stages_);
  if (i_ != stages_) fail("the loss index must be L = " + std::to_string(stages_));
  if (gradient_ >= 0) fail("the loss already ran");
  if (!boundary_live_[end]) fail("the chain output is not live");
  result_.write_stall_time = std::max(0.0, writes_done_ - forward_clock_);
  result_.total_time += result_.write_stall_time;
  hold(end);
  live_ += costs_.gradient_bytes(end);
  note_peak();
  release(end);  // a_L freed, d_L stays
  boundary_change(end, [&] { boundary_live_[end] = false; });
  gradient_ = stages_;
}

void Simulator::backward() {
  stage_ok();
  const int i = i_;
  const size_t at = static_cast<size_t>(i);
  if (gradient_ != i + 1)
    fail(gradient_ < 0 ? "the loss has not run" : "the live gradient is d_" + std::to_string(gradient_));
  if (!record_live_[at]) fail("stage " + std::to_string(i) + " has no record");
  if (record_away_[at]) fail("stage " + std::to_string(i) + "'s record is offloaded (not fetched)");
  if (!boundary_live_[at] || boundary_away_[at]) fail("its input boundary " + std::to_string(i) + " is not in memory");
  hold(at);
  live_ += costs_.gradient_bytes(at);
  note_peak();
  live_ -= costs_.gradient_bytes(at + 1) + record_bytes_[at];
  updating(at, [&] {
    record_live_[at] = false;
    record_streamed_[at] = false;
  });
  gap(at, false);
  gradient_ = i;
  result_.total_time += costs_.backward_time[at];
  compute_[position_] = costs_.backward_time[at];
}

// An offload (out) or a fetch of stage i's record if it holds one, else of boundary a_i.
void Simulator::transfer(bool out) {
  const int i = i_;
  if (!costs_.can_offload()) fail("the costs have no offload target (offload_seconds_per_byte < 0)");
  if (i < 0 || i >= stages_) fail("stage or boundary outside 0.." + std::to_string(stages_ - 1));
  const size_t at = static_cast<size_t>(i);
  const bool record = record_live_[at];  // else boundary a_i
  if (!record && (i == 0 || !boundary_live_[at]))
    fail(i == 0 ? "stage 0 holds no record, and a_0 is the caller's"
                : "neither a record of stage " + std::to_string(i) + " nor boundary " + std::to_string(i) + " is live");
  if (!record && boundary_pending_[at]) {  // kept while it is written
    hold(at);
    note_peak();
  }
  std::vector<bool>::reference away = record ? record_away_[at] : boundary_away_[at];
  const size_t bytes = record ? xbar_[at] : x_[at];
  if (away == out) fail(out ? "it is offloaded already" : "it is not offloaded");
  const size_t before = live_;  // a boundary takes what a sweep kept with it along
  if (!record) {
    boundary_change(at, [&] { away = out; });
  } else {
    boundary_change(at, [&] {
      updating(at, [&] {
        away = out;
        record_streamed_[at] = streams(at);
      });
    });
    live_ -= record_bytes_[at];
    record_bytes_[at] = out ? 0 : costs_.streamed(at);
    live_ += record_bytes_[at];
    if (!out) whole_[position_] = xbar_[at] - record_bytes_[at];
  }
  if (!out) {
    fetched_[position_] = live_ - before;
    return;
  }
  const size_t written = bytes + (record ? input_away(at) : 0);  // a record's input goes with it
  result_.offloaded_bytes += written;
  const double write = costs_.offload_write_seconds_per_byte * static_cast<double>(written);
  if (gradient_ >= 0) {  // after the loss: nothing left to hide the write behind
    result_.total_time += write;
    result_.write_stall_time += write;
  } else {
    writes_done_ = std::max(writes_done_, forward_clock_) + write;
  }
}

}  // namespace

SimResult simulate_actions(const ChainCosts& costs, const std::vector<Action>& actions) {
  costs.validate();
  return Simulator(costs, actions).run();
}

SimResult simulate(const ChainCosts& costs, const Plan& plan) {
  costs.validate();
  if (plan.tree.empty()) return simulate_actions(costs, plan.actions);
  std::vector<Action> actions = plan_actions(plan.tree, costs.num_stages());
  if (!plan.actions.empty() && plan.actions != actions)
    throw Error("simulate: the plan's actions differ from those of its tree " + format_tree(plan.tree));
  return simulate_actions(costs, actions);
}

}  // namespace remat::schedule
