// Internal: vectorised loops over one row of a contiguous [rows, cols] tensor, the building blocks
// of the row kernels (rows.cpp, indexing.cpp). Always inlined into the kernels' per-level
// row-range functions (simd.h). Each loop runs in a fixed order (vectors, then their lanes, then
// the scalar tail), so a row's result does not depend on which thread computes it. Sums of float32
// end in float64 (Acc<T>; see WideSum).
#pragma once

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/simd.h"

namespace remat::cpu::rowops {

using simd::load;
using simd::store;
using simd::V4d;
template <class T>
using V = simd::Vec<T>;
template <class T>
inline constexpr int64_t W = simd::kWidth<T>;

// max over x[0, n); -inf for an empty row (NaN entries are skipped, as in a scalar max loop)
template <class T>
REMAT_SIMD_INLINE T max(const T* __restrict x, int64_t n) {
  V<T> m0 = simd::splat(-std::numeric_limits<T>::infinity()), m1 = m0;
  int64_t c = 0;
  for (; c + 2 * W<T> <= n; c += 2 * W<T>) {
    m0 = simd::max<T>(load(x + c), m0);
    m1 = simd::max<T>(load(x + c + W<T>), m1);
  }
  T m = simd::max_lanes<T>(simd::max<T>(m0, m1));
  for (; c < n; ++c) m = x[c] > m ? x[c] : m;
  return m;
}

// A float64 sum of vectors of T: for float, partial sums of up to kBlock vectors are kept in
// float32 lanes and then added to float64 accumulators (each lane adds at most kBlock values in
// float32, so a row sum is within about 16 ulp of float64 accumulation, at a fraction of the
// conversions); for double, plain accumulation. The order is fixed by the element positions.
template <class T>
struct WideSum {
  static constexpr int kBlock = 16;
  V4d a = {}, b = {};
  V<T> partial = {};
  int pending = 0;
  REMAT_SIMD_INLINE void add(V<T> v) {
    if constexpr (sizeof(T) == 4) {
      partial += v;
      if (++pending == kBlock) flush();
    } else {
      simd::add_wide(a, b, v);
    }
  }
  REMAT_SIMD_INLINE void flush() {
    if constexpr (sizeof(T) == 4) {
      simd::add_wide(a, b, partial);
      partial = V<T>{};
      pending = 0;
    }
  }
  REMAT_SIMD_INLINE Acc<T> total() {
    flush();
    return simd::sum_lanes_wide(a, b);
  }
};

// sum over x[0, n) in Acc<T>
template <class T>
REMAT_SIMD_INLINE Acc<T> sum(const T* __restrict x, int64_t n) {
  WideSum<T> s;
  int64_t c = 0;
  for (; c + W<T> <= n; c += W<T>) s.add(load(x + c));
  Acc<T> total = s.total();
  for (; c < n; ++c) total += static_cast<Acc<T>>(x[c]);
  return total;
}

// sum over x[c] * y[c] in Acc<T> (products rounded to T)
template <class T>
REMAT_SIMD_INLINE Acc<T> dot(const T* __restrict x, const T* __restrict y, int64_t n) {
  WideSum<T> s;
  int64_t c = 0;
  for (; c + W<T> <= n; c += W<T>) s.add(load(x + c) * load(y + c));
  Acc<T> total = s.total();
  for (; c < n; ++c) total += static_cast<Acc<T>>(x[c] * y[c]);
  return total;
}

// y[c] = exp(x[c] - shift) (y may be null: only the sum); returns the sum in Acc<T>
template <class T>
REMAT_SIMD_INLINE Acc<T> exp_sum(const T* __restrict x, T shift, T* __restrict y, int64_t n) {
  WideSum<T> s;
  int64_t c = 0;
  for (; c + W<T> <= n; c += W<T>) {
    const V<T> e = simd::exp<T>(load(x + c) - shift);
    if (y) store(y + c, e);
    s.add(e);
  }
  Acc<T> total = s.total();
  for (; c < n; ++c) {
    const T e = simd::exp_scalar<T>(x[c] - shift);
    if (y) y[c] = e;
    total += static_cast<Acc<T>>(e);
  }
  return total;
}

// Runs vec_body(c) for each whole vector of [0, n) and scalar_body(c) for the tail: the caller
// writes both forms of the same formula. Lambdas passed here must be REMAT_ROW_LAMBDA so they are
// inlined (and so compiled for the instruction set of the kernel that calls them).
#define REMAT_ROW_LAMBDA __attribute__((always_inline))
template <class T, class VecBody, class ScalarBody>
REMAT_SIMD_INLINE void map(int64_t n, VecBody&& vec_body, ScalarBody&& scalar_body) {
  int64_t c = 0;
  for (; c + W<T> <= n; c += W<T>) vec_body(c);
  for (; c < n; ++c) scalar_body(c);
}

}  // namespace remat::cpu::rowops
