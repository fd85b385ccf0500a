#include "progress.h"

#include <unistd.h>

#include <cstdio>

namespace remat::tools {

Progress::Progress(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)), total_(total), enabled_(enabled), terminal_(isatty(fileno(stdout)) != 0) {
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

void Progress::update(int64_t done, const std::string& fields) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  double elapsed = std::chrono::duration<double>(now - start_).count();
  if (terminal_) {
    if (done != total_ && std::chrono::duration<double>(now - last_draw_).count() < 0.1) return;
    last_draw_ = now;
    const int width = 24;
    int filled = total_ > 0 ? static_cast<int>(width * done / total_) : width;
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(width, '.');
    std::printf("\r%s [%s] %lld/%lld  %s  %.0fs  ", label_.c_str(), bar.c_str(), static_cast<long long>(done),
                static_cast<long long>(total_), fields.c_str(), elapsed);
    std::fflush(stdout);
    return;
  }
  // plain lines: about 20 per run, plus the first and the last step
  int64_t every = total_ >= 20 ? total_ / 20 : 1;
  if (done == 1 || done == total_ || done - last_printed_ >= every) {
    last_printed_ = done;
    std::printf("%s step %lld/%lld  %s  %.1fs\n", label_.c_str(), static_cast<long long>(done),
                static_cast<long long>(total_), fields.c_str(), elapsed);
    std::fflush(stdout);
  }
}

void Progress::finish() {
  if (enabled_ && terminal_) std::printf("\n");
}

std::string human_count(double value) {
  char buffer[32];
  if (value >= 1e9) std::snprintf(buffer, sizeof buffer, "%.2fG", value / 1e9);
  else if (value >= 1e6) std::snprintf(buffer, sizeof buffer, "%.2fM", value / 1e6);
  else if (value >= 1e3) std::snprintf(buffer, sizeof buffer, "%.1fk", value / 1e3);
  else std::snprintf(buffer, sizeof buffer, "%.0f", value);
  return buffer;
}

}  // namespace remat::tools
