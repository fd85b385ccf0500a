// Internal: XXH64, the 64-bit hash of the xxHash family, used as the checksum of every tensor of a
// training state (remat/nn/training_state.h). Written from the published specification
// (xxhash_spec.md, "XXH64 algorithm"), so that other tools can check a state with any XXH64
// implementation (e.g. Python's xxhash.xxh64_hexdigest).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace remat::io {

uint64_t xxh64(const void* data, size_t bytes, uint64_t seed = 0);
// The hash as 16 lower-case hexadecimal digits, as xxhash's hexdigest writes it.
std::string xxh64_hex(uint64_t hash);

}  // namespace remat::io
