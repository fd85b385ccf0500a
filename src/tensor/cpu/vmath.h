// Internal: float32 transcendental functions written so that loops over them vectorise (no calls,
// no branches the compiler cannot if-convert). Float64 kernels use the C library instead.
// Accuracy, measured by bench/bench_vmath (every 97th float, both signs, against the float64 C
// library): exp at most 1.0 ulp on [-87, 87] (saturating at 2.4e38 above x = 88.37, exactly 0
// below -87.34), tanh at most 1.3 ulp on [-10, 10], erf: see erf_f. SLEEF 3.5 (libsleef-dev) was
// measured against these: equal accuracy for exp and tanh (1.0 ulp) at equal speed, and an erf
// five times slower; as an out-of-line call it also cannot be fused into the row kernels' loops,
// so remat keeps its own (docs/performance.md, "Kernel choices"). Constants are the usual Cody-Waite split of ln 2 and Taylor-like
// minimax coefficients for exp on [-ln2/2, ln2/2] and tanh on [-0.625, 0.625].
#pragma once

#include <cstdint>
#include <cstring>

namespace remat::cpu::vmath {

__attribute__((always_inline)) inline float bits_to_float(int32_t bits) {
  return __builtin_bit_cast(float, bits);
}

__attribute__((always_inline)) inline float exp_f(float x) {
  const float hi = 88.3762626647949f, lo = -87.3365447505531f;
  // single-level selects only: nested ones defeat GCC's if-conversion and thus vectorisation
  float xc = x > hi ? hi : x;
  xc = xc < lo ? lo : xc;
  // n = nearest integer to x / ln 2 (ties to even): adding 1.5 * 2^23 leaves it in the low
  // mantissa bits (no float-to-int conversion in the loop)
  float shifted = xc * 1.44269504088896341f + 12582912.0f;
  float n = shifted - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float z = r * r;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * z + r + 1.0f;
  float scale = bits_to_float((__builtin_bit_cast(int32_t, shifted) - 0x4b400000 + 127) << 23);
  float result = y * scale;
  // Underflow to exactly 0 (exp(-inf) = 0 matters for masked softmax), written as a product with
  // a 0/1 mask: GCC does not vectorise a select here. Above `hi` the result saturates at
  // about 2.4e38 instead of overflowing to inf.
  return result * static_cast<float>(x >= lo);
}

__attribute__((always_inline)) inline float tanh_f(float x) {
  float ax = __builtin_fabsf(x);
  // small |x|: odd polynomial
  float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  float small = p * z * x + x;
  // large |x|: 1 - 2 / (exp(2|x|) + 1)
  float a9 = ax > 9.0f ? 9.0f : ax;
  float e = exp_f(2.0f * a9);
  float large = __builtin_copysignf(1.0f - 2.0f / (e + 1.0f), x);
  float m = static_cast<float>(ax < 0.625f);  // exact blend: m is 0 or 1, both branches finite
  return m * small + (1.0f - m) * large;
}

__attribute__((always_inline)) inline float sigmoid_f(float x) { return 1.0f / (1.0f + exp_f(-x)); }

// erf: for |x| < 1, x * P(x^2) with P the degree-6 Chebyshev interpolant of erf(sqrt(u)) / sqrt(u)
// on u in [0, 1] (approximation error 1e-8 relative, so a few ulp also near 0); from 1 on
// Abramowitz & Stegun 7.1.26 (absolute error 1.5e-7, where erf >= 0.84).
#define REMAT_ERF_SMALL_COEFFICIENTS                                                                 \
  7.8758750627e-05f, -8.0168642872e-04f, 5.1890874234e-03f, -2.6854212011e-02f, 1.1283594715e-01f, \
      -3.7612626667e-01f, 1.1283791658e+00f
__attribute__((always_inline)) inline float erf_f(float x) {
  float ax = __builtin_fabsf(x);
  // small |x|: odd series, evaluated on a clamped argument so that both branches stay finite
  float xs = ax < 1.0f ? x : 0.0f;
  float z = xs * xs;
  constexpr float kSmall[] = {REMAT_ERF_SMALL_COEFFICIENTS};
  float p = kSmall[0];
  for (int k = 1; k < 7; ++k) p = p * z + kSmall[k];
  float small = xs * p;
  // large |x|
  float t = 1.0f / (1.0f + 0.3275911f * ax);
  float poly = 1.061405429f;
  poly = poly * t - 1.453152027f;
  poly = poly * t + 1.421413741f;
  poly = poly * t - 0.284496736f;
  poly = poly * t + 0.254829592f;
  float large = __builtin_copysignf(1.0f - poly * t * exp_f(-ax * ax), x);
  float m = static_cast<float>(ax < 1.0f);  // exact blend: m is 0 or 1, both branches finite
  return m * small + (1.0f - m) * large;
}

}  // namespace remat::cpu::vmath

namespace remat::cpu {
// exp for kernels templated on the dtype: the vectorisable version for float32, libm for float64.
template <class T>
__attribute__((always_inline)) inline T exp_any(T x) {
  if constexpr (sizeof(T) == 4) return vmath::exp_f(x);
  else return __builtin_exp(x);
}
}  // namespace remat::cpu
