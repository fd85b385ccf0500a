// Internal: a 64-bit digest of a tensor's values, for checking that a recomputation reproduced
// its first run bit for bit (region.cpp, dynamic.cpp). See Note [recomputation check] in digest.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "remat/tensor.h"

namespace remat::detail {

// The digest of t's values in logical order, taken on t's device, or nullopt where the check does
// not apply (the check is off, the value is one a recomputation skipped, or t's device has no
// digest kernel).
std::optional<uint64_t> recompute_digest(const Tensor& t);

// The error for a recomputed value that differs from its first run: names `what` (a layer or an
// op) and the usual causes.
std::string recompute_mismatch(const std::string& what);

}  // namespace remat::detail
