// The rotor dynamic programme (optimal time within a memory limit) and the least-peak plan.
// The recurrences and the discretisation are documented in include/remat/schedule.h.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include "remat/error.h"
#include <string>
#include <vector>

#include "chain_internal.h"
#include "remat/schedule.h"
#include "write_queue.h"

namespace remat::schedule {

namespace {

constexpr double kInfinite = std::numeric_limits<double>::infinity();
constexpr double kMaxTableEntries = 1.5e8;

// Index of sub-chain [a, b] (a <= b) in a triangular table.
size_t pair_index(int a, int b) { return static_cast<size_t>(b) * (static_cast<size_t>(b) + 1) / 2 + static_cast<size_t>(a); }

// Sizes in whole memory units (rounded up) and the budget in units (rounded down).
struct UnitCosts {
  std::vector<int64_t> x, xbar;
  std::vector<int64_t> xs;      // ChainCosts::streamed: an offloaded record's count (Note [a streamed record])
  std::vector<int64_t> g;       // gradient buffers d_j (x, or 0 when not counted)
  std::vector<int64_t> x_down;  // boundaries rounded down: what offloading one frees, at least
  std::vector<int64_t> in_down;  // ChainCosts::saved_input_bytes rounded down (0 where none)
  int64_t budget = 0;
};

UnitCosts to_units(const ChainCosts& costs, size_t available, size_t unit) {
  UnitCosts units;
  const auto round_up = [unit](size_t bytes) { return static_cast<int64_t>(bytes / unit + (bytes % unit != 0)); };
  for (size_t bytes : costs.boundary_bytes) {
    units.x.push_back(round_up(bytes));
    units.g.push_back(costs.gradients_counted ? units.x.back() : 0);
    units.x_down.push_back(static_cast<int64_t>(bytes / unit));
  }
  for (size_t bytes : costs.saved_bytes) units.xbar.push_back(round_up(bytes));
  for (size_t i = 0; i < costs.saved_bytes.size(); ++i) units.xs.push_back(round_up(costs.streamed(i)));
  units.in_down.assign(costs.saved_bytes.size(), 0);
  for (size_t i = 0; i < costs.saved_input_bytes.size(); ++i)
    units.in_down[i] = static_cast<int64_t>(costs.saved_input_bytes[i] / unit);
  units.budget = static_cast<int64_t>(available / unit);
  return units;
}

// C(a, b, m) for re-run sub-chains (all a <= b) and for the top-level suffixes [a, L-1].
// choice: -1 infeasible, 0 = stage a with recording first, k >= 1 = region [a, a+k-1] first;
// top-level entries also say whether that first node is offloaded (Note [offload in the plan]).
class RotorTable {
 public:
  // reads_ahead: price a read at the stall Note [a read behind the next backward] estimates.
  RotorTable(const ChainCosts& costs, const UnitCosts& units, bool reads_ahead)
      : costs_(costs), units_(units), stages_(costs.num_stages()), width_(static_cast<size_t>(units.budget) + 1),
        reads_ahead_(reads_ahead && costs.can_offload()) {
    const size_t pairs = pair_index(0, stages_);
    rerun_cost_.assign(pairs * width_, kInfinite);
    rerun_choice_.assign(pairs * width_, -1);
    top_cost_.assign(static_cast<size_t>(stages_) * width_, kInfinite);
    top_choice_.assign(static_cast<size_t>(stages_) * width_, -1);
    top_offloaded_.assign(costs.can_offload() ? static_cast<size_t>(stages_) * width_ : 0, 0);
    top_queue_.assign(costs.can_offload() ? static_cast<size_t>(stages_) * width_ : 0, WriteQueue{});
    top_loss_.assign(reads_ahead_ ? static_cast<size_t>(stages_) * width_ : 0, 0);
    for (int length = 1; length <= stages_; ++length)
      for (int a = 0; a + length <= stages_; ++a) fill(a, a + length - 1, false);
    for (int a = stages_ - 1; a >= 0; --a) fill(a, stages_ - 1, true);
  }

