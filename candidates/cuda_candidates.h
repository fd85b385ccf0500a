// The CUDA candidates as harness entries (candidates/harness.h), for a CUDA device in use.
#pragma once

#include <vector>

#include "candidates/harness.h"

namespace remat::candidates {

// Every CUDA candidate with its cases; the 16-bit cases only where the device holds bf16 (the
// backend option sixteen_bit).
std::vector<Candidate> cuda_candidates(Device device);

}  // namespace remat::candidates
