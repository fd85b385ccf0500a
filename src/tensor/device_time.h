// Internal: device time added to counters without waiting for the device.
//
// A region times its first run, its recomputation and its backward with marks on its device
// (Backend::mark_time); on a device that runs asynchronously reading the seconds between two
// marks waits for the later one, so the reading is put off: add_device_seconds() hands the
// seconds to `sink` once the device has done the work (at once where it already has, as on the
// CPU), and settle_device_seconds() hands over every pending reading, waiting where it must. Whoever
// reads what the sinks write (the counters, the budget planner's profiles) settles first.
//
//   const TimeMark from = backend(device).mark_time();
//   run_the_work();
//   detail::add_device_seconds(device, from, backend(device).mark_time(), [p](double s) { p->seconds = s; });
//   ...
//   detail::settle_device_seconds();   // then read p->seconds
#pragma once

#include <functional>

#include "remat/backend.h"

namespace remat::detail {

using SecondsSink = std::function<void(double seconds)>;

// Calls sink(the device seconds between `from` and `to`) once they are known, on this thread, in
// the order of the calls. Readings of a device that has gone are dropped.
void add_device_seconds(Device device, const TimeMark& from, const TimeMark& to, SecondsSink sink);

// Hands every pending reading of this thread to its sink, waiting for the devices where needed.
void settle_device_seconds();

}  // namespace remat::detail
