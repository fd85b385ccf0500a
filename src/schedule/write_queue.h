// Internal: the disk worker's queue of writes as the planners' suffix programmes see it (Note
// [writes behind the forward pass] in simulate.cpp, which simulate() charges).
#pragma once

#include <algorithm>
#include <limits>
#include <vector>

#include "remat/schedule.h"

namespace remat::schedule {

// The writes of a top-level suffix of a plan: `total`, their disk time, and `excess`, the most
// the queue runs past the loss, max over its offloaded nodes k of (the writes from k on) - (the
// forward compute after k); -infinity with no write. The suffix's time includes stall().
struct WriteQueue {
  double total = 0;
  double excess = -std::numeric_limits<double>::infinity();
  double stall() const { return excess > 0 ? excess : 0; }
  // The queue with one more write of `write` seconds in front, released with `window` seconds of
  // forward compute left before the loss. A prefix's choice adds ahead.stall() - stall() to the
  // suffix's time: so the suffix programmes price a plan's stall exactly, but as one plan per
  // entry carries one queue, a suffix that costs a little more and queues less is not kept
  // (docs/planners.md, "the cost of a transfer").
  WriteQueue ahead(double write, double window) const { return ahead(single(write), window); }
  // The queue with the writes of `front` (a plan spliced in front, its excess counted to its own
  // end) ahead, `window` being the forward compute from front's end to the loss.
  WriteQueue ahead(const WriteQueue& front, double window) const {
    return {front.total + total, std::max(excess, front.excess + total - window)};
  }
  // One write, at the end of its node (the loss next).
  static WriteQueue single(double write) { return {write, write}; }
  bool no_worse_than(const WriteQueue& other) const { return total <= other.total && excess <= other.excess; }
};

// The forward compute from stage i to the loss, i = 0..L (the last entry 0).
inline std::vector<double> forward_after(const ChainCosts& costs) {
  std::vector<double> after(costs.forward_time.size() + 1, 0.0);
  for (size_t i = costs.forward_time.size(); i-- > 0;) after[i] = after[i + 1] + costs.forward_time[i];
  return after;
}

}  // namespace remat::schedule
