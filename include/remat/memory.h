// remat/memory.h - the accounted allocator behind every byte of tensor storage.
//
// Every block carries a tag saying what it holds. The counters are the library's honest answer to
// "how much memory does this cost": tests and the CLI assert against them, never against RSS.
//
//   remat::memory::reset_peaks();                  // the peaks start again from what is live now
//   Tensor loss = remat::mean(model->forward(x));
//   loss.backward();
//   size_t saved_peak = remat::memory::stats().peak(remat::memory::Tag::saved);  // the step's peak
//
// Tags move with a block's role: a forward result starts as `other`; while the autodiff tape (or
// a checkpoint region) keeps it for a backward pass it is counted as `saved`; when released it
// returns to `other`. Parameters and gradients keep their own tags for their whole life.
//
// All functions are thread-safe. Blocks are 64-byte aligned.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace remat::memory {

enum class Tag : uint8_t { parameter = 0, gradient = 1, saved = 2, other = 3 };
inline constexpr size_t kTagCount = 4;
const char* tag_name(Tag tag);

inline constexpr size_t kAlignment = 64;

struct Stats {
  std::array<size_t, kTagCount> live_bytes{};       // bytes currently allocated, per tag
  std::array<size_t, kTagCount> peak_bytes{};       // high-water mark of live_bytes per tag since reset
  std::array<uint64_t, kTagCount> allocations{};    // allocations made per tag since reset (never decreases)
  size_t cached_bytes = 0;                          // freed blocks kept for reuse (not live; see below)
  size_t live_total = 0;                            // sum of live_bytes
  size_t peak_total = 0;                            // high-water mark of live_total since reset
  uint64_t allocations_total = 0;

  size_t live(Tag t) const { return live_bytes[static_cast<size_t>(t)]; }
  size_t peak(Tag t) const { return peak_bytes[static_cast<size_t>(t)]; }
};

// One allocator per device. Its counters are exact: they count the bytes asked for (not rounded
// up to the alignment), so a test can predict them from tensor shapes.
class Allocator {
 public:
  explicit Allocator(std::string device_name);
  virtual ~Allocator() = default;
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Throws remat::OutOfMemory (counters unchanged) when the memory cannot be had, after
  // returning the cached blocks to the system and trying once more.
  void* allocate(size_t bytes, Tag tag);
  void deallocate(void* pointer, size_t bytes, Tag tag);
  // Moves `bytes` from one tag's account to another's (the block itself stays where it is).
  void retag(size_t bytes, Tag from, Tag to);
  // Counts (and stops counting) memory this allocator did not allocate but a tensor uses: a
  // file's pages mapped into the process. Live and peak bytes include it; allocation counts do not.
  void count_external(size_t bytes, Tag tag);
  void uncount_external(size_t bytes, Tag tag);

  Stats stats() const;
  void reset_peaks();  // peaks := current live values; allocation counts := 0
  // A second high-water mark of live bytes per tag, restarted only by start_window(): the
  // library measures a step's peak with it (a budget's check) without touching reset_peaks().
  void start_window();
  size_t window_peak(Tag tag) const;

  // Freed blocks of 4 KiB and more are kept, by size, and handed out again for the same size, so
  // a training loop that allocates the same shapes every step stops paying for page faults.
  // Cached blocks are not live: the counters above never include them. `limit` bounds the cache
  // (default 1 GiB; 0 disables it); empty_cache() returns every cached block to the system.
  void set_cache_limit(size_t limit);
  void empty_cache();
  const std::string& device_name() const { return device_name_; }

 protected:
  // The raw memory source behind the cache, called with sizes rounded up to whole kAlignment
  // units; the CPU allocator uses aligned operator new. A device allocator overrides these two
  // and inherits the accounting and the cache. raw_allocate returns null (or throws
  // std::bad_alloc) when the memory cannot be had. A derived class whose raw_deallocate differs
  // calls empty_cache() in its destructor (the base's destructor cannot reach the override).
  virtual void* raw_allocate(size_t bytes);
  virtual void raw_deallocate(void* pointer, size_t bytes);
  // Appended to the OutOfMemory message (e.g. "; the device has 3 GiB free"); empty by default.
  virtual std::string out_of_memory_detail() const;
  // Blocks of at least this many bytes are cached (4 KiB by default).
  void set_smallest_cached_block(size_t bytes);

 private:
  void* cached_allocate(size_t bytes);
  void cached_deallocate(void* pointer, size_t bytes);
  void* try_raw_allocate(size_t bytes);
  void add(size_t bytes, Tag tag);
  void remove(size_t bytes, Tag tag);

  std::string device_name_;
  mutable std::mutex mutex_;
  Stats stats_;
  std::array<size_t, kTagCount> window_peak_{};
  // the cache of freed blocks (own lock: raw memory calls happen outside mutex_)
  mutable std::mutex cache_mutex_;
  std::unordered_map<size_t, std::vector<void*>> cache_;
  size_t cached_bytes_ = 0;
  size_t smallest_cached_ = 4096;
#if defined(__SANITIZE_ADDRESS__)
  size_t cache_limit_ = 0;  // under AddressSanitizer reuse would hide use-after-free bugs
#else
  size_t cache_limit_ = size_t(1) << 30;
#endif
};

// The CPU allocator, which holds all host tensor storage.
Allocator& cpu();

// Shorthands for the CPU allocator.
Stats stats();
void reset_peaks();
void empty_cache();
size_t live_bytes(Tag tag);
size_t peak_bytes(Tag tag);

// "12.5 MiB" style formatting and parsing ("64MiB", "1.5GB", "4096"). parse_bytes is strict: digits
// with at most one '.', optional spaces, an optional unit (B, K/KB, KiB, M/MB, MiB, G/GB, GiB, TB,
// TiB; any case); a plain byte count must be whole, decimals with a unit round to the nearest
// byte; at most 2^63 - 1 bytes. Anything else throws remat::Error quoting the text.
std::string format_bytes(double bytes);
size_t parse_bytes(const std::string& text);

}  // namespace remat::memory
