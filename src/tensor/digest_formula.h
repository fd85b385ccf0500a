// Internal: the recomputation check's 64-bit digest of a byte stream, once, for every backend (the
// CPU's kernel in cpu/digest.cpp, the CUDA one in cuda/digest.cu). See Note [recomputation check]
// in src/autodiff/digest.cpp for what it is used for.
//
// The stream (a tensor's bytes in logical order) is cut into blocks of kBlock bytes. A block of n
// bytes is digested by kLanes independent lanes over its 8-byte words (lane k takes the words
// k, k + kLanes, ... of each kLanes-word group; each step a bijection of the word: xor, odd
// multiply, rotate, so a changed word always changes its lane), then the lanes, the tail bytes
// after the last whole group and n mixed in order. The block digests are chained in order after
// the stream's length. So the digest depends on the bytes only: not on the layout, the thread
// count or the device.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define REMAT_DIGEST_HD __host__ __device__
#else
#define REMAT_DIGEST_HD
#endif

namespace remat::digest_formula {

inline constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
inline constexpr int kLanes = 8;
inline constexpr int64_t kBlock = 64 * 1024;  // a multiple of every element size
inline constexpr int64_t kGroup = 8 * kLanes;  // bytes the lanes take in one step

REMAT_DIGEST_HD inline uint64_t mix(uint64_t h, uint64_t word) {
  h ^= word * kMul;
  h = (h << 29) | (h >> 35);
  return h * 0xBF58476D1CE4E5B9ull;
}

// Lane k's starting value in block b.
REMAT_DIGEST_HD inline uint64_t lane_start(uint64_t block, int k) { return block ^ static_cast<uint64_t>(k); }

// One lane's step over one 8-byte word.
REMAT_DIGEST_HD inline uint64_t lane_step(uint64_t lane, uint64_t word) {
  const uint64_t x = (lane ^ word) * kMul;
  return (x << 31) | (x >> 33);
}

// A block's digest from its lanes, the `tail` bytes after its last whole group, and its size n.
REMAT_DIGEST_HD inline uint64_t block_digest(const uint64_t* lanes, const unsigned char* tail, int64_t tail_bytes,
                                             int64_t n) {
  uint64_t out = lanes[0];
  for (int k = 1; k < kLanes; ++k) out = mix(out, lanes[k]);
  for (int64_t i = 0; i < tail_bytes; ++i) out = mix(out, tail[i]);
  return mix(out, static_cast<uint64_t>(n));
}

// The digest of a stream of `bytes` bytes from its block digests, in order.
REMAT_DIGEST_HD inline uint64_t chain_start(int64_t bytes) { return mix(0, static_cast<uint64_t>(bytes)); }
REMAT_DIGEST_HD inline uint64_t chain(uint64_t h, uint64_t block_digest) { return mix(h, block_digest); }

}  // namespace remat::digest_formula