  double cost(int a, int b, int64_t m, bool top) const {
    if (m < 0) return kInfinite;
    return top ? top_cost_[row(a, b, true) + static_cast<size_t>(m)] : rerun_cost_[row(a, b, false) + static_cast<size_t>(m)];
  }
  int choice(int a, int b, int64_t m, bool top) const {
    return top ? top_choice_[row(a, b, true) + static_cast<size_t>(m)] : rerun_choice_[row(a, b, false) + static_cast<size_t>(m)];
  }

  // The plan (a sequence over [a, b]) behind cost(a, b, m, top).
  std::vector<PlanNode> build(int a, int b, int64_t m, bool top) const {
    std::vector<PlanNode> sequence;
    while (a <= b) {
      const int pick = choice(a, b, m, top);
      if (pick < 0) throw Error("plan_rotor: reconstruction reached an infeasible entry (internal error)");
      const size_t at = static_cast<size_t>(a);
      const bool out = top && !top_offloaded_.empty() && top_offloaded_[row(a, b, true) + static_cast<size_t>(m)];
      if (pick == 0) {
        sequence.push_back(PlanNode::stage(a));
        m = out ? std::min(units_.budget, m - units_.x[at + 1] + units_.in_down[at]) : m - units_.x[at + 1] - units_.xbar[at];
        a += 1;
      } else {
        const int c = a + pick;
        sequence.push_back(PlanNode::region(a, c - 1, build(a, c - 1, m, false)));
        m = out ? freed(m, c, a) : m - units_.x[static_cast<size_t>(c)];
        a = c;
      }
      if (out) sequence.back().offload();
    }
    return sequence;
  }

 private:
  size_t row(int a, int b, bool top) const {
    return (top ? static_cast<size_t>(a) : pair_index(a, b)) * width_;
  }

  // The memory left to the suffix from c when the region [a, c-1] before it is offloaded: a_a
  // leaves memory (rounded down), a_c stays; at most the budget (a larger m gains nothing).
  int64_t freed(int64_t m, int c, int a) const {
    return std::min(units_.budget, m - units_.x[static_cast<size_t>(c)] + units_.x_down[static_cast<size_t>(a)]);
  }

  // A node's transfer of `bytes`: the read (in full; its stall: read_stall) and the write, queued.
  double read_time(size_t bytes) const {
    return (costs_.offload_seconds_per_byte - costs_.offload_write_seconds_per_byte) * static_cast<double>(bytes);
  }

  // Note [a read behind the next backward]. With reads ahead, simulate() starts the read of an
  // offloaded top-level node at the earliest action after the loss (and after the fetch before it)
  // from which the live bytes plus the value stay within the plan's peak, and charges its stall,
  // max(0, read - the compute from there to the fetch). Just before the fetch of node a run the
  // backward of the next top-level node and the drop of the boundary between them. When that next
  // node is a stage c (recorded, offloaded or not), what lives during them is known: the bytes
  // held before c, a_c, c's record, d_{c+1} and d_c (the drop's, fewer). At the loss the bytes
  // held before c and the whole suffix's kept bytes are live with d_L (top_loss_: the suffix's
  // share, exact bytes, a record that holds its output counted once, as simulate does). So where
  // record + d_{c+1} + d_c + a's value <= the suffix's share at the loss, the read fits behind
  // backward(c) within the plan's peak (which is at least the loss's), and the programme charges
  // max(0, read - ub[c]): never less than simulate's stall, which may find a longer window. When
  // the next node is a region (whose re-run's peak the table does not keep), or there is none,
  // or the loss leaves no such room, the read is charged in full.
  double read_stall(size_t bytes, int c, int64_t next) const {
    const double read = read_time(bytes);
    const size_t entry = row(std::min(c, stages_ - 1), stages_ - 1, true) + static_cast<size_t>(next);
    if (!reads_ahead_ || c >= stages_ || top_choice_[entry] != 0) return read;
    const size_t at = static_cast<size_t>(c);
    const size_t backward = costs_.saved_bytes[at] + costs_.gradient_bytes(at + 1) + costs_.gradient_bytes(at);
    return static_cast<int64_t>(backward + bytes) <= top_loss_[entry] ? std::max(0.0, read - costs_.backward_time[at])
                                                                      : read;
  }
  // The suffix's share of the live bytes at the loss, for the entries of row c (top_loss_).
  const int64_t* loss_row(int c) const { return top_loss_.empty() ? nullptr : top_loss_.data() + row(c, stages_ - 1, true); }
  int64_t loss_of(int c, int64_t m) const {
    if (c >= stages_) return static_cast<int64_t>(costs_.gradient_bytes(static_cast<size_t>(stages_)));
    return top_loss_.empty() ? 0 : loss_row(c)[m];
  }
  // What a recorded (not offloaded) stage i and its output share (counted once by simulate).
  int64_t shared(size_t i) const {
    return static_cast<int64_t>(costs_.saved_output_bytes.empty() ? 0 : costs_.saved_output_bytes[i]);
  }
  double write_time(size_t bytes) const { return costs_.offload_write_seconds_per_byte * static_cast<double>(bytes); }
  const WriteQueue* queue_row(int a) const { return top_queue_.data() + row(a, stages_ - 1, true); }

