// Revolve (binomial checkpointing) for uniform chains: closed forms, schedule, replayer.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <numeric>
#include <sstream>
#include "remat/error.h"
#include <string>
#include <vector>

#include "remat/schedule.h"
#include "revolve_internal.h"

namespace remat::schedule {

namespace {

std::string describe(const char* function, int64_t n, int s) {
  std::ostringstream out;
  out << function << "(n=" << n << ", s=" << s << ")";
  return out.str();
}

void check_arguments(const char* function, int64_t n, int s) {
  if (n < 0) throw Error(describe(function, n, s) + ": the step count n must be >= 0");
  if (s < 1) throw Error(describe(function, n, s) + ": the slot count s must be >= 1");
}

// Slots beyond n change no schedule and no count (n - 1 of them already store all); bounding s by
// n keeps s + 1 and the binomials within range for any s a caller passes (INT_MAX included).
int useful_slots(int64_t n, int s) { return static_cast<int>(std::min<int64_t>(s, std::max<int64_t>(n, 1))); }

}  // namespace

uint64_t binomial_beta(int s, int r) {
  if (s < 0 || r < 0) return 0;
  // C(s + r, k) with k = min(s, r): after step i the running value is C(s + r - k + i, i).
  const int k = std::min(s, r);
  const uint64_t top = static_cast<uint64_t>(s) + static_cast<uint64_t>(r) - static_cast<uint64_t>(k);
  uint64_t value = 1;
  for (int i = 1; i <= k; ++i) {
    // value * (top + i) is divisible by i; divide first so that only the result can overflow.
    const uint64_t divisor = static_cast<uint64_t>(i);
    const uint64_t common = std::gcd(value, divisor);
    const uint64_t factor = (top + divisor) / (divisor / common);
    value /= common;
    if (value > UINT64_MAX / factor) return UINT64_MAX;  // later factors only grow it
    value *= factor;
  }
  return value;
}

int revolve_repetition_number(int64_t n, int s) {
  check_arguments("revolve_repetition_number", n, s);
  s = useful_slots(n, s);
  if (n <= 1) return 0;
  if (s == 1) {  // beta(1, r) = r + 1
    if (n - 1 > INT_MAX)
      throw Error(describe("revolve_repetition_number", n, s) + ": r exceeds int");
    return static_cast<int>(n - 1);
  }
  // beta(s, r) is increasing in r; binary search the smallest r with beta(s, r) >= n.
  int64_t low = 1, high = 1;
  while (binomial_beta(s, static_cast<int>(high)) < static_cast<uint64_t>(n)) high *= 2;
  while (low < high) {
    const int64_t mid = low + (high - low) / 2;
    if (binomial_beta(s, static_cast<int>(mid)) >= static_cast<uint64_t>(n))
      high = mid;
    else
      low = mid + 1;
  }
  return static_cast<int>(low);
}

int64_t revolve_optimal_forward_steps(int64_t n, int s) {
  check_arguments("revolve_optimal_forward_steps", n, s);
  s = useful_slots(n, s);
  const int r = revolve_repetition_number(n, s);
  const uint64_t rows = static_cast<uint64_t>(r), steps = static_cast<uint64_t>(n);
  const uint64_t subtract = binomial_beta(s + 1, r - 1);  // <= r * n, since t(n, s) >= 0
  if (rows != 0 && steps > UINT64_MAX / rows)
    throw Error(describe("revolve_optimal_forward_steps", n, s) + ": result exceeds int64");
  const uint64_t result = rows * steps - subtract;
  if (result > static_cast<uint64_t>(INT64_MAX))
    throw Error(describe("revolve_optimal_forward_steps", n, s) + ": result exceeds int64");
  return static_cast<int64_t>(result);
}

std::string to_string(const RevolveAction& action) {
  std::ostringstream out;
  switch (action.kind) {
    case RevolveAction::Kind::advance: out << "advance(" << action.step << ")"; break;
    case RevolveAction::Kind::takeshot: out << "takeshot(x" << action.step << " -> slot " << action.slot << ")"; break;
    case RevolveAction::Kind::restore: out << "restore(slot " << action.slot << " = x" << action.step << ")"; break;
    case RevolveAction::Kind::firsturn: out << "firsturn(" << action.step << ")"; break;
    case RevolveAction::Kind::youturn: out << "youturn(" << action.step << ")"; break;
  }
  return out.str();
}

namespace detail {

// The first advance m (1 <= m < l) of an optimal schedule for l >= 2 steps and s >= 2 slots.
// t(., s) is convex and piecewise linear with slope r on (beta(s, r-1), beta(s, r)], so
// m + t(l-m, s-1) + t(m, s) is minimal exactly when both parts sit on matching pieces:
// beta(s, r-2) <= m <= beta(s, r-1) and beta(s-1, r-1) <= l - m <= beta(s-1, r), r = r(l, s).
// The interval is non-empty because beta(s, r-1) + beta(s-1, r) = beta(s, r) >= l.
int64_t revolve_split(int64_t l, int s) {
  const int r = revolve_repetition_number(l, s);
  const auto beta = [](int ss, int rr) {
    const uint64_t b = binomial_beta(ss, rr);
    return b > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(b);
  };
  const int64_t low = std::max<int64_t>({1, beta(s, r - 2), l - beta(s - 1, r)});
  const int64_t high = std::min<int64_t>({l - 1, beta(s, r - 1), l - beta(s - 1, r - 1)});
  if (low > high) throw Error("revolve_split: empty optimal interval (internal error)");
  return high;
}

void RevolveWriter::ensure_at(int64_t state, int slot) {
  if (current_ != state) {
    out_.push_back({RevolveAction::Kind::restore, state, slot});
    current_ = state;
  }
}

void RevolveWriter::advance(int64_t to) {
  if (to != current_) out_.push_back({RevolveAction::Kind::advance, to, -1});
  current_ = to;
}

void RevolveWriter::takeshot(int slot) { out_.push_back({RevolveAction::Kind::takeshot, current_, slot}); }

void RevolveWriter::turn(int64_t step) {
  out_.push_back({first_turn_ ? RevolveAction::Kind::firsturn : RevolveAction::Kind::youturn, step, -1});
  first_turn_ = false;
  current_ = -1;  // the state after a turn is undefined
}

void RevolveWriter::reverse(int64_t begin, int64_t end, int slot_of_begin, std::vector<int>& free_slots) {
  while (end > begin) {
    const int64_t length = end - begin;
    ensure_at(begin, slot_of_begin);
    if (length == 1) {
      turn(begin);
      return;
    }
    if (free_slots.empty()) {  // one slot: walk from begin to the last state each time
      advance(end - 1);
      turn(end - 1);
      --end;
      continue;
    }
    const int slots = 1 + static_cast<int>(free_slots.size());
    const int64_t split = begin + revolve_split(length, slots);
    advance(split);
    const int slot = free_slots.back();
    free_slots.pop_back();
    takeshot(slot);
    reverse(split, end, slot, free_slots);
    free_slots.push_back(slot);
    end = split;
  }
}

}  // namespace detail

std::vector<RevolveAction> revolve_schedule(int64_t n, int s) {
  check_arguments("revolve_schedule", n, s);
  s = useful_slots(n, s);
  if (n > kMaxScheduleSteps)
    throw Error(describe("revolve_schedule", n, s) + ": n exceeds " + std::to_string(kMaxScheduleSteps) +
                " (2^24) steps, the longest schedule remat materialises (about 4 actions of 24 bytes per step)");
  std::vector<RevolveAction> out;
  if (n == 0) return out;
  detail::RevolveWriter writer(out, 0);
  writer.takeshot(0);
  if (s >= n - 1) {
    // Store-all: snapshots of x0..x_{n-2} (x_{n-1} is consumed by the first turn directly).
    for (int64_t k = 1; k <= n - 1; ++k) {
      writer.advance(k);
      if (k <= n - 2) writer.takeshot(static_cast<int>(k));
    }
    for (int64_t k = n - 1; k >= 0; --k) {
      writer.ensure_at(k, static_cast<int>(k));
      writer.turn(k);
    }
    return out;
  }
  std::vector<int> free_slots;  // a stack; slot 1 is taken first
  for (int slot = s - 1; slot >= 1; --slot) free_slots.push_back(slot);
  writer.reverse(0, n, 0, free_slots);
  return out;
}

RevolveReplay replay_revolve(const std::vector<RevolveAction>& schedule, int64_t n, int s) {
  check_arguments("replay_revolve", n, s);
  RevolveReplay result;
  std::vector<int64_t> slot_state(static_cast<size_t>(s), -1);
  std::vector<bool> slot_written(static_cast<size_t>(s), false);
  int64_t current = 0;         // -1: undefined (after a turn)
  int64_t next_turn = n - 1;   // steps are reversed in order n-1..0
  for (size_t position = 0; position < schedule.size(); ++position) {
    const RevolveAction& action = schedule[position];
    const auto fail = [&](const std::string& why) {
      std::ostringstream out;
      out << "replay_revolve(n=" << n << ", s=" << s << "): action " << position << " " << to_string(action)
          << ": " << why;
      throw Error(out.str());
    };
    const bool slot_ok = action.slot >= 0 && action.slot < s;
    switch (action.kind) {
      case RevolveAction::Kind::advance:
        if (current < 0) fail("no current state (advance after a turn needs a restore first)");
        if (action.step <= current) fail("advance must move forward from x" + std::to_string(current));
        if (action.step > n) fail("advance beyond x_n");
        result.forward_steps += action.step - current;
        current = action.step;
        break;
      case RevolveAction::Kind::takeshot:
        if (!slot_ok) fail("slot outside [0, s)");
        if (current < 0) fail("no current state to store");
        if (action.step != current) fail("stores x" + std::to_string(current) + ", not the stated state");
        slot_state[static_cast<size_t>(action.slot)] = current;
        if (!slot_written[static_cast<size_t>(action.slot)]) ++result.slots_used;
        slot_written[static_cast<size_t>(action.slot)] = true;
        ++result.snapshots_taken;
        break;
      case RevolveAction::Kind::restore:
        if (!slot_ok) fail("slot outside [0, s)");
        if (slot_state[static_cast<size_t>(action.slot)] < 0) fail("restore from an empty slot");
        if (slot_state[static_cast<size_t>(action.slot)] != action.step)
          fail("the slot holds x" + std::to_string(slot_state[static_cast<size_t>(action.slot)]));
        current = action.step;
        break;
      case RevolveAction::Kind::firsturn:
      case RevolveAction::Kind::youturn: {
        const bool first = next_turn == n - 1;
        if (next_turn < 0) fail("every step is already reversed");
        if ((action.kind == RevolveAction::Kind::firsturn) != first)
          fail(first ? "the first turn must be firsturn" : "only the first turn is firsturn");
        if (action.step != next_turn) fail("expected the turn of step " + std::to_string(next_turn));
        if (current != action.step) fail("the current state is not x" + std::to_string(action.step));
        --next_turn;
        current = -1;
        break;
      }
    }
  }
  if (next_turn >= 0) {
    std::ostringstream out;
    out << "replay_revolve(n=" << n << ", s=" << s << "): schedule ends with step " << next_turn
        << " not reversed";
    throw Error(out.str());
  }
  return result;
}

}  // namespace remat::schedule
