#include "progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>

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

Progress::Progress(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)),
      total_(total),
      enabled_(enabled),
      terminal_(isatty(fileno(stderr)) != 0),
      columns_(terminal_columns(fileno(stderr))) {
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

namespace {

constexpr int kCounterPriority = 1000;  // above every field
constexpr int kLabelPriority = -1;      // below every field, above the bar
constexpr int kBarMin = 8, kBarMax = 24;

struct Item {
  std::string text;
  int priority;
  bool tight;  // joined to the next item by one space (the label and the bar), else two
};

size_t joined_size(const std::vector<Item>& items) {
  size_t n = 0;
  for (size_t i = 0; i < items.size(); ++i) n += items[i].text.size() + (i == 0 ? 0 : items[i - 1].tight ? 1 : 2);
  return n;
}

}  // namespace

// Note: fitting the line. The items (label, counter, fields, ETA) are dropped one at a time, the
// lowest priority first (of equal ones the rightmost), until the rest joined fits; then the bar
// takes what is left, up to kBarMax characters, or is left out when fewer than kBarMin remain. An
// item is kept or dropped whole, so no word is ever cut, and the most important ones go last.
std::string progress_line(const std::string& label, int64_t done, int64_t total, const std::vector<ProgressField>& fields,
                          double elapsed, bool bar, int columns) {
  std::vector<Item> items;
  items.push_back({bar ? label : label + " step", kLabelPriority, true});
  items.push_back({std::to_string(done) + "/" + std::to_string(total), kCounterPriority, false});
  for (const ProgressField& f : fields)
    if (!f.text.empty()) items.push_back({f.text, f.priority, false});
  const double left = done > 0 && done < total ? elapsed / static_cast<double>(done) * static_cast<double>(total - done) : 0;
  items.push_back({done > 0 && done < total ? "ETA " + human_duration(left) : human_duration(elapsed), kEtaPriority, false});

  const size_t limit = columns > 0 ? static_cast<size_t>(columns - 1) : SIZE_MAX;
  while (!items.empty() && joined_size(items) > limit) {
    size_t lowest = 0;
    for (size_t i = 1; i < items.size(); ++i)
      if (items[i].priority <= items[lowest].priority) lowest = i;
    items.erase(items.begin() + static_cast<std::ptrdiff_t>(lowest));
  }
  if (bar && !items.empty()) {
    // "[" bar "]" and one space before the next item
    const size_t used = joined_size(items), room = limit - used;
    const size_t width = room >= 3 + kBarMin ? std::min<size_t>(kBarMax, room - 3) : 0;
    if (width > 0) {
      const double share = total > 0 ? std::clamp(static_cast<double>(done) / static_cast<double>(total), 0.0, 1.0) : 1.0;
      std::string b(static_cast<size_t>(static_cast<double>(width) * share), '#');
      b.resize(width, '.');
      const bool after_label = items.front().priority == kLabelPriority;
      items.insert(items.begin() + (after_label ? 1 : 0), Item{"[" + b + "]", kLabelPriority - 1, true});
    }
  }
  std::string text;
  for (size_t i = 0; i < items.size(); ++i) text += (i == 0 ? "" : items[i - 1].tight ? " " : "  ") + items[i].text;
  return text;
}

void Progress::update(int64_t done, const std::vector<ProgressField>& fields) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  double elapsed = std::chrono::duration<double>(now - start_).count();
  if (terminal_) {
    if (done != total_ && std::chrono::duration<double>(now - last_draw_).count() < 0.1) return;
    last_draw_ = now;
    // \r, the line, then clear to the end of the line (a shorter line leaves nothing behind)
    std::fprintf(stderr, "\r%s\033[K", progress_line(label_, done, total_, fields, elapsed, true, columns_).c_str());
    std::fflush(stderr);
    drawn_ = true;
    return;
  }
  // plain lines: about 20 per run, plus the first and the last step
  int64_t every = total_ >= 20 ? total_ / 20 : 1;
  if (done == 1 || done == total_ || done - last_printed_ >= every) {
    last_printed_ = done;
    std::fprintf(stderr, "%s\n", progress_line(label_, done, total_, fields, elapsed, false, columns_).c_str());
    std::fflush(stderr);
  }
}

void Progress::note(const std::string& text) {
  if (!enabled_) return;
  if (terminal_ && drawn_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%s\n", text.c_str());  // whole: a line of its own may wrap
  std::fflush(stderr);
  last_draw_ = {};  // redraw the bar at the next update
}

void Progress::finish() {
  if (enabled_ && terminal_ && drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

std::function<void(double)> planning_progress(const std::string& what) {
  struct State {
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    bool terminal = isatty(STDERR_FILENO) != 0;
    bool open = false;  // a line is drawn and not ended (terminal)
    int tenth = -1;     // the last tenth printed (not a terminal)
  };
  auto state = std::make_shared<State>();
  return [state, what](double fraction) {
    if (fraction < 0) {
      if (state->open) std::fprintf(stderr, "\n");
      state->open = false;
      return;
    }
    if (std::chrono::steady_clock::now() - state->start < std::chrono::seconds(1)) return;
    const int tenth = static_cast<int>(10 * fraction);
    if (!state->terminal && tenth == state->tenth) return;
    state->tenth = tenth;
    const bool done = fraction >= 1;
    std::fprintf(stderr, "%s%s: %3.0f%%%s", state->terminal ? "\r" : "", what.c_str(), 100 * fraction,
                 state->terminal && !done ? "" : "\n");
    std::fflush(stderr);
    state->open = state->terminal && !done;
  };
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
