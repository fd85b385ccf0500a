// Progress display for long runs, on stderr: a one-line bar redrawn in place on a terminal (fit
// to its width, from COLUMNS or the terminal itself, with an ETA), plain periodic lines otherwise
// (logs, pipes, CI; cut to COLUMNS when it is set).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace remat::tools {

class Progress {
 public:
  Progress(std::string label, int64_t total, bool enabled = true);
  // `fields` is shown after the counter, e.g. "loss 2.31  val 2.40  12.3k tok/s  peak 45.1 MiB".
  void update(int64_t done, const std::string& fields);
  // A line of its own (an evaluation, say) that stays above the bar.
  void note(const std::string& line);
  void finish();  // ends the bar's line
  bool on_terminal() const { return terminal_; }

 private:
  std::string line(int64_t done, const std::string& fields, double elapsed, bool bar) const;

  std::string label_;
  int64_t total_;
  bool enabled_, terminal_;
  int columns_;  // 0: no limit
  bool drawn_ = false;
  int64_t last_printed_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

std::string human_count(double value);  // 12345 -> "12.3k"
std::string human_duration(double seconds);  // 95 -> "1m35s"
// The width to fit: COLUMNS when it is a number from 20 to 10000, else the terminal's width when
// `fd` is a terminal, else 0 (no limit).
int terminal_columns(int fd);
// `text` cut to at most `columns` - 1 characters (the last column stays free so that a terminal
// does not wrap); `columns` 0 keeps it whole.
std::string fit(const std::string& text, int columns);

}  // namespace remat::tools
