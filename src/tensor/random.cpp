// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011).
#include "remat/random.h"

#include <mutex>

#include "remat/backend.h"
#include "tensor/allocate.h"

namespace remat {

namespace {
std::mutex generator_mutex;
RngState default_state{0x5eed, 0};
}  // namespace

RngState rng_state() {
  std::lock_guard lock(generator_mutex);
  return default_state;
}

void set_rng_state(RngState state) {
  std::lock_guard lock(generator_mutex);
  default_state = state;
}

void manual_seed(uint64_t seed) { set_rng_state({seed, 0}); }

RngState rng_reserve(uint64_t words) {
  std::lock_guard lock(generator_mutex);
  RngState claimed = default_state;
  default_state.offset += (words + 3) / 4 * 4;
  return claimed;
}

Philox4 philox4x32(const Philox4& counter, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = counter.v[0], c1 = counter.v[1], c2 = counter.v[2], c3 = counter.v[3];
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = static_cast<uint32_t>(p1);
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = static_cast<uint32_t>(p0);
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += kW0;
    k1 += kW1;
  }
  return {{c0, c1, c2, c3}};
}

Philox4 philox4x32(uint64_t counter, uint64_t key) {
  return philox4x32(Philox4{{static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0, 0}},
                    static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32));
}

uint32_t philox_word(RngState state, uint64_t index) {
  uint64_t word = state.offset + index;
  return philox4x32(word / 4, state.seed).v[word % 4];
}

Tensor rand(const Shape& shape, DType dtype, RngState state, double low, double high, Device device) {
  REMAT_CHECK(is_floating(dtype), "rand: dtype must be floating (f32, f64, bf16, f16), got ", dtype_name(dtype));
  REMAT_CHECK(high > low, "rand: empty range [", low, ", ", high, ")");
  Tensor t = detail::allocate_tensor("rand", shape, dtype, memory::Tag::other, device);
  backend(device).rand_uniform(t, state, low, high);
  return t;
}

Tensor rand(const Shape& shape, DType dtype, double low, double high, Device device) {
  REMAT_CHECK(is_floating(dtype), "rand: dtype must be floating (f32, f64, bf16, f16), got ", dtype_name(dtype));
  // validate (range and shape) before claiming words: a failed call leaves the generator as it was
  REMAT_CHECK(high > low, "rand: empty range [", low, ", ", high, ")");
  Tensor t = detail::allocate_tensor("rand", shape, dtype, memory::Tag::other, device);
  backend(device).rand_uniform(t, rng_reserve(static_cast<uint64_t>(shape_numel(shape))), low, high);
  return t;
}

Tensor randn(const Shape& shape, DType dtype, RngState state, double mean, double stddev, Device device) {
  REMAT_CHECK(is_floating(dtype), "randn: dtype must be floating (f32, f64, bf16, f16), got ", dtype_name(dtype));
  REMAT_CHECK(stddev >= 0, "randn: negative standard deviation ", stddev);
  Tensor t = detail::allocate_tensor("randn", shape, dtype, memory::Tag::other, device);
  backend(device).rand_normal(t, state, mean, stddev);
  return t;
}

Tensor randn(const Shape& shape, DType dtype, double mean, double stddev, Device device) {
  REMAT_CHECK(is_floating(dtype), "randn: dtype must be floating (f32, f64, bf16, f16), got ", dtype_name(dtype));
  // validate before claiming words: a failed call leaves the generator as it was
  REMAT_CHECK(stddev >= 0, "randn: negative standard deviation ", stddev);
  Tensor t = detail::allocate_tensor("randn", shape, dtype, memory::Tag::other, device);
  // Box-Muller uses two words per value.
  backend(device).rand_normal(t, rng_reserve(2 * static_cast<uint64_t>(shape_numel(shape))), mean, stddev);
  return t;
}

}  // namespace remat
