// Deferred device timings (device_time.h).
//
// Note [timing without waiting]. Timing a region used to mean synchronize(), read the clock, run,
// synchronize(), read the clock: on a GPU every region then drained the device's queue twice and
// the host's next launches were exposed. A mark costs nothing on the host (a CUDA event recorded
// on the stream); its seconds are read when the work is done. Readings are kept per thread in
// call order (a profile's field is assigned, so a later reading must land after an earlier one)
// and handed over as soon as the oldest is ready; the queue is bounded, so a program that never
// reads its counters waits at worst for work kMaxPending readings old.
#include "tensor/device_time.h"

#include <deque>

namespace remat::detail {

namespace {

constexpr size_t kMaxPending = 4096;

struct Pending {
  Device device;
  TimeMark from, to;
  SecondsSink sink;
};

std::deque<Pending>& pending() {
  thread_local std::deque<Pending> queue;
  return queue;
}

// Hands the oldest reading to its sink (waiting for it where `wait`); false if it is not ready.
bool settle_front(bool wait) {
  std::deque<Pending>& queue = pending();
  Pending& p = queue.front();
  if (!has_backend(p.device)) {
    queue.pop_front();
    return true;
  }
  Backend& b = backend(p.device);
  if (!wait && !b.time_ready(p.to)) return false;
  Pending taken = std::move(p);
  queue.pop_front();
  taken.sink(b.seconds_between(taken.from, taken.to));
  return true;
}

}  // namespace

void add_device_seconds(Device device, const TimeMark& from, const TimeMark& to, SecondsSink sink) {
  std::deque<Pending>& queue = pending();
  queue.push_back({device, from, to, std::move(sink)});
  while (!queue.empty() && settle_front(queue.size() > kMaxPending)) {
  }
}

void settle_device_seconds() {
  std::deque<Pending>& queue = pending();
  while (!queue.empty()) settle_front(true);
}

}  // namespace remat::detail