  // The entry row (a, b) being filled: per memory m the least time, its choice (c - a; 0: stage a
  // recorded), whether it offloads its first node and, at the top level with offload, its writes.
  struct Row {
    double* best;
    int16_t* pick;
    uint8_t* out;       // top level with offload only
    WriteQueue* queue;  // likewise
    int64_t* loss;      // likewise, with reads ahead: the suffix's share at the loss (top_loss_)
    // kTracked: the row has out and queue (known to the loops, which it keeps free of branches)
    template <bool kTracked>
    void offer(int64_t m, double total, int choice, bool offloaded, const WriteQueue* writes, int64_t at_loss = 0) {
      if (!(total < best[m])) return;
      best[m] = total;
      pick[m] = static_cast<int16_t>(choice);
      if constexpr (kTracked) {
        out[m] = offloaded ? 1 : 0;
        queue[m] = *writes;
        if (loss) loss[m] = at_loss;
      }
    }
  };
  Row row_of(int a, int b, bool top) {
    uint8_t* out = top && costs_.can_offload() ? top_offloaded_.data() + row(a, b, true) : nullptr;
    return {(top ? top_cost_.data() : rerun_cost_.data()) + row(a, b, top),
            (top ? top_choice_.data() : rerun_choice_.data()) + row(a, b, top), out,
            out ? top_queue_.data() + row(a, b, true) : nullptr,
            out && !top_loss_.empty() ? top_loss_.data() + row(a, b, true) : nullptr};
  }

  // C(a, a, m): stage a recorded (at the top level, possibly offloaded while the loss runs).
  void fill_single(int a, Row& r) {
    const auto& x = units_.x;
    const auto& xbar = units_.xbar;
    const auto& g = units_.g;
    const size_t at = static_cast<size_t>(a);
    const double uf = costs_.forward_time[at], ub = costs_.backward_time[at];
    const int64_t need = xbar[at] + g[at + 1] + std::max(x[at + 1], g[at]);
    const WriteQueue none;
    const int64_t output = static_cast<int64_t>(costs_.boundary_bytes[at + 1]) + loss_of(a + 1, 0);
    const int64_t kept = output + static_cast<int64_t>(costs_.saved_bytes[at]) - shared(at);
    for (int64_t m = std::max<int64_t>(need, 0); m <= units_.budget; ++m) {
      if (r.out) r.offer<true>(m, uf + ub, 0, false, &none, kept);
      else r.offer<false>(m, uf + ub, 0, false, &none);
    }
    if (!r.out) return;
    const int64_t xs = units_.xs[at];  // offloaded, the record streams (Note [a streamed record] in simulate.cpp)
    const int64_t lower = std::max({x[at + 1] + xs, xs + g[at + 1] + g[at], x[at + 1] + g[at + 1]});
    const size_t moved = costs_.saved_bytes[at] + costs_.input_sent_with_record(at);  // with the input it holds
    const WriteQueue alone = WriteQueue{}.ahead(write_time(moved), 0.0);  // the loss is next
    const double total = uf + read_time(moved) + alone.stall() + ub;
    for (int64_t m = std::max<int64_t>(lower, 0); m < std::min(need, units_.budget + 1); ++m)
      r.offer<true>(m, total, 0, true, &alone, output);
  }

