// Heterogeneous chains: ChainCosts' validation (every field and how they fit together) and the
// uniform chain.
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "chain_internal.h"
#include "remat/schedule.h"

namespace remat::schedule {

void ChainCosts::validate() const {
  const std::string function = "ChainCosts::validate";
  const size_t stages = forward_time.size();
  if (stages == 0) invalid(function, "the chain has no stage (forward_time is empty)");
  if (stages > static_cast<size_t>(std::numeric_limits<int>::max() / 4)) invalid(function, "too many stages");
  if (backward_time.size() != stages || saved_bytes.size() != stages || boundary_bytes.size() != stages + 1) {
    std::ostringstream out;
    out << "sizes differ: forward_time " << stages << ", backward_time " << backward_time.size()
        << ", saved_bytes " << saved_bytes.size() << " (all L), boundary_bytes " << boundary_bytes.size()
        << " (L + 1)";
    invalid(function, out.str());
  }
  if (!saved_output_bytes.empty() && saved_output_bytes.size() != stages)
    invalid(function, "saved_output_bytes has " + std::to_string(saved_output_bytes.size()) +
                          " entries; it must be empty or have one per stage (" + std::to_string(stages) + ")");
  for (size_t i = 0; i < saved_output_bytes.size(); ++i)
    if (saved_output_bytes[i] > std::min(saved_bytes[i], boundary_bytes[i + 1]))
      invalid(function, "saved_output_bytes[" + std::to_string(i) + "] = " + std::to_string(saved_output_bytes[i]) +
                            " exceeds the stage's record (" + std::to_string(saved_bytes[i]) + ") or its output (" +
                            std::to_string(boundary_bytes[i + 1]) + ")");
  if (!saved_input_bytes.empty() && saved_input_bytes.size() != stages)
    invalid(function, "saved_input_bytes has " + std::to_string(saved_input_bytes.size()) +
                          " entries; it must be empty or have one per stage (" + std::to_string(stages) + ")");
  for (size_t i = 0; i < saved_input_bytes.size(); ++i)
    if (saved_input_bytes[i] > boundary_bytes[i])
      invalid(function, "saved_input_bytes[" + std::to_string(i) + "] = " + std::to_string(saved_input_bytes[i]) +
                            " exceeds the stage's input (" + std::to_string(boundary_bytes[i]) + ")");
  if (!streamed_bytes.empty() && streamed_bytes.size() != stages)
    invalid(function, "streamed_bytes has " + std::to_string(streamed_bytes.size()) +
                          " entries; it must be empty or have one per stage (" + std::to_string(stages) + ")");
  for (const SweptValue& v : swept_values)
    if (v.read_by < 1 || static_cast<size_t>(v.read_by) >= stages || v.made_by < -1 || v.made_by > v.read_by - 2)
      invalid(function, "a swept value read by stage " + std::to_string(v.read_by) + " and made by stage " +
                            std::to_string(v.made_by) + ": it must be read by a stage in 1.." +
                            std::to_string(stages - 1) + " and made before the stage ahead of it (-1: before the chain)");
  std::vector<const GapSaved*> gap_first(gap_saved.size(), nullptr);
  for (const GapSaved& g : gap_saved) {
    if (g.stage < 0 || static_cast<size_t>(g.stage) >= stages)
      invalid(function, "a gap's saved value is before stage " + std::to_string(g.stage) + "; it must be in 0.." +
                            std::to_string(stages - 1));
    if (g.value < -1 || static_cast<size_t>(g.value + 1) > gap_saved.size())
      invalid(function, "a gap's saved value index is " + std::to_string(g.value) + "; it must be -1 (its own) or 0.." +
                            std::to_string(gap_saved.size() - 1));
    if (g.value < 0) continue;
    const GapSaved*& first = gap_first[static_cast<size_t>(g.value)];
    if (first && first->bytes != g.bytes)
      invalid(function, "gap saved value " + std::to_string(g.value) + " has two sizes (" + std::to_string(first->bytes) +
                            " and " + std::to_string(g.bytes) + " B)");
    if (!first) first = &g;
  }
  std::vector<const SweptValue*> first_of(swept_values.size(), nullptr);
  for (const SweptValue& v : swept_values) {
    if (v.value < -1 || static_cast<size_t>(v.value + 1) > swept_values.size())
      invalid(function, "a swept value's value index is " + std::to_string(v.value) + "; it must be -1 (its own) or 0.." +
                            std::to_string(swept_values.size() - 1) + " (one per entry at most)");
    if (v.value < 0) continue;
    const SweptValue*& first = first_of[static_cast<size_t>(v.value)];
    if (first && (first->bytes != v.bytes || first->made_by != v.made_by))
      invalid(function, "swept value " + std::to_string(v.value) + " has two sizes or makers (" +
                            std::to_string(first->bytes) + " B by stage " + std::to_string(first->made_by) + ", " +
                            std::to_string(v.bytes) + " B by stage " + std::to_string(v.made_by) + ")");
    if (!first) first = &v;
  }
  if (std::isnan(offload_seconds_per_byte) || std::isinf(offload_seconds_per_byte)) {
    std::ostringstream out;
    out << "offload_seconds_per_byte is " << offload_seconds_per_byte << "; it must be finite (negative: no offload)";
    invalid(function, out.str());
  }
  if (!std::isfinite(offload_write_seconds_per_byte) || offload_write_seconds_per_byte < 0 ||
      (can_offload() && offload_write_seconds_per_byte > offload_seconds_per_byte)) {
    std::ostringstream out;
    out << "offload_write_seconds_per_byte is " << offload_write_seconds_per_byte
        << "; it must be finite, >= 0 and at most offload_seconds_per_byte (" << offload_seconds_per_byte
        << "), the write being part of a transfer";
    invalid(function, out.str());
  }
  for (size_t i = 0; i < stages; ++i) {
    if (!std::isfinite(forward_time[i]) || forward_time[i] < 0 || !std::isfinite(backward_time[i]) ||
        backward_time[i] < 0) {
      std::ostringstream out;
      out << "stage " << i << " has forward_time " << forward_time[i] << " and backward_time " << backward_time[i]
          << "; times must be finite and >= 0";
      invalid(function, out.str());
    }
  }
  // Every peak is a sum of distinct buffers; keep the total far from overflow.
  constexpr size_t kLimit = size_t{1} << 60;
  size_t total = 0;
  const std::vector<size_t> swept = [&] {
    std::vector<size_t> out;
    for (const SweptValue& v : swept_values) out.push_back(v.bytes);
    for (const GapSaved& g : gap_saved) out.push_back(g.bytes);
    return out;
  }();
  for (const std::vector<size_t>* sizes : {&boundary_bytes, &saved_bytes, &swept})
    for (size_t bytes : *sizes) {
      if (bytes > kLimit || total > kLimit - bytes) invalid(function, "the sizes sum to more than 2^60 bytes");
      total += bytes;
    }
  if (total > kLimit / 2) invalid(function, "the sizes sum to more than 2^59 bytes");
}

ChainCosts ChainCosts::uniform(int stages, double forward, double backward, size_t boundary, size_t saved) {
  if (stages < 1) invalid("ChainCosts::uniform", "stages must be >= 1, got " + std::to_string(stages));
  ChainCosts costs;
  costs.forward_time.assign(static_cast<size_t>(stages), forward);
  costs.backward_time.assign(static_cast<size_t>(stages), backward);
  costs.boundary_bytes.assign(static_cast<size_t>(stages) + 1, boundary);
  costs.saved_bytes.assign(static_cast<size_t>(stages), saved);
  return costs;
}

}  // namespace remat::schedule
