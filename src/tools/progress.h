// Progress display for long runs, on stderr: a one-line bar redrawn in place on a terminal (fit
// to its width, from COLUMNS or the terminal itself, with an ETA), plain periodic lines otherwise
// (logs, pipes, CI; fit to COLUMNS when it is set).
//
// Fitting a width drops whole fields, lowest priority first; no field is ever cut. The counter
// ("12/100") ranks above everything, the ETA at kEtaPriority, the label ("train") and the bar
// below every field (the bar first: it narrows from 24 to 8 characters, then goes).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace remat::tools {

// One field of the line, e.g. {"loss 2.310", 90}: a higher priority is kept longer.
struct ProgressField {
  std::string text;
  int priority = 0;
};
constexpr int kEtaPriority = 80;  // the ETA (or the elapsed time once done)

class Progress {
 public:
  Progress(std::string label, int64_t total, bool enabled = true);
  // `fields` are shown after the counter in their order, e.g. "loss 2.31  val 2.40  12.3k tok/s".
  void update(int64_t done, const std::vector<ProgressField>& fields);
  // A line of its own (an evaluation, say) that stays above the bar, printed whole (never cut).
  void note(const std::string& line);
  void finish();  // ends the bar's line
  bool on_terminal() const { return terminal_; }

 private:
  std::string label_;
  int64_t total_;
  bool enabled_, terminal_;
  int columns_;  // 0: no limit
  bool drawn_ = false;
  int64_t last_printed_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// The line for `done` of `total` after `elapsed` seconds: "LABEL [####....] 12/100  FIELDS  ETA 1m20s"
// with `bar`, "LABEL step 12/100  FIELDS  ETA 1m20s" without, fit to `columns` (at most
// `columns` - 1 characters; 0: no limit) by dropping whole fields as above.
std::string progress_line(const std::string& label, int64_t done, int64_t total, const std::vector<ProgressField>& fields,
                          double elapsed, bool bar, int columns);

// A planner's progress callback (schedule::ChainPlanOptions::progress) that prints "WHAT: 42%"
// (e.g. WHAT = "remat plan: planning 10000 stages") on stderr once the planning has run for a
// second: redrawn in place on a terminal, a line per tenth otherwise. A fraction of 1 (done) or
// below 0 (given up) ends the line if one was drawn.
std::function<void(double fraction)> planning_progress(const std::string& what);

std::string human_count(double value);  // 12345 -> "12.3k"
std::string human_duration(double seconds);  // 95 -> "1m35s"
// The width to fit: COLUMNS when it is a number from 20 to 10000, else the terminal's width when
// `fd` is a terminal, else 0 (no limit).
int terminal_columns(int fd);

}  // namespace remat::tools
