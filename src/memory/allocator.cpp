#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <cmath>
#include <cstdio>
#include <new>

#include "remat/error.h"
#include "remat/memory.h"

namespace remat::detail {
void assert_failed(const char* condition, const char* file, int line, const std::string& message) {
  // The library is built with __FILE__ relative to its source root; code built elsewhere may
  // still pass an absolute path, of which only the file name is shown.
  std::string_view where = file;
  if (!where.empty() && where.front() == '/') where = where.substr(where.rfind('/') + 1);
  throw Error(concat("internal error at ", where, ":", line, ": ", condition, " failed",
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
size_t rounded_size(size_t bytes) { return (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment; }
}  // namespace

// Note: the cache sits between allocate() and the raw memory source, for every device. Sizes are
// rounded up to whole alignment units (aligned new needs it on some implementations, and vector
// loops then have no tails in memory), and a freed block of at least smallest_cached_ bytes waits
// in the list of its rounded size while the cache stays under its limit. raw_allocate and
// raw_deallocate see rounded sizes only, so a device allocator (cudaMalloc / cudaFree) overrides
// those two and shares the cache, its limit, empty_cache() and Stats::cached_bytes with the CPU.
void* Allocator::cached_allocate(size_t bytes) {
  size_t rounded = rounded_size(bytes);
  {
    std::lock_guard lock(cache_mutex_);
    auto it = rounded >= smallest_cached_ ? cache_.find(rounded) : cache_.end();
    if (it != cache_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      cached_bytes_ -= rounded;
      return p;
    }
  }
  return raw_allocate(rounded);
}

void Allocator::cached_deallocate(void* pointer, size_t bytes) {
  size_t rounded = rounded_size(bytes);
  {
    std::lock_guard lock(cache_mutex_);
    if (rounded >= smallest_cached_ && cached_bytes_ + rounded <= cache_limit_) {
      cache_[rounded].push_back(pointer);
      cached_bytes_ += rounded;
      return;
    }
  }
  raw_deallocate(pointer, rounded);
}

void* Allocator::raw_allocate(size_t bytes) {
  // nothrow: a failed allocation is reported by allocate() as remat::OutOfMemory (under
  // AddressSanitizer, run with allocator_may_return_null=1 to get there instead of an abort)
  return ::operator new(bytes, std::align_val_t(kAlignment), std::nothrow);
}

void Allocator::raw_deallocate(void* pointer, size_t bytes) { ::operator delete(pointer, std::align_val_t(kAlignment)); }

std::string Allocator::out_of_memory_detail() const { return {}; }

void Allocator::set_smallest_cached_block(size_t bytes) {
  std::lock_guard lock(cache_mutex_);
  smallest_cached_ = bytes;
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
    for (void* p : list) raw_deallocate(p, size);
}

void Allocator::add(size_t bytes, Tag tag) {
  auto t = static_cast<size_t>(tag);
  stats_.live_bytes[t] += bytes;
  stats_.peak_bytes[t] = std::max(stats_.peak_bytes[t], stats_.live_bytes[t]);
  window_peak_[t] = std::max(window_peak_[t], stats_.live_bytes[t]);
  stats_.live_total += bytes;
  stats_.peak_total = std::max(stats_.peak_total, stats_.live_total);
}

void Allocator::remove(size_t bytes, Tag tag) {
  auto t = static_cast<size_t>(tag);
  REMAT_ASSERT(stats_.live_bytes[t] >= bytes, "freeing more ", tag_name(tag), " bytes than are live");
  stats_.live_bytes[t] -= bytes;
  stats_.live_total -= bytes;
}

namespace {
// Blocks are rounded up to whole alignment units; anything near SIZE_MAX cannot be.
constexpr size_t kLargestBlock = size_t{1} << 63;
}  // namespace

void* Allocator::try_raw_allocate(size_t bytes) {
  try {
    return cached_allocate(bytes);
  } catch (const std::bad_alloc&) {  // a raw source that throws instead of returning null
    return nullptr;
  }
}

void* Allocator::allocate(size_t bytes, Tag tag) {
  // The counters are updated only once the memory is there: a failure leaves them as they were.
  void* pointer = bytes <= kLargestBlock ? try_raw_allocate(bytes) : nullptr;
  if (pointer == nullptr && bytes <= kLargestBlock && stats().cached_bytes > 0) {
    empty_cache();  // blocks of other sizes may be what stands in the way
    pointer = try_raw_allocate(bytes);
  }
  if (pointer == nullptr) {
    Stats s = stats();
    throw OutOfMemory(detail::concat(device_name_, " allocator: cannot allocate ", format_bytes(static_cast<double>(bytes)),
                                     " (", bytes, " bytes); ", format_bytes(static_cast<double>(s.live_total)),
                                     " are live", out_of_memory_detail()),
                      bytes);
  }
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
  cached_deallocate(pointer, bytes);
}

void Allocator::retag(size_t bytes, Tag from, Tag to) {
  if (from == to) return;
  std::lock_guard lock(mutex_);
  remove(bytes, from);
  add(bytes, to);
}

void Allocator::count_external(size_t bytes, Tag tag) {
  std::lock_guard lock(mutex_);
  add(bytes, tag);
}

void Allocator::uncount_external(size_t bytes, Tag tag) {
  std::lock_guard lock(mutex_);
  remove(bytes, tag);
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

void Allocator::start_window() {
  std::lock_guard lock(mutex_);
  window_peak_ = stats_.live_bytes;
}

size_t Allocator::window_peak(Tag tag) const {
  std::lock_guard lock(mutex_);
  return window_peak_[static_cast<size_t>(tag)];
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
  // NUMBER [spaces] [UNIT]: NUMBER is digits with at most one '.', UNIT one of the table below.
  const auto fail = [&](const std::string& why) -> size_t {
    throw Error(detail::concat("parse_bytes: cannot parse byte count '", text, "': ", why));
  };
  size_t pos = 0, dots = 0, digits = 0;
  while (pos < text.size() && (std::isdigit(static_cast<unsigned char>(text[pos])) || text[pos] == '.')) {
    (text[pos] == '.' ? dots : digits) += 1;
    ++pos;
  }
  const std::string number = text.substr(0, pos);
  if (digits == 0)
    return fail("expected a number with an optional unit (B, KB, KiB, MB, MiB, GB, GiB, TB, TiB), e.g. 64MiB");
  if (dots > 1) return fail("'" + number + "' is not a number");
  size_t unit_start = pos;
  while (unit_start < text.size() && text[unit_start] == ' ') ++unit_start;
  std::string u;
  for (size_t i = unit_start; i < text.size(); ++i) u += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  static const struct {
    const char* name;
    uint64_t scale;
  } kUnits[] = {{"", 1},           {"b", 1},
                {"k", 1000},       {"kb", 1000},          {"kib", uint64_t{1} << 10},
                {"m", 1000000},    {"mb", 1000000},       {"mib", uint64_t{1} << 20},
                {"g", 1000000000}, {"gb", 1000000000},    {"gib", uint64_t{1} << 30},
                {"tb", 1000000000000}, {"tib", uint64_t{1} << 40}};
  uint64_t scale = 0;
  for (const auto& unit : kUnits)
    if (u == unit.name) scale = unit.scale;
  if (scale == 0)
    return fail("unknown unit '" + text.substr(unit_start) + "' (use B, KB, KiB, MB, MiB, GB, GiB, TB or TiB)");
  // The largest count accepted: byte sizes elsewhere are int64 (2^63 - 1, about 8 EiB).
  constexpr uint64_t kLargest = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  const std::string too_large = "more than 2^63 - 1 bytes";
  if (dots == 0) {  // an integer: exact
    uint64_t value = 0;
    auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
    if (ec != std::errc() || end != number.data() + number.size() || value > kLargest / scale) return fail(too_large);
    return static_cast<size_t>(value * scale);
  }
  if (scale == 1) return fail("a byte count without a unit (or in B) must be a whole number");
  double value = 0;
  auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (ec != std::errc() || end != number.data() + number.size()) return fail("'" + number + "' is not a number");
  const double bytes = std::round(value * static_cast<double>(scale));
  if (!(bytes < 9223372036854775808.0)) return fail(too_large);  // 2^63, exactly representable
  return static_cast<size_t>(bytes);
}

}  // namespace remat::memory
