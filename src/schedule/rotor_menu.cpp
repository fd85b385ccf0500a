// The grouped planner's menu programme: rotor's recurrences over parts that each offer a menu of
// options (Note [the grouped planner] in rotor_grouped.cpp), and the exact summary of a sequence.
#include "rotor_menu.h"

#include <algorithm>
#include <limits>
#include <string>

#include "remat/error.h"

namespace remat::schedule::grouped {

namespace {

constexpr double kInfinite = std::numeric_limits<double>::infinity();
// choice < kRegion: an option of the part; kRegion + length: a region of `length` parts; kOffloaded
// + length: the same region with its input offloaded.
constexpr int16_t kRegion = 1024;
constexpr int16_t kOffloaded = 2048;

}  // namespace

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

double hidden_read(const Model& model, size_t bytes, const Part& next, const Option& option, int64_t room) {
  const double read = model.read_time(bytes);
  if (!model.reads_ahead || !next.parts.empty() || option.bwd + static_cast<int64_t>(bytes) > room) return read;
  return std::max(0.0, read - next.backward_time);
}

namespace {

// The reads a top-level sequence hides (Note [a read behind the next backward] in rotor.cpp): for
// each node offloaded in front of a stage, its full read less hidden_read's charge. What the
// sequence's output holds at the loss may be offloaded by the part after it, so it is not counted;
// the chain's output and its gradient are (Model::loss_floor), the sequence's output or beyond it.
double hidden_reads(const std::vector<Part>& parts, const std::vector<PartNode>& sequence,
                    const std::vector<int64_t>& at_loss, const Model& model) {
  double saved = 0;
  int64_t room = model.loss_floor - static_cast<int64_t>(parts[static_cast<size_t>(sequence.back().last)].x_out);
  for (size_t k = sequence.size(); k-- > 1;) {
    room += at_loss[k];
    const PartNode& node = sequence[k - 1];
    const PartNode& next = sequence[k];
    if (next.option < 0) continue;
    const Part& stage = parts[static_cast<size_t>(next.first)];
    const Option& option = stage.options[static_cast<size_t>(next.option)];
    size_t bytes = 0;
    if (node.option < 0 && node.offloaded) bytes = parts[static_cast<size_t>(node.first)].x_in;
    if (node.option >= 0) bytes = parts[static_cast<size_t>(node.first)].options[static_cast<size_t>(node.option)].read_bytes;
    if (bytes > 0) saved += model.read_time(bytes) - hidden_read(model, bytes, stage, option, room);
  }
  return saved;
}

}  // namespace

Summary summarize(const std::vector<Part>& parts, const std::vector<PartNode>& sequence, bool top, const Model& model) {
  const int64_t gradient = top ? 0 : model.gradient(parts[static_cast<size_t>(sequence.back().last)].x_out);
  Summary s;
  int64_t live = gradient;
  std::vector<int64_t> base, own_bwd, at_loss;
  std::vector<std::pair<WriteQueue, double>> writes;  // each node's writes and forward time
  for (const PartNode& node : sequence) {
    base.push_back(live - gradient);
    if (node.option >= 0) {
      const Option& o = parts[static_cast<size_t>(node.first)].options[static_cast<size_t>(node.option)];
      s.fwd = std::max(s.fwd, live + o.fwd);
      live += o.kept;
      s.time += o.time;
      own_bwd.push_back(o.bwd);
      writes.emplace_back(o.queue, parts[static_cast<size_t>(node.first)].forward_time);
      at_loss.push_back(o.at_loss);
      continue;
    }
    const Part& first = parts[static_cast<size_t>(node.first)];
    s.fwd = std::max(s.fwd, live + static_cast<int64_t>(region_sweep(parts, node.first, node.last)));
    live += static_cast<int64_t>(parts[static_cast<size_t>(node.last)].x_out);
    at_loss.push_back(static_cast<int64_t>(parts[static_cast<size_t>(node.last)].x_out) -
                      (node.offloaded ? static_cast<int64_t>(first.x_in) : 0));
    WriteQueue write;
    if (node.offloaded) {  // its input leaves memory after the sweep, and comes back for the re-run
      live -= static_cast<int64_t>(first.x_in);
      s.time += model.read_time(first.x_in);
      write = WriteQueue::single(model.write_time(first.x_in));
    }
    writes.emplace_back(write, region_time(parts, node.first, node.last));
    const Summary rerun = summarize(parts, node.children, false, model);
    s.time += region_time(parts, node.first, node.last) + rerun.time;
    own_bwd.push_back(rerun.peak());
  }
  s.kept = live - gradient;
  for (int64_t bytes : at_loss) s.at_loss += bytes;
  if (top && model.reads_ahead) s.time -= hidden_reads(parts, sequence, at_loss, model);
  double after = 0;
  for (size_t k = writes.size(); k-- > 0;) {
    s.queue = s.queue.ahead(writes[k].first, after);
    after += writes[k].second;
  }
  for (size_t k = 0; k < sequence.size(); ++k) s.bwd = std::max(s.bwd, base[k] + own_bwd[k]);
  return s;
}

bool offloads(const std::vector<Part>& parts, const std::vector<PartNode>& sequence) {
  for (const PartNode& node : sequence) {
    if (node.offloaded) return true;
    if (node.option >= 0 && parts[static_cast<size_t>(node.first)].options[static_cast<size_t>(node.option)].offloads)
      return true;
  }
  return false;
}

MenuTable::MenuTable(const std::vector<Part>& parts, const Model& model, size_t unit, int64_t budget, bool top,
                     bool top_offload)
    : parts_(parts), model_(model), n_(static_cast<int>(parts.size())), unit_(unit), width_(static_cast<size_t>(budget) + 1) {
  rerun_cost_.assign(pair_index(0, n_) * width_, kInfinite);
  rerun_choice_.assign(pair_index(0, n_) * width_, -1);
  for (int length = 1; length <= n_; ++length)
    for (int a = 0; a + length <= n_; ++a) fill(a, a + length - 1, Mode::rerun);
  if (top) {
    top_cost_.assign(static_cast<size_t>(n_) * width_, kInfinite);
    top_choice_.assign(static_cast<size_t>(n_) * width_, -1);
    for (int a = n_ - 1; a >= 0; --a) fill(a, n_ - 1, Mode::top);
  }
  if (top_offload && model_.can_offload()) {
    forward_after_.assign(static_cast<size_t>(n_) + 1, 0.0);
    for (int e = n_ - 1; e >= 0; --e)
      forward_after_[static_cast<size_t>(e)] = forward_after_[static_cast<size_t>(e) + 1] + parts_[static_cast<size_t>(e)].forward_time;
    offload_queue_.assign(static_cast<size_t>(n_) * width_, WriteQueue{});
    if (model_.reads_ahead) offload_loss_.assign(static_cast<size_t>(n_) * width_, 0);
    offload_cost_.assign(static_cast<size_t>(n_) * width_, kInfinite);
    offload_choice_.assign(static_cast<size_t>(n_) * width_, -1);
    for (int a = n_ - 1; a >= 0; --a) fill(a, n_ - 1, Mode::top_offload);
  }
}

const std::vector<double>& MenuTable::costs(Mode mode) const {
  const std::vector<double>& table = mode == Mode::rerun ? rerun_cost_ : mode == Mode::top ? top_cost_ : offload_cost_;
  if (table.empty()) throw Error("plan_chain: a menu table was read in a mode it did not fill (internal error)");
  return table;
}

double MenuTable::cost(int a, int b, int64_t m, Mode mode) const { return m < 0 ? kInfinite : row(a, b, mode)[m]; }

int16_t MenuTable::choice(int a, int b, int64_t m, Mode mode) const {
  const std::vector<int16_t>& table = mode == Mode::rerun ? rerun_choice_ : mode == Mode::top ? top_choice_ : offload_choice_;
  return table[offset(a, b, mode) + static_cast<size_t>(m)];
}

int64_t MenuTable::least(Mode mode) const {
  for (int64_t m = 0; m <= budget(); ++m)
    if (cost(0, n_ - 1, m, mode) < kInfinite) return m;
  return -1;
}

int64_t MenuTable::units(int64_t bytes) const {
  const int64_t unit = static_cast<int64_t>(unit_);
  return bytes >= 0 ? bytes / unit + (bytes % unit != 0) : -((-bytes) / unit);
}

int64_t MenuTable::units_down(size_t bytes) const { return static_cast<int64_t>(bytes / unit_); }

std::vector<PartNode> MenuTable::build(int a, int b, int64_t m, Mode mode) const {
  std::vector<PartNode> sequence;
  const int64_t top_budget = budget();
  while (a <= b) {
    const int16_t pick = choice(a, b, m, mode);
    if (pick < 0) throw Error("plan_chain: reconstruction reached an infeasible entry (internal error)");
    if (pick < kRegion) {
      sequence.push_back(PartNode{a, a, pick, false, {}});
      m = std::min(top_budget, m - units(option(a, pick).kept));
      a += 1;
      continue;
    }
    const bool offloaded = pick >= kOffloaded;
    const int c = a + (pick - (offloaded ? kOffloaded : kRegion));
    sequence.push_back(PartNode{a, c - 1, -1, offloaded, build(a, c - 1, m, Mode::rerun)});
    const int64_t keep = units(static_cast<int64_t>(parts_[static_cast<size_t>(c)].x_in));
    m = offloaded ? std::min(top_budget, m - keep + units_down(parts_[static_cast<size_t>(a)].x_in)) : m - keep;
    a = c;
  }
  return sequence;
}

// With reads ahead, what a top-level read of `bytes` in front of the suffix entry (c, next) is
// charged (hidden_read): its stall where that entry's plan starts with a stage part, else in full.
double MenuTable::hidden(size_t bytes, int c, int64_t next) const {
  const size_t at = offset(c, n_ - 1, Mode::top_offload) + static_cast<size_t>(next);
  const int16_t pick = offload_choice_[at];
  const Part& part = parts_[static_cast<size_t>(c)];
  if (pick < 0 || pick >= kRegion || !part.parts.empty()) return model_.read_time(bytes);
  const int64_t room = model_.loss_floor + offload_loss_[at] - static_cast<int64_t>(parts_.back().x_out);
  return hidden_read(model_, bytes, part, option(c, pick), room);
}

void MenuTable::fill(int a, int b, Mode mode) {
  std::vector<double>& costs = mode == Mode::rerun ? rerun_cost_ : mode == Mode::top ? top_cost_ : offload_cost_;
  std::vector<int16_t>& choices = mode == Mode::rerun ? rerun_choice_ : mode == Mode::top ? top_choice_ : offload_choice_;
  double* best = costs.data() + offset(a, b, mode);
  int16_t* pick = choices.data() + offset(a, b, mode);
  fill_options(a, b, mode, best, pick);
  fill_regions(a, b, mode, best, pick);
}

// Part a with one of its options first, then [a+1, b] with what it keeps held (rotor's "stage a
// recorded", with the option's peaks in place of the stage's).
void MenuTable::fill_options(int a, int b, Mode mode, double* best, int16_t* pick) {
  const bool top = mode != Mode::rerun;
  const int64_t budget = this->budget();
  const Part& part = parts_[static_cast<size_t>(a)];
  const int64_t gradient = top ? 0 : units(model_.gradient(parts_[static_cast<size_t>(b)].x_out));
  const int64_t out_gradient = units(model_.gradient(part.x_out));
  const double* rest = a < b ? row(a + 1, b, mode) : nullptr;
  WriteQueue* queue = mode == Mode::top_offload ? offload_queue_.data() + offset(a, b, mode) : nullptr;
  const WriteQueue* rest_queue = queue && a < b ? offload_queue_.data() + offset(a + 1, b, mode) : nullptr;
  int64_t* loss = queue && !offload_loss_.empty() ? offload_loss_.data() + offset(a, b, mode) : nullptr;
  const WriteQueue none;
  for (size_t k = 0; k < part.options.size(); ++k) {
    const Option& o = part.options[k];
    if (o.offloads && mode != Mode::top_offload) continue;
    const int64_t fwd = units(o.fwd), kept = units(o.kept), bwd = units(o.bwd);
    int64_t need = 0;
    if (a < b)
      need = std::max({fwd + gradient, bwd, kept});
    else  // the last part: at the top level the loss runs with what it keeps; in a re-run, its gradient is held
      need = top ? std::max({fwd, kept + out_gradient, bwd}) : std::max(fwd + out_gradient, bwd);
    if (!queue) {  // the same, without the write queue and reads ahead: a loop without branches
      const int16_t id = static_cast<int16_t>(k);
      for (int64_t m = std::max<int64_t>(need, 0); m <= budget; ++m) {
        const double total = o.time + (rest ? rest[std::min(budget, m - kept)] : 0.0);
        const bool better = total < best[m];
        best[m] = better ? total : best[m];
        pick[m] = better ? id : pick[m];
      }
      continue;
    }
    for (int64_t m = std::max<int64_t>(need, 0); m <= budget; ++m) {
      const int64_t next = std::min(budget, m - kept);
      double total = o.time + (rest ? rest[next] : 0.0);
      WriteQueue ahead;
      if (queue) {  // its writes ahead of the rest's: the stall they add
        const WriteQueue& after = rest_queue ? rest_queue[next] : none;
        ahead = after.ahead(o.queue, forward_after_[static_cast<size_t>(a) + 1]);
        total += ahead.stall() - after.stall();
      }
      if (loss && o.read_bytes > 0 && a < b) total -= model_.read_time(o.read_bytes) - hidden(o.read_bytes, a + 1, next);
      if (total < best[m]) {
        best[m] = total;
        pick[m] = static_cast<int16_t>(k);
        if (queue) queue[m] = ahead;
        if (loss) loss[m] = o.at_loss + (a < b ? offload_loss_[offset(a + 1, b, mode) + static_cast<size_t>(next)] : 0);
      }
    }
  }
}

// A region of parts [a, c-1] first, then [c, b] holding its output, then the region's re-run;
// at the top level with offload, also with the region's input offloaded while [c, b] runs (not
// the chain's input, which the caller holds).
void MenuTable::fill_regions(int a, int b, Mode mode, double* best, int16_t* pick) {
  const bool top = mode != Mode::rerun;
  const int64_t budget = this->budget();
  const Part& part = parts_[static_cast<size_t>(a)];
  const int64_t gradient = top ? 0 : units(model_.gradient(parts_[static_cast<size_t>(b)].x_out));
  const bool offload = mode == Mode::top_offload && part.first > 0;
  const double transfer = offload ? model_.read_time(part.x_in) : 0;
  const WriteQueue write = WriteQueue::single(offload ? model_.write_time(part.x_in) : 0);
  const int64_t credit = units_down(part.x_in);
  WriteQueue* queue = mode == Mode::top_offload ? offload_queue_.data() + offset(a, b, mode) : nullptr;
  int64_t* loss = queue && !offload_loss_.empty() ? offload_loss_.data() + offset(a, b, mode) : nullptr;
  size_t sweep = 0;
  double sweep_time = 0;
  for (int c = a + 1; c <= b; ++c) {
    const Part& last = parts_[static_cast<size_t>(c - 1)];
    sweep = std::max(sweep, c - 1 == a ? last.sweep_first : last.sweep_later);
    sweep_time += last.forward_time;
    const int64_t keep = units(static_cast<int64_t>(parts_[static_cast<size_t>(c)].x_in));
    const int64_t sweep_units = units(static_cast<int64_t>(sweep));
    const double* after = row(c, b, mode);
    const double* region = row(a, c - 1, Mode::rerun);
    const WriteQueue* after_queue = queue ? offload_queue_.data() + offset(c, b, mode) : nullptr;
    const int64_t output = static_cast<int64_t>(parts_[static_cast<size_t>(c)].x_in);
    if (!queue) {  // the same, without the write queue (a re-run, or the top level without offload): a loop without branches
      const int16_t id = static_cast<int16_t>(kRegion + (c - a));
      for (int64_t m = std::max(gradient + sweep_units, keep); m <= budget; ++m) {
        const double total = sweep_time + after[m - keep] + region[m];
        const bool better = total < best[m];
        best[m] = better ? total : best[m];
        pick[m] = better ? id : pick[m];
      }
      continue;  // no offload outside the top level
    }
    for (int64_t m = std::max(gradient + sweep_units, keep); m <= budget; ++m) {
      const double total = sweep_time + after[m - keep] + region[m];
      if (total < best[m]) {
        best[m] = total;
        pick[m] = static_cast<int16_t>(kRegion + (c - a));
        if (queue) queue[m] = after_queue[m - keep];
        if (loss) loss[m] = output + offload_loss_[offset(c, b, mode) + static_cast<size_t>(m - keep)];
      }
    }
    if (!offload) continue;
    for (int64_t m = std::max(sweep_units, keep); m <= budget; ++m) {
      const int64_t next = std::min(budget, m - keep + credit);
      const WriteQueue ahead = after_queue[next].ahead(write, forward_after_[static_cast<size_t>(c)]);
      const double read = loss ? hidden(part.x_in, c, next) : transfer;
      const double total = sweep_time + read + after[next] + (ahead.stall() - after_queue[next].stall()) + region[m];
      if (total < best[m]) {
        best[m] = total;
        pick[m] = static_cast<int16_t>(kOffloaded + (c - a));
        queue[m] = ahead;
        if (loss) loss[m] = output - static_cast<int64_t>(part.x_in) + offload_loss_[offset(c, b, mode) + static_cast<size_t>(next)];
      }
    }
  }
}

}  // namespace remat::schedule::grouped
