// Online checkpointing: snapshot placement by doubling, reverse by offline Revolve per segment.
#include <algorithm>
#include <cstdint>
#include <limits>
#include "remat/error.h"
#include <string>
#include <vector>

#include "remat/schedule.h"
#include "revolve_internal.h"

namespace remat::schedule {

OnlineCheckpointer::OnlineCheckpointer(int slots) : slots_(slots) {
  if (slots < 1)
    throw Error("OnlineCheckpointer(slots=" + std::to_string(slots) + "): needs at least 1 slot");
  slot_state_.assign(static_cast<size_t>(slots), -1);
}

OnlineCheckpointer::Decision OnlineCheckpointer::on_step() {
  if (steps_ >= kMaxScheduleSteps)
    throw Error("OnlineCheckpointer: more than " + std::to_string(kMaxScheduleSteps) +
                " steps (2^24, the longest schedule remat materialises)");
  const int64_t state = steps_;
  Decision decision;
  const auto free_slot = [&]() {
    for (int slot = 0; slot < slots_; ++slot)
      if (slot_state_[static_cast<size_t>(slot)] < 0) return slot;
    return -1;
  };
  if (state % spacing_ == 0) {
    int slot = free_slot();
    if (slot < 0 && slots_ > 1) {
      // All slots hold the multiples 0, d, ..., (s-1)d and state == s*d: double the spacing and
      // release what is not a multiple of it (at least the snapshot of x_d).
      spacing_ *= 2;
      for (int64_t& held : slot_state_)
        if (held % spacing_ != 0) held = -1;
      if (state % spacing_ == 0) slot = free_slot();
    }
    if (slot >= 0) {
      slot_state_[static_cast<size_t>(slot)] = state;
      decision = {true, slot};
      forward_log_.push_back({RevolveAction::Kind::takeshot, state, slot});
    }
  }
  forward_log_.push_back({RevolveAction::Kind::advance, state + 1, -1});
  ++steps_;
  return decision;
}

std::vector<std::pair<int64_t, int>> OnlineCheckpointer::snapshots() const {
  std::vector<std::pair<int64_t, int>> held;
  for (int slot = 0; slot < slots_; ++slot)
    if (slot_state_[static_cast<size_t>(slot)] >= 0) held.emplace_back(slot_state_[static_cast<size_t>(slot)], slot);
  std::sort(held.begin(), held.end());
  return held;
}

std::vector<RevolveAction> OnlineCheckpointer::reverse_schedule() const {
  std::vector<RevolveAction> out;
  const int64_t n = steps_;
  if (n == 0) return out;
  const std::vector<std::pair<int64_t, int>> held = snapshots();  // held[0] is x0
  const size_t count = held.size();

  // cost[j][i]: least forward steps to reverse x_{held[j]}..x_n when held[j] is kept as the i-th
  // kept snapshot (i kept before it hold their slots, so Revolve gets s - i slots); next[j][i]:
  // the next kept snapshot (count = none).
  constexpr int64_t kInfinite = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> cost(count, std::vector<int64_t>(count, kInfinite));
  std::vector<std::vector<size_t>> next(count, std::vector<size_t>(count, count));
  for (size_t j = count; j-- > 0;) {
    for (size_t i = 0; i <= j; ++i) {
      const int available = slots_ - static_cast<int>(i);
      int64_t best = revolve_optimal_forward_steps(n - held[j].first, available);
      size_t best_next = count;
      for (size_t after = j + 1; after < count && available > 1; ++after) {
        if (cost[after][i + 1] == kInfinite) continue;
        const int64_t candidate =
            revolve_optimal_forward_steps(held[after].first - held[j].first, available) + cost[after][i + 1];
        if (candidate < best) {
          best = candidate;
          best_next = after;
        }
      }
      cost[j][i] = best;
      next[j][i] = best_next;
    }
  }
  std::vector<size_t> kept;
  for (size_t j = 0, i = 0; j < count; j = next[j][i], ++i) kept.push_back(j);

  detail::RevolveWriter writer(out, n);
  for (size_t position = kept.size(); position-- > 0;) {
    const int64_t begin = held[kept[position]].first;
    const int64_t end = position + 1 < kept.size() ? held[kept[position + 1]].first : n;
    // Free: every slot except those of the kept snapshots up to this one.
    std::vector<bool> busy(static_cast<size_t>(slots_), false);
    for (size_t k = 0; k <= position; ++k) busy[static_cast<size_t>(held[kept[k]].second)] = true;
    std::vector<int> free_slots;
    for (int slot = slots_ - 1; slot >= 0; --slot)
      if (!busy[static_cast<size_t>(slot)]) free_slots.push_back(slot);
    writer.reverse(begin, end, held[kept[position]].second, free_slots);
  }
  return out;
}

std::vector<RevolveAction> OnlineCheckpointer::full_schedule() const {
  std::vector<RevolveAction> out = forward_log_;
  const std::vector<RevolveAction> reverse = reverse_schedule();
  out.insert(out.end(), reverse.begin(), reverse.end());
  return out;
}

}  // namespace remat::schedule