  void fill(int a, int b, bool top) {
    Row r = row_of(a, b, top);
    if (a == b) return fill_single(a, r);
    if (r.out) {
      fill_recorded<true>(a, b, top, r);
      fill_regions<true>(a, b, top, r);
    } else {
      fill_recorded<false>(a, b, top, r);
      fill_regions<false>(a, b, top, r);
    }
  }

  // Stage a with recording, then [a+1, b] with its record and output held (or, at the top level
  // with offload, its record offloaded: only its output held). An infinite entry stays infinite
  // through the sums and never wins a comparison.
  template <bool kTracked>
  void fill_recorded(int a, int b, bool top, Row& r) {
    const auto& x = units_.x;
    const auto& xbar = units_.xbar;
    const auto& g = units_.g;
    const size_t at = static_cast<size_t>(a);
    const double uf = costs_.forward_time[at], ub = costs_.backward_time[at];
    const int64_t held = x[at + 1] + xbar[at];
    const int64_t need = std::max(xbar[at] + g[at + 1] + g[at], held);
    const double* after_stage = row_data(a + 1, b, top);
    const WriteQueue* after_queue = kTracked ? queue_row(a + 1) : nullptr;
    const int64_t output = static_cast<int64_t>(costs_.boundary_bytes[at + 1]);
    const int64_t record = static_cast<int64_t>(costs_.saved_bytes[at]) - shared(at);
    for (int64_t m = need; m <= units_.budget; ++m)
      r.offer<kTracked>(m, uf + after_stage[m - held] + ub, 0, false, kTracked ? after_queue + (m - held) : nullptr,
                        kTracked ? output + record + loss_of(a + 1, m - held) : 0);
    if constexpr (!kTracked) return;
    // the record takes the input it holds along (ChainCosts::saved_input_bytes): [a+1, b] gets it too
    // streamed (Note [a streamed record] in simulate.cpp): read ahead only where the whole record fits
    const size_t moved = costs_.saved_bytes[at] + costs_.input_sent_with_record(at);
    const double write = write_time(moved);
    const int64_t xs = units_.xs[at];
    for (int64_t m = std::max(xs + g[at + 1] + g[at], x[at + 1] + xs); m <= units_.budget; ++m) {
      const int64_t left = std::min(units_.budget, m - x[at + 1] + units_.in_down[at]);
      const double read = m >= need ? read_stall(moved, a + 1, left) : read_time(moved);
      const WriteQueue& rest = after_queue[left];
      const WriteQueue ahead = rest.ahead(write, forward_after_[at + 1]);
      r.offer<true>(m, uf + read + after_stage[left] + (ahead.stall() - rest.stall()) + ub, 0, true, &ahead,
                    output + loss_of(a + 1, left));
    }
  }

  // Region [a, c-1], then [c, b] holding a_c (or, at the top level with offload and a > 0, with
  // a_a offloaded while [c, b] runs), then the region's re-run.
  template <bool kTracked>
  void fill_regions(int a, int b, bool top, Row& r) {
    const auto& x = units_.x;
    const size_t at = static_cast<size_t>(a);
    const int64_t budget = units_.budget;
    const int64_t gradient = top ? 0 : units_.g[static_cast<size_t>(b) + 1];
    const double write = write_time(costs_.boundary_bytes[at]);
    int64_t sweep_peak = 0;
    double sweep_time = 0;
    for (int c = a + 1; c <= b; ++c) {
      const size_t k = static_cast<size_t>(c - 1);
      sweep_peak = std::max(sweep_peak, (c - 1 > a ? x[k] : 0) + x[k + 1]);
      sweep_time += costs_.forward_time[k];
      const int64_t keep = x[static_cast<size_t>(c)];
      const double* after_region = row_data(c, b, top);
      const double* region = row_data(a, c - 1, false);
      const WriteQueue* region_queue = kTracked ? queue_row(c) : nullptr;
      const int64_t output = static_cast<int64_t>(costs_.boundary_bytes[static_cast<size_t>(c)]);
      for (int64_t m = std::max(gradient + sweep_peak, keep); m <= budget; ++m)
        r.offer<kTracked>(m, sweep_time + after_region[m - keep] + region[m], c - a, false,
                          kTracked ? region_queue + (m - keep) : nullptr, kTracked ? output + loss_of(c, m - keep) : 0);
      if (!kTracked || a == 0) continue;
      const int64_t input = static_cast<int64_t>(costs_.boundary_bytes[at]);  // out at the loss
      for (int64_t m = std::max(sweep_peak, keep); m <= budget; ++m) {
        const double read = read_stall(costs_.boundary_bytes[at], c, freed(m, c, a));
        const WriteQueue& rest = region_queue[freed(m, c, a)];
        const WriteQueue ahead = rest.ahead(write, forward_after_[static_cast<size_t>(c)]);
        r.offer<true>(m, sweep_time + read + after_region[freed(m, c, a)] + (ahead.stall() - rest.stall()) + region[m],
                      c - a, true, &ahead, output - input + loss_of(c, freed(m, c, a)));
      }
    }
  }

