// Shared by revolve.cpp and online.cpp: the writer that emits Revolve actions.
#pragma once

#include <cstdint>
#include <vector>

#include "remat/schedule.h"

namespace remat::schedule::detail {

// The first advance of an optimal schedule for l >= 2 steps and s >= 2 slots.
int64_t revolve_split(int64_t l, int s);

// Appends actions to `out`, tracking the current state (-1: undefined, after a turn).
class RevolveWriter {
 public:
  RevolveWriter(std::vector<RevolveAction>& out, int64_t current, bool first_turn = true)
      : out_(out), current_(current), first_turn_(first_turn) {}
  void ensure_at(int64_t state, int slot);  // restore(slot) unless already at `state`
  void advance(int64_t to);
  void takeshot(int slot);
  void turn(int64_t step);
  // Reverses steps begin..end-1 optimally. x_begin is in slot_of_begin; free_slots (a stack)
  // are the other slots it may use; they are all free again on return.
  void reverse(int64_t begin, int64_t end, int slot_of_begin, std::vector<int>& free_slots);

 private:
  std::vector<RevolveAction>& out_;
  int64_t current_;
  bool first_turn_;
};

}  // namespace remat::schedule::detail
