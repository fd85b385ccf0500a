// Internal: the grouped planner's parts, their menus of options, and the menu programme that plans
// a sequence of parts (Note [the grouped planner] in rotor_grouped.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "remat/schedule.h"
#include "write_queue.h"

namespace remat::schedule::grouped {

// The cost model both planners share (docs/planners.md): whether gradient buffers count, and the
// cost of an offloaded byte (negative: no offload target), of which the write is queued.
struct Model {
  bool gradients_counted = true;
  double offload_seconds_per_byte = -1;
  double offload_write_seconds_per_byte = 0;
  bool reads_ahead = false;  // a read followed by a stage may hide behind its backward (hidden_read)
  int64_t loss_floor = 0;    // live at the loss whatever the plan: the chain's output and its gradient
  bool can_offload() const { return offload_seconds_per_byte >= 0; }
  double read_time(size_t bytes) const {
    return (offload_seconds_per_byte - offload_write_seconds_per_byte) * static_cast<double>(bytes);
  }
  double write_time(size_t bytes) const { return offload_write_seconds_per_byte * static_cast<double>(bytes); }
  int64_t gradient(size_t bytes) const { return gradients_counted ? static_cast<int64_t>(bytes) : 0; }
};

// A node of a plan over a group's parts: part `first` with one of its options, or a region of
// parts [first, last] re-run by `children` (its input offloaded while the rest runs: `offloaded`).
struct PartNode {
  int first = 0, last = 0;
  int option = -1;  // -1: region
  bool offloaded = false;
  std::vector<PartNode> children;
};

// A plan for a part's stages spliced into the enclosing sequence, summarised relative to what is
// live before it: the peak of its forward part (fwd), what it keeps after it (kept: its output
// backward part (bwd); its time leaves out the stall of its writes (queue, counted to its end),
// which depends on what follows it.
struct Option {
  double time = 0;
  WriteQueue queue;
  int64_t fwd = 0, kept = 0, bwd = 0;
  int64_t at_loss = 0;        // of kept, what is live at the loss (a record sharing its output once)
  size_t read_bytes = 0;      // a stage's option: its offloaded record, read back before its backward
  bool whole_region = false;  // the part as one region, re-run by `plan`
  bool offloads = false;      // the plan offloads a node: usable in top-level sequences only
  bool offload_record = false;  // a stage's option: its record offloaded
  std::vector<PartNode> plan;   // over the part's own parts (empty for a stage)
};

struct Part {
  int first = 0, last = 0;  // stages
  double forward_time = 0;
  double backward_time = 0;  // a stage's
  size_t x_in = 0, x_out = 0;
  size_t sweep_first = 0, sweep_later = 0;  // forward sweep peak as a region's first / later part
  std::vector<Option> options;
  std::vector<Part> parts;  // empty for a stage
};

struct Summary {
  double time = 0;    // without the stall of the writes
  WriteQueue queue;   // top level: the sequence's writes, counted to its end
  int64_t fwd = 0, kept = 0, bwd = 0;
  int64_t at_loss = 0;  // top level: of kept, what is live at the loss
  int64_t peak() const { return fwd > bwd ? fwd : bwd; }
};

size_t region_sweep(const std::vector<Part>& parts, int first, int last);
// What the programmes charge the read of `bytes` of an offloaded top-level node followed by stage
// `next` (with its option `option`) in the same sequence, which holds `room` bytes at the loss
// from `next` on: its stall behind next's backward where room covers that backward's peak and the
// read (Note [a read behind the next backward] in rotor.cpp), else the whole read.
double hidden_read(const Model& model, size_t bytes, const Part& next, const Option& option, int64_t room);
double region_time(const std::vector<Part>& parts, int first, int last);
// The exact summary of a sequence over parts (top level: no incoming gradient; re-run: the
// gradient of the sequence's output is live from the start and fwd includes it).
Summary summarize(const std::vector<Part>& parts, const std::vector<PartNode>& sequence, bool top, const Model& model);
// Whether a sequence offloads any node (an offloaded region, or an option that offloads).
bool offloads(const std::vector<Part>& parts, const std::vector<PartNode>& sequence);

// Which rows a plan is read from: re-run sequences (never offload), top-level sequences without
// offload, and top-level sequences that may offload.
enum class Mode { rerun, top, top_offload };

// The menu programme over parts[0..n-1] with sizes in `unit` bytes and memories 0..budget units:
// the least time of every sub-range in re-run mode and of every suffix in the top-level modes
// asked for.
class MenuTable {
 public:
  MenuTable(const std::vector<Part>& parts, const Model& model, size_t unit, int64_t budget, bool top, bool top_offload);

  int64_t budget() const { return static_cast<int64_t>(width_) - 1; }
  double cost(int a, int b, int64_t m, Mode mode) const;
  // The least memory with a plan for all parts, or -1.
  int64_t least(Mode mode) const;
  std::vector<PartNode> build(int a, int b, int64_t m, Mode mode) const;

 private:
  const Option& option(int a, int k) const { return parts_[static_cast<size_t>(a)].options[static_cast<size_t>(k)]; }
  static size_t pair_index(int a, int b) {
    return static_cast<size_t>(b) * (static_cast<size_t>(b) + 1) / 2 + static_cast<size_t>(a);
  }
  // where the row of [a, b] starts in its mode's table (in the header: the fills' inner loops call it)
  size_t offset(int a, int b, Mode mode) const {
    return (mode == Mode::rerun ? pair_index(a, b) : static_cast<size_t>(a)) * width_;
  }
  const std::vector<double>& costs(Mode mode) const;
  const double* row(int a, int b, Mode mode) const { return costs(mode).data() + offset(a, b, mode); }
  int16_t choice(int a, int b, int64_t m, Mode mode) const;
  int64_t units(int64_t bytes) const;       // rounded up (toward +infinity)
  int64_t units_down(size_t bytes) const;   // rounded down: the credit of an offloaded input
  void fill(int a, int b, Mode mode);
  double hidden(size_t bytes, int c, int64_t next) const;
  void fill_options(int a, int b, Mode mode, double* best, int16_t* pick);
  void fill_regions(int a, int b, Mode mode, double* best, int16_t* pick);

  const std::vector<Part>& parts_;
  Model model_;
  int n_;
  size_t unit_, width_;
  std::vector<double> rerun_cost_, top_cost_, offload_cost_;
  std::vector<WriteQueue> offload_queue_;  // the writes of each top_offload entry's plan
  std::vector<int64_t> offload_loss_;      // with reads ahead: each top_offload entry's at_loss
  std::vector<double> forward_after_;      // forward time of parts e..n-1, e = 0..n
  std::vector<int16_t> rerun_choice_, top_choice_, offload_choice_;
};

}  // namespace remat::schedule::grouped
