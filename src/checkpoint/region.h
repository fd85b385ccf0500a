// Internal: what layer calls, checkpoint segments and loops share: the region counters, and where a
// region's values live.
//
// Note [what a recomputation version-checks]. A recomputation reads again what its first run read.
// A loop keeps the versions of every storage its untaped steps read and compares them before it
// re-runs them (versions.h); a segment holds what its ops read from outside as saved values, which
// check their own versions, or as a parameter's handle and the version it was read at
// (segment.cpp). A mismatch is an error: the first run's values are gone.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "remat/call.h"
#include "remat/counters.h"
#include "remat/tensor.h"
#include "tensor/device_time.h"

namespace remat::detail {

// The device of the first defined tensor (the CPU if there is none).
inline Device device_of(const TensorList& tensors) {
  for (const auto& t : tensors)
    if (t.defined()) return t.device();
  return Device{};
}

// Counters shared by segments, loops and the dispatcher (thread-local).
struct RegionCounters {
  uint64_t created = 0;
  uint64_t recomputed = 0;
  uint64_t run_in_backward = 0;  // regions recomputed since the last top-level backward ended
  uint64_t loops_run_in_backward = 0;  // scan / while_loop backward passes (they recompute) since then
  uint64_t layer_calls = 0;      // layer calls met (call.cpp)
  uint64_t layer_calls_since_backward = 0;
  std::vector<RegionRecord> records;
  std::unordered_map<std::string, size_t> first_record_of;  // label -> its first row in records
};
RegionCounters& region_counters();

// Region records: one row per region up to this many; beyond, a region adds to the first row of
// its label (a label not seen yet is left out), so a long run keeps a bounded table.
constexpr size_t kMaxRegionRecords = 4096;

// Adds seconds to a field of this thread's region record `index` (when it still exists).
inline detail::SecondsSink record_sink(size_t index, double RegionRecord::*field) {
  return [index, field](double seconds) {
    auto& records = region_counters().records;
    if (index < records.size()) records[index].*field += seconds;
  };
}

// An explicit region (remat::checkpoint, or a call whose role is `layer` inside another layer):
// a segment under site.policy unless that policy keeps everything or grad mode is off (then a
// plain call). Implemented in call.cpp.
TensorList explicit_region(const RegionFn& fn, const TensorList& inputs, const CallSite& site,
                           std::shared_ptr<RegionProfile> profile);

}  // namespace remat::detail
