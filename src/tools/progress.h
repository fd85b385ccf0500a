// Progress display for long runs: a one-line bar redrawn in place on a terminal, plain periodic
// lines otherwise (logs, pipes, CI).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace remat::tools {

class Progress {
 public:
  Progress(std::string label, int64_t total, bool enabled = true);
  // `fields` is shown after the counter, e.g. "loss 2.31  12.3k tok/s  peak 45.1 MiB".
  void update(int64_t done, const std::string& fields);
  void finish();  // ends the bar's line
  bool on_terminal() const { return terminal_; }

 private:
  std::string label_;
  int64_t total_;
  bool enabled_, terminal_;
  int64_t last_printed_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

std::string human_count(double value);  // 12345 -> "12.3k"

}  // namespace remat::tools