  const double* row_data(int a, int b, bool top) const {
    return (top ? top_cost_.data() : rerun_cost_.data()) + row(a, b, top);
  }

  const ChainCosts& costs_;
  const UnitCosts& units_;
  int stages_;
  size_t width_;
  std::vector<double> rerun_cost_, top_cost_;
  std::vector<int16_t> rerun_choice_, top_choice_;  // c - a < L <= 17320 under kMaxTableEntries
  std::vector<uint8_t> top_offloaded_;              // 1: the top-level choice offloads its node
  std::vector<WriteQueue> top_queue_;               // the writes of the top-level entry's plan
  std::vector<int64_t> top_loss_;                   // with reads ahead: Note [a read behind the next backward]
  std::vector<double> forward_after_ = forward_after(costs_);
  bool reads_ahead_;
};

// The least-peak plan, exact bytes; among least-peak choices the least time (per subproblem).
class MinPeak {
 public:
  explicit MinPeak(const ChainCosts& costs) : costs_(costs), stages_(costs.num_stages()) {
    rerun_.assign(pair_index(0, stages_), Entry{});
    top_.assign(static_cast<size_t>(stages_), Entry{});
    for (int length = 1; length <= stages_; ++length)
      for (int a = 0; a + length <= stages_; ++a) rerun_[pair_index(a, a + length - 1)] = solve(a, a + length - 1, false);
    for (int a = stages_ - 1; a >= 0; --a) top_[static_cast<size_t>(a)] = solve(a, stages_ - 1, true);
  }

  size_t top_peak() const { return top_[0].peak; }

  std::vector<PlanNode> build(int a, int b, bool top) const {
    std::vector<PlanNode> sequence;
    while (a <= b) {
      const Entry& e = entry(a, b, top);
      if (e.choice == 0) {
        sequence.push_back(PlanNode::stage(a));
      } else {
        sequence.push_back(PlanNode::region(a, a + e.choice - 1, build(a, a + e.choice - 1, false)));
      }
      if (e.offloaded) sequence.back().offload();
      a += e.choice == 0 ? 1 : e.choice;
    }
    return sequence;
  }

 private:
  struct Entry {
    size_t peak = std::numeric_limits<size_t>::max();
    double time = kInfinite;
    int choice = -1;
    bool offloaded = false;  // top level: the first node is offloaded
    WriteQueue queue;        // top level: the writes of the plan
    bool better_than(const Entry& other) const {
      return peak < other.peak || (peak == other.peak && time < other.time);
    }
  };

  const Entry& entry(int a, int b, bool top) const {
    return top ? top_[static_cast<size_t>(a)] : rerun_[pair_index(a, b)];
  }

