#include <algorithm>
#include <cmath>
#include <cstdio>
#include <new>

#include "remat/error.h"
#include "remat/memory.h"

namespace remat::detail {
void assert_failed(const char* condition, const char* file, int line, const std::string& message) {
  throw Error(concat("internal error at ", file, ":", line, ": ", condition, " failed",
                     message.empty() ? "" : ": ", message));
}
}  // namespace remat::detail

namespace remat::memory {

const char* tag_name(Tag tag) {
  switch (tag) {
    case Tag::parameter: return "parameter";
    case Tag::gradient: return "gradient";
    case Tag::saved: return "saved";
    case Tag::other: return "other";
  }
  return "?";
}

Allocator::Allocator(std::string device_name) : device_name_(std::move(device_name)) {}

namespace {
constexpr size_t kSmallestCachedBlock = 4096;
size_t rounded_size(size_t bytes) { return (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment; }
}  // namespace

void* Allocator::raw_allocate(size_t bytes) {
  // Whole alignment units: required by aligned new for some implementations, and it keeps
  // vector loops free of tails in memory.
  size_t rounded = rounded_size(bytes);
  if (rounded >= kSmallestCachedBlock) {
    std::lock_guard lock(cache_mutex_);
    auto it = cache_.find(rounded);
    if (it != cache_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      cached_bytes_ -= rounded;
      return p;
    }
  }
  return ::operator new(rounded, std::align_val_t(kAlignment));
}

void Allocator::raw_deallocate(void* pointer, size_t bytes) {
  size_t rounded = rounded_size(bytes);
  if (rounded >= kSmallestCachedBlock) {
    std::lock_guard lock(cache_mutex_);
    if (cached_bytes_ + rounded <= cache_limit_) {
      cache_[rounded].push_back(pointer);
      cached_bytes_ += rounded;
      return;
    }
  }
  ::operator delete(pointer, std::align_val_t(kAlignment));
}

void Allocator::set_cache_limit(size_t limit) {
  {
    std::lock_guard lock(cache_mutex_);
    cache_limit_ = limit;
  }
  empty_cache();
}

void Allocator::empty_cache() {
  std::unordered_map<size_t, std::vector<void*>> blocks;
  {
    std::lock_guard lock(cache_mutex_);
    blocks.swap(cache_);
    cached_bytes_ = 0;
  }
  for (auto& [size, list] : blocks)
    for (void* p : list) ::operator delete(p, std::align_val_t(kAlignment));
}

void Allocator::add(size_t bytes, Tag tag) {
  auto t = static_cast<size_t>(tag);
  stats_.live_bytes[t] += bytes;
  stats_.peak_bytes[t] = std::max(stats_.peak_bytes[t], stats_.live_bytes[t]);
  stats_.live_total += bytes;
  stats_.peak_total = std::max(stats_.peak_total, stats_.live_total);
}

void Allocator::remove(size_t bytes, Tag tag) {
  auto t = static_cast<size_t>(tag);
  REMAT_ASSERT(stats_.live_bytes[t] >= bytes, "freeing more ", tag_name(tag), " bytes than are live");
  stats_.live_bytes[t] -= bytes;
  stats_.live_total -= bytes;
}

void* Allocator::allocate(size_t bytes, Tag tag) {
  void* pointer = raw_allocate(bytes);  // may throw std::bad_alloc; counters untouched then
  std::lock_guard lock(mutex_);
  add(bytes, tag);
  auto t = static_cast<size_t>(tag);
  ++stats_.allocations[t];
  ++stats_.allocations_total;
  return pointer;
}

void Allocator::deallocate(void* pointer, size_t bytes, Tag tag) {
  if (pointer == nullptr) return;
  {
    std::lock_guard lock(mutex_);
    remove(bytes, tag);
  }
  raw_deallocate(pointer, bytes);
}

void Allocator::retag(size_t bytes, Tag from, Tag to) {
  if (from == to) return;
  std::lock_guard lock(mutex_);
  remove(bytes, from);
  add(bytes, to);
}

Stats Allocator::stats() const {
  Stats s;
  {
    std::lock_guard lock(mutex_);
    s = stats_;
  }
  std::lock_guard lock(cache_mutex_);
  s.cached_bytes = cached_bytes_;
  return s;
}

void Allocator::reset_peaks() {
  std::lock_guard lock(mutex_);
  stats_.peak_bytes = stats_.live_bytes;
  stats_.peak_total = stats_.live_total;
  stats_.allocations = {};
  stats_.allocations_total = 0;
}

Allocator& cpu() {
  static Allocator* allocator = new Allocator("cpu");  // never destroyed: storage may outlive statics
  return *allocator;
}

Stats stats() { return cpu().stats(); }
void reset_peaks() { cpu().reset_peaks(); }
void empty_cache() { cpu().empty_cache(); }
size_t live_bytes(Tag tag) { return cpu().stats().live(tag); }
size_t peak_bytes(Tag tag) { return cpu().stats().peak(tag); }

std::string format_bytes(double bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double value = bytes;
  while (std::fabs(value) >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[64];
  if (unit == 0)
    std::snprintf(buffer, sizeof buffer, "%.0f B", value);
  else
    std::snprintf(buffer, sizeof buffer, "%.2f %s", value, units[unit]);
  return buffer;
}

size_t parse_bytes(const std::string& text) {
  size_t pos = 0;
  while (pos < text.size() && (std::isdigit(static_cast<unsigned char>(text[pos])) || text[pos] == '.')) ++pos;
  std::string number = text.substr(0, pos);
  std::string unit = text.substr(pos);
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  REMAT_CHECK(!number.empty(), "parse_bytes: cannot parse byte count '", text,
              "': expected a number with an optional unit (B, KB, KiB, MB, MiB, GB, GiB), e.g. 64MiB");
  double value = 0;
  size_t used = 0;
  try {
    value = std::stod(number, &used);
  } catch (...) {
    used = 0;
  }
  // the whole number must parse ("1.2.3" is not 1.2)
  REMAT_CHECK(used == number.size(), "parse_bytes: cannot parse byte count '", text, "': '", number,
              "' is not a number");
  std::string u;
  for (char c : unit) u += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double scale = 0;
  if (u.empty() || u == "b") scale = 1;
  else if (u == "k" || u == "kb") scale = 1e3;
  else if (u == "kib") scale = 1024.0;
  else if (u == "m" || u == "mb") scale = 1e6;
  else if (u == "mib") scale = 1024.0 * 1024;
  else if (u == "g" || u == "gb") scale = 1e9;
  else if (u == "gib") scale = 1024.0 * 1024 * 1024;
  else if (u == "tb") scale = 1e12;
  else if (u == "tib") scale = 1024.0 * 1024 * 1024 * 1024;
  REMAT_CHECK(scale > 0, "parse_bytes: cannot parse byte count '", text, "': unknown unit '", unit,
              "' (use B, KB, KiB, MB, MiB, GB, GiB, TB or TiB)");
  return static_cast<size_t>(std::llround(value * scale));
}

}  // namespace remat::memory
