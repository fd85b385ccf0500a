// remat/random.h - counter-based random numbers (Philox-4x32-10).
//
// Every random value is a pure function of (seed, offset + i): the same (seed, offset) gives the
// same numbers whatever the thread count, and a checkpoint region that restores the generator's
// state at entry replays exactly the same dropout masks.
//
//   remat::manual_seed(42);
//   Tensor noise = remat::randn({128, 64});         // draws from the default generator
//   Tensor same  = remat::randn({128, 64}, DType::f32, {42, 0});  // explicit state: same values
#pragma once

#include <cstdint>

#include "remat/tensor.h"

namespace remat {

struct RngState {
  uint64_t seed = 0;
  uint64_t offset = 0;  // counts 32-bit random words consumed
  bool operator==(const RngState&) const = default;
};

// The process-wide default generator (thread-safe).
RngState rng_state();
void set_rng_state(RngState state);
void manual_seed(uint64_t seed);  // seed := seed, offset := 0
// Claims `words` consecutive 32-bit words from the default generator and returns the state to
// draw them from. Offsets are rounded up to whole Philox blocks of 4 words.
RngState rng_reserve(uint64_t words);

// Philox-4x32-10 block function: 4 random 32-bit words for a 128-bit counter and 64-bit key.
struct Philox4 {
  uint32_t v[4];
};
Philox4 philox4x32(uint64_t counter, uint64_t key);
// The same block function on a full 128-bit counter (words c[0] .. c[3], low word first) and key
// (k[0], k[1]); philox4x32(counter, key) is this with c = {counter, counter >> 32, 0, 0} and
// k = {key, key >> 32}. Its outputs match Random123's published known-answer vectors.
Philox4 philox4x32(const Philox4& counter, uint32_t key0, uint32_t key1);
// The `index`-th 32-bit word of the stream (seed, offset).
uint32_t philox_word(RngState state, uint64_t index);
// Converts a 32-bit word to a uniform float in [0, 1) with 24 (f32) or 32 bits of randomness.
inline float uniform_float(uint32_t word) { return static_cast<float>(word >> 8) * (1.0f / 16777216.0f); }
inline double uniform_double(uint32_t word) { return static_cast<double>(word) * (1.0 / 4294967296.0); }

// Uniform [low, high) and standard normal tensors. Without a state they draw from the default
// generator; with one they are a pure function of it.
// Each draws on `device` (default: the CPU); the values do not depend on the device.
Tensor rand(const Shape& shape, DType dtype = DType::f32, double low = 0.0, double high = 1.0, Device device = {});
Tensor rand(const Shape& shape, DType dtype, RngState state, double low = 0.0, double high = 1.0, Device device = {});
Tensor randn(const Shape& shape, DType dtype = DType::f32, double mean = 0.0, double stddev = 1.0, Device device = {});
Tensor randn(const Shape& shape, DType dtype, RngState state, double mean = 0.0, double stddev = 1.0,
             Device device = {});

}  // namespace remat