  Entry solve(int a, int b, bool top) const {
    const auto& x = costs_.boundary_bytes;
    const auto& xbar = costs_.saved_bytes;
    const size_t at = static_cast<size_t>(a);
    const double uf = costs_.forward_time[at], ub = costs_.backward_time[at];
    Entry best;
    const bool offload = top && costs_.can_offload();
    const double read_per_byte = costs_.offload_seconds_per_byte - costs_.offload_write_seconds_per_byte;
    const double write_per_byte = costs_.offload_write_seconds_per_byte;
    // `node` offloads `bytes` in front of the suffix `rest`, with `window` of forward compute left
    const auto offloaded = [&](Entry& node, const Entry& rest, size_t bytes, double window) {
      node.queue = rest.queue.ahead(write_per_byte * static_cast<double>(bytes), window);
      node.time += read_per_byte * static_cast<double>(bytes) + node.queue.stall() - rest.queue.stall();
      node.offloaded = true;
    };
    const auto g = [this](size_t j) { return costs_.gradient_bytes(j); };
    if (a == b) {
      best.peak = xbar[at] + g(at + 1) + std::max(x[at + 1], g(at));
      best.time = uf + ub;
      best.choice = 0;
      if (offload) {  // the last stage's record offloaded while the loss runs
        Entry candidate;
        const size_t xs = costs_.streamed(at);  // Note [a streamed record] in simulate.cpp
        candidate.peak = std::max({x[at + 1] + xs, xs + g(at + 1) + g(at), x[at + 1] + g(at + 1)});
        candidate.time = uf + ub;
        candidate.choice = 0;
        offloaded(candidate, Entry{}, xbar[at] + costs_.input_sent_with_record(at), 0.0);
        if (candidate.peak < best.peak) best = candidate;
      }
      return best;
    }
    const Entry& rest = entry(a + 1, b, top);
    best.peak = std::max(x[at + 1] + xbar[at] + rest.peak, xbar[at] + g(at + 1) + g(at));
    best.time = uf + rest.time + ub;
    best.choice = 0;
    best.queue = rest.queue;
    if (offload) {  // its record (and the input it holds) offloaded while [a+1, b] runs
      const size_t input = costs_.input_sent_with_record(at), during = x[at + 1] + rest.peak;
      Entry candidate;
      const size_t xs = costs_.streamed(at);  // Note [a streamed record] in simulate.cpp
      candidate.peak = std::max({during - std::min(during, input), x[at + 1] + xs, xs + g(at + 1) + g(at)});
      candidate.time = uf + rest.time + ub;
      candidate.choice = 0;
      offloaded(candidate, rest, xbar[at] + input, forward_after_[at + 1]);
      if (candidate.better_than(best)) best = candidate;
    }
    const size_t gradient = top ? 0 : g(static_cast<size_t>(b) + 1);
    size_t sweep_peak = 0;
    double sweep_time = 0;
    for (int c = a + 1; c <= b; ++c) {
      const size_t k = static_cast<size_t>(c - 1);
      sweep_peak = std::max(sweep_peak, (c - 1 > a ? x[k] : 0) + x[k + 1]);
      sweep_time += costs_.forward_time[k];
      const Entry& after = entry(c, b, top);
      const Entry& sub = entry(a, c - 1, false);
      Entry candidate;
      candidate.peak = std::max({gradient + sweep_peak, x[static_cast<size_t>(c)] + after.peak, sub.peak});
      candidate.time = sweep_time + after.time + sub.time;
      candidate.choice = c - a;
      candidate.queue = after.queue;
      if (candidate.better_than(best)) best = candidate;
      if (offload && a > 0) {  // its input a_a offloaded while [c, b] runs
        const size_t during = x[static_cast<size_t>(c)] + after.peak;
        candidate.peak = std::max({sweep_peak, during > x[at] ? during - x[at] : 0, sub.peak});
        offloaded(candidate, after, x[at], forward_after_[static_cast<size_t>(c)]);
        if (candidate.better_than(best)) best = candidate;
      }
    }
    return best;
  }

