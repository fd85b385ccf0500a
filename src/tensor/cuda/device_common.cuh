// Internal: device-side helpers shared by the CUDA kernels (.cu files only): launch sizes,
// strided offsets, fixed-order block reductions and the Philox-4x32-10 stream of remat/random.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "tensor/cuda/cuda_internal.h"

namespace remat::cuda {

inline constexpr int kThreads = 256;

// A grid-stride loop: the calling thread's indices i of [0, n), in increasing order.
#define REMAT_GRID_LOOP(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// Blocks for a grid-stride loop over n elements.
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65536) blocks = 65536;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

// Accumulator type: float32 sums accumulate in float64, as on the CPU.
template <class T>
using Acc = std::conditional_t<std::is_same_v<T, float>, double, T>;

template <int N>
__device__ inline void offsets_of(const Layout<N>& l, int64_t index, int64_t (&off)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) off[k] = l.offsets[k];
  for (int d = l.rank - 1; d >= 0; --d) {
    const int64_t i = index % l.shape[d];
    index /= l.shape[d];
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] += i * l.strides[k][d];
  }
}

// ---- fixed-order block reductions (blockDim.x a multiple of 32, at most 1024): each warp folds
// its lanes by butterfly shuffles (a fixed pattern that leaves the same value in every lane, since
// a + b == b + a exactly and max lets a NaN win), then warp 0 folds the warp results. The order
// depends on the block size only, which each kernel fixes, so results are the same on every run.
template <class T>
__device__ inline T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <class T>
__device__ inline T warp_max(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const T other = __shfl_xor_sync(0xffffffffu, v, o);
    v = other > v || other != other ? other : v;  // a NaN wins, so every lane ends the same
  }
  return v;
}
// The block's sum, returned to every thread. `shared` holds 32 values.
template <class T>
__device__ inline T block_sum(T v, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // shared may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < warps ? shared[lane] : T(0);
    w = warp_sum(w);
    if (lane == 0) shared[0] = w;
  }
  __syncthreads();
  return shared[0];
}
template <class T>
__device__ inline T block_max(T v, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < warps ? shared[lane] : v;
    w = warp_max(w);
    if (lane == 0) shared[0] = w;
  }
  __syncthreads();
  return shared[0];
}

// ---- fixed-order sums over the rows of a [rows, cols] problem, per column, in two passes:
// column_partials() adds f(r, c) over row chunks of kChunkRows rows (one thread per chunk and
// column, rows in order) into partial[chunk][c]; combine_partials() adds the chunks in order.
// The chunking depends on `rows` only.
inline constexpr int64_t kChunkRows = 32;
inline int64_t chunk_count(int64_t rows) { return (rows + kChunkRows - 1) / kChunkRows; }

template <class A, class F>
__global__ void column_partials(F f, int64_t rows, int64_t cols, A* partial) {
  const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
  REMAT_GRID_LOOP(i, chunks * cols) {
    const int64_t chunk = i / cols, c = i % cols;
    const int64_t r1 = min(rows, (chunk + 1) * kChunkRows);
    A acc = 0;
    for (int64_t r = chunk * kChunkRows; r < r1; ++r) acc += f(r, c);
    partial[i] = acc;
  }
}
// out[c] = (sum over chunks of partial[chunk][c]) / divisor, rounded to Via, then to T (a 16-bit
// T: the float32 result rounded once more, as a float32 kernel's output is)
template <class A, class T, class Via = T>
__global__ void combine_partials(const A* partial, int64_t chunks, int64_t cols, A divisor, T* out) {
  REMAT_GRID_LOOP(c, cols) {
    A acc = 0;
    for (int64_t k = 0; k < chunks; ++k) acc += partial[k * cols + c];
    out[c] = static_cast<T>(static_cast<Via>(divisor == A(1) ? acc : acc / divisor));
  }
}

// ---- Philox-4x32-10, word for word the CPU's (src/tensor/random.cpp)
struct Words4 {
  uint32_t v[4];
};
__device__ inline Words4 philox_block(uint64_t counter, uint64_t key) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}
// Word `index` of the stream (seed, offset), as philox_word().
__device__ inline uint32_t philox_word_at(uint64_t seed, uint64_t offset, uint64_t index) {
  const uint64_t word = offset + index;
  return philox_block(word / 4, seed).v[word % 4];
}
// uniform_float / uniform_double of remat/random.h
__device__ inline float uniform_f(uint32_t w) { return static_cast<float>(w >> 8) * (1.0f / 16777216.0f); }
__device__ inline double uniform_d(uint32_t w) { return static_cast<double>(w) * (1.0 / 4294967296.0); }

template <class T>
__device__ inline bool is_nan(T v) {
  return v != v;
}

}  // namespace remat::cuda
