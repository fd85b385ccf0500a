#include "progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "numbers.h"
#include "remat/error.h"

namespace remat::tools {

int terminal_columns(int fd) {
  if (const char* env = std::getenv("COLUMNS")) {
    try {
      return static_cast<int>(parse_int("COLUMNS", env, 20, 10000));
    } catch (const Error&) {
      // not a usable width: ask the terminal
    }
  }
  winsize size{};
  if (isatty(fd) && ioctl(fd, TIOCGWINSZ, &size) == 0 && size.ws_col >= 20) return size.ws_col;
  return isatty(fd) ? 80 : 0;
}

std::string fit(const std::string& text, int columns) {
  if (columns <= 0 || text.size() < static_cast<size_t>(columns)) return text;
  return text.substr(0, static_cast<size_t>(columns - 1));
}

Progress::Progress(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)),
      total_(total),
      enabled_(enabled),
      terminal_(isatty(fileno(stderr)) != 0),
      columns_(terminal_columns(fileno(stderr))) {
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

// "train [#####.....] 12/100  FIELDS  ETA 1m20s" (plain: "train step 12/100  FIELDS  ETA 1m20s"):
// the bar takes what the width leaves (8 to 24 characters), then the fields are cut; the ETA stays.
std::string Progress::line(int64_t done, const std::string& fields, double elapsed, bool bar) const {
  const std::string counter = std::to_string(done) + "/" + std::to_string(total_);
  const std::string eta =
      done > 0 && done < total_
          ? "ETA " + human_duration(elapsed / static_cast<double>(done) * static_cast<double>(total_ - done))
          : human_duration(elapsed);
  const std::string tail = "  " + fields + "  " + eta;
  const int limit = columns_ > 0 ? columns_ - 1 : 100000;
  std::string head = label_ + (bar ? " " : " step ");
  if (bar) {
    const int fixed = static_cast<int>(head.size() + 3 + counter.size());  // "[" "] " counter
    int width = std::min(24, limit - fixed - static_cast<int>(tail.size()));
    if (width < 8) width = std::max(0, std::min(8, limit - fixed - static_cast<int>(eta.size()) - 2));
    if (width > 0) {
      const int filled = total_ > 0 ? static_cast<int>(width * done / total_) : width;
      std::string b(static_cast<size_t>(filled), '#');
      b.resize(static_cast<size_t>(width), '.');
      head += "[" + b + "] ";
    }
  }
  head += counter;
  if (static_cast<int>(head.size() + tail.size()) <= limit) return head + tail;
  // cut the fields, keep the ETA
  const int room = limit - static_cast<int>(head.size() + eta.size()) - 4;
  std::string text = head;
  if (room > 0) text += "  " + fields.substr(0, static_cast<size_t>(room));
  text += "  " + eta;
  return fit(text, limit + 1);
}

void Progress::update(int64_t done, const std::string& fields) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  double elapsed = std::chrono::duration<double>(now - start_).count();
  if (terminal_) {
    if (done != total_ && std::chrono::duration<double>(now - last_draw_).count() < 0.1) return;
    last_draw_ = now;
    // \r, the line, then clear to the end of the line (a shorter line leaves nothing behind)
    std::fprintf(stderr, "\r%s\033[K", line(done, fields, elapsed, true).c_str());
    std::fflush(stderr);
    drawn_ = true;
    return;
  }
  // plain lines: about 20 per run, plus the first and the last step
  int64_t every = total_ >= 20 ? total_ / 20 : 1;
  if (done == 1 || done == total_ || done - last_printed_ >= every) {
    last_printed_ = done;
    std::fprintf(stderr, "%s\n", line(done, fields, elapsed, false).c_str());
    std::fflush(stderr);
  }
}

void Progress::note(const std::string& text) {
  if (!enabled_) return;
  if (terminal_ && drawn_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%s\n", fit(text, columns_).c_str());
  std::fflush(stderr);
  last_draw_ = {};  // redraw the bar at the next update
}

void Progress::finish() {
  if (enabled_ && terminal_ && drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

std::string human_count(double value) {
  char buffer[32];
  if (value >= 1e9) std::snprintf(buffer, sizeof buffer, "%.2fG", value / 1e9);
  else if (value >= 1e6) std::snprintf(buffer, sizeof buffer, "%.2fM", value / 1e6);
  else if (value >= 1e3) std::snprintf(buffer, sizeof buffer, "%.1fk", value / 1e3);
  else std::snprintf(buffer, sizeof buffer, "%.0f", value);
  return buffer;
}

std::string human_duration(double seconds) {
  char buffer[32];
  if (!(seconds >= 0) || seconds > 1e9) return "?";
  const long long s = static_cast<long long>(seconds + 0.5);
  if (s < 60) std::snprintf(buffer, sizeof buffer, "%llds", s);
  else if (s < 3600) std::snprintf(buffer, sizeof buffer, "%lldm%02llds", s / 60, s % 60);
  else std::snprintf(buffer, sizeof buffer, "%lldh%02lldm", s / 3600, (s % 3600) / 60);
  return buffer;
}

}  // namespace remat::tools
