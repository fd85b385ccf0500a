// Internal: 32-byte vectors (8 floats or 4 doubles) with GCC vector extensions, for kernels that
// vectorise by hand (row kernels, attention). Everything here is always inlined, so it takes the
// instruction set of the function it is inlined into: kernels put their loops in functions
// compiled once per level, x86-64-v4 (AVX-512), x86-64-v3 (AVX2 + FMA) and the baseline, the
// process's level picked once (cpu_level.h, REMAT_CPU_LEVELS); on the baseline the 32-byte vectors
// become pairs of SSE registers, at avx512 they are AVX-512VL operations on 256-bit registers.
//
//   using V = simd::Vec<float>;                 // 8 lanes
//   V x = simd::load(p), e = simd::exp(x - m);  // exp: vmath::exp_f lane by lane, same result
//   double s = simd::sum_wide(e);               // lanes added in float64, in a fixed order
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

#include "tensor/cpu/cpu_level.h"
#include "tensor/cpu/vmath.h"

// The vector helpers are always inlined, so no vector value ever crosses a call boundary.
#pragma GCC diagnostic ignored "-Wpsabi"

#define REMAT_SIMD_INLINE __attribute__((always_inline)) inline

namespace remat::cpu::simd {

template <class T>
struct Traits;
template <>
struct Traits<float> {
  typedef float V __attribute__((vector_size(32)));
  typedef int32_t I __attribute__((vector_size(32)));
  static constexpr int64_t W = 8;
};
template <>
struct Traits<double> {
  typedef double V __attribute__((vector_size(32)));
  typedef int64_t I __attribute__((vector_size(32)));
  static constexpr int64_t W = 4;
};
template <class T>
using Vec = typename Traits<T>::V;
template <class T>
inline constexpr int64_t kWidth = Traits<T>::W;

typedef double V4d __attribute__((vector_size(32)));
typedef double V8d __attribute__((vector_size(64)));
typedef float V4f __attribute__((vector_size(16)));

template <class T>
REMAT_SIMD_INLINE Vec<T> load(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class T>
REMAT_SIMD_INLINE void store(T* p, Vec<T> v) {
  std::memcpy(p, &v, sizeof v);
}
template <class T>
REMAT_SIMD_INLINE Vec<T> splat(T x) {
  return Vec<T>{} + x;
}

template <class T>
REMAT_SIMD_INLINE Vec<T> max(Vec<T> a, Vec<T> b) {
  return a > b ? a : b;
}
template <class T>
REMAT_SIMD_INLINE T max_lanes(Vec<T> v) {
  T m = v[0];
  for (int i = 1; i < kWidth<T>; ++i) m = v[i] > m ? v[i] : m;
  return m;
}
template <class T>
REMAT_SIMD_INLINE T sum_lanes(Vec<T> v) {
  T s = v[0];
  for (int i = 1; i < kWidth<T>; ++i) s += v[i];
  return s;
}

// Float64 partial sums of a vector: for float the low and high halves widened and added to two
// [4] float64 accumulators; for double added to the first.
// (Converting all eight lanes at once and then splitting is what GCC turns into two vcvtps2pd.)
REMAT_SIMD_INLINE void add_wide(V4d& a, V4d& b, Vec<float> v) {
  const V8d w = __builtin_convertvector(v, V8d);
  a += __builtin_shufflevector(w, w, 0, 1, 2, 3);
  b += __builtin_shufflevector(w, w, 4, 5, 6, 7);
}
REMAT_SIMD_INLINE void add_wide(V4d& a, V4d&, Vec<double> v) { a += v; }
REMAT_SIMD_INLINE double sum_lanes_wide(V4d a, V4d b) { return sum_lanes<double>(a + b); }

// exp lane by lane: float32 with vmath::exp_f's constants (the same results: within 1 ulp, 0
// below -87.34 and for -inf, NaN propagated, saturating above 88.37), float64 through the C
// library.
template <class T>
REMAT_SIMD_INLINE Vec<T> exp(Vec<T> x) {
  using V = Vec<T>;
  if constexpr (sizeof(T) == 4) {
    using VI = typename Traits<float>::I;
    const float hi = 88.3762626647949f, lo = -87.3365447505531f;
    V xc = x > hi ? splat(hi) : x;
    xc = xc < lo ? splat(lo) : xc;
    // n = nearest integer to x / ln 2 (ties to even): adding 1.5 * 2^23 leaves it in the low
    // mantissa bits
    const V shifted = xc * 1.44269504088896341f + 12582912.0f;
    const V n = shifted - 12582912.0f;
    const VI ni = (VI)shifted - 0x4b400000;
    V r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    const V z = r * r;
    V y = splat(1.9875691500e-4f);
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * z + r + 1.0f;
    const V scale = (V)((ni + 127) << 23);  // 2^n
    const V keep = x >= lo ? splat(1.0f) : V{};  // a product, not a select: NaN stays NaN
    return y * scale * keep;
  } else {
    V y;
    for (int i = 0; i < kWidth<T>; ++i) y[i] = __builtin_exp(x[i]);
    return y;
  }
}

// erf of float32 lanes, as vmath::erf_f (the same formulas); *gauss (if given) receives
// exp(-x^2), which the large-|x| branch computes anyway (GELU's backward needs it).
REMAT_SIMD_INLINE Vec<float> erf_f32(Vec<float> x, Vec<float>* gauss = nullptr) {
  using V = Vec<float>;
  const V ax = x < 0.0f ? -x : x;
  const V one = splat(1.0f);
  const auto small_lane = ax < 1.0f;
  // small |x|: odd polynomial on a clamped argument, so that both branches stay finite
  const V xs = small_lane ? x : V{};
  const V z = xs * xs;
  constexpr float kSmall[] = {REMAT_ERF_SMALL_COEFFICIENTS};
  V p = splat(kSmall[0]);
  for (int k = 1; k < 7; ++k) p = p * z + kSmall[k];
  const V small = xs * p;
  // large |x|: 1 - poly(t) t exp(-x^2), t = 1 / (1 + 0.3275911 |x|)
  const V t = one / (ax * 0.3275911f + 1.0f);
  V poly = splat(1.061405429f);
  poly = poly * t - 1.453152027f;
  poly = poly * t + 1.421413741f;
  poly = poly * t - 0.284496736f;
  poly = poly * t + 0.254829592f;
  const V e = exp<float>(-(ax * ax));
  if (gauss) *gauss = e;
  V large = one - poly * t * e;
  large = x < 0.0f ? -large : large;
  return small_lane ? small : large;
}

// Scalar counterpart for loop tails.
template <class T>
REMAT_SIMD_INLINE T exp_scalar(T x) {
  if constexpr (sizeof(T) == 4) return vmath::exp_f(x);
  else return __builtin_exp(x);
}

template <class T>
REMAT_SIMD_INLINE Vec<T> lane_index() {
  Vec<T> v;
  for (int i = 0; i < kWidth<T>; ++i) v[i] = static_cast<T>(i);
  return v;
}

}  // namespace remat::cpu::simd