  const ChainCosts& costs_;
  int stages_;
  std::vector<double> forward_after_ = forward_after(costs_);
  std::vector<Entry> rerun_, top_;
};

}  // namespace

size_t min_feasible_memory(const ChainCosts& costs) {
  costs.validate();
  return costs.boundary_bytes[0] + MinPeak(costs).top_peak();
}

Plan plan_min_memory(const ChainCosts& costs) {
  costs.validate();
  const MinPeak solver(costs);
  return make_plan(costs, solver.build(0, costs.num_stages() - 1, true));
}

namespace {

// plan_rotor's memory unit for this limit: the available bytes (the limit less the chain's input)
// over `slots`, rounded up. Refuses a table above kMaxTableEntries before any planning runs.
size_t rotor_unit(const ChainCosts& costs, size_t memory_limit, int slots, size_t& available) {
  const int stages = costs.num_stages();
  if (slots < 1) throw Error("plan_rotor: slots must be >= 1, got " + std::to_string(slots));
  available = memory_limit > costs.boundary_bytes[0] ? memory_limit - costs.boundary_bytes[0] : 0;
  const size_t unit = std::max<size_t>(1, available / static_cast<size_t>(slots) +
                                                (available % static_cast<size_t>(slots) != 0));
  const double entries =
      (static_cast<double>(stages) * (stages + 1) / 2 + stages) * static_cast<double>(available / unit + 1);
  if (entries > kMaxTableEntries) {
    std::ostringstream out;
    out << "plan_rotor: a chain of " << stages << " stages with " << slots << " memory slots needs a table of "
        << entries << " entries, above the limit of " << kMaxTableEntries
        << " (10 bytes each, and O(L^3 * slots) time): plan fewer stages (group layers into nested chains) or "
           "fewer slots";
    throw Error(out.str());
  }
  return unit;
}

}  // namespace

std::vector<std::vector<PlanNode>> rotor_plans_below(const ChainCosts& costs, size_t memory_limit, int slots) {
  costs.validate();
  const int stages = costs.num_stages();
  size_t available = 0;
  const size_t unit = rotor_unit(costs, memory_limit, slots, available);
  const UnitCosts units = to_units(costs, available, unit);
  std::vector<std::vector<PlanNode>> out;
  for (bool reads_ahead : {costs.reads_ahead, false}) {
    const RotorTable table(costs, units, reads_ahead);
    double last = kInfinite;
    for (int64_t m = 0; m <= units.budget; ++m) {
      const double cost = table.cost(0, stages - 1, m, true);
      if (cost == kInfinite || cost == last) continue;
      last = cost;
      out.push_back(table.build(0, stages - 1, m, true));
    }
    if (!costs.reads_ahead || !costs.can_offload()) break;
  }
  return out;
}

Plan plan_rotor(const ChainCosts& costs, size_t memory_limit, int slots) {
  costs.validate();
  const int stages = costs.num_stages();
  // The table's size first: it needs no planning, and a chain too long to plan is refused before
  // the O(L^3) least-peak pass below would run.
  size_t available = 0;
  const size_t unit = rotor_unit(costs, memory_limit, slots, available);
  // Save-all, when it fits, is the fastest plan (every forward runs once), whatever the rounding.
  Plan save_all = plan_save_all(costs);
  if (save_all.predicted_peak_bytes <= memory_limit) return save_all;
  const MinPeak least(costs);
  const size_t minimal = costs.boundary_bytes[0] + least.top_peak();
  if (memory_limit < minimal) {
    std::ostringstream out;
    out << "plan_rotor: memory limit " << memory_limit << " bytes is below the smallest feasible peak of "
        << minimal << " bytes for this chain of " << stages << " stages";
    throw InfeasibleError(out.str(), minimal);
  }
  const UnitCosts units = to_units(costs, available, unit);
  // The plan of the programme that prices reads in full, and with reads ahead also the one that
  // prices them at their estimated stall (Note [a read behind the next backward]): the one that
  // simulate() prices lower. The estimate can be above the stall (a longer window) or, rarely,
  // below it (a peak below the budget), so neither plan is always the faster.
  const auto planned = [&](bool reads_ahead) -> std::optional<Plan> {
    const RotorTable table(costs, units, reads_ahead);
    if (table.cost(0, stages - 1, units.budget, true) == kInfinite) return std::nullopt;
    return make_plan(costs, table.build(0, stages - 1, units.budget, true));
  };
  std::optional<Plan> best = planned(costs.reads_ahead);
  if (best && costs.reads_ahead && costs.can_offload()) {
    std::optional<Plan> full = planned(false);
    if (full->predicted_time < best->predicted_time) best = std::move(full);
  }
  // The rounding left no plan although one fits in exact bytes: the least-peak plan does.
  Plan plan = best ? std::move(*best) : make_plan(costs, least.build(0, stages - 1, true));
  if (plan.predicted_peak_bytes > memory_limit)
    throw Error("plan_rotor: the plan's simulated peak " + std::to_string(plan.predicted_peak_bytes) +
                           " exceeds the limit " + std::to_string(memory_limit) + " (internal error)");
  return plan;
}

}  // namespace remat::schedule
