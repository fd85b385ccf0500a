// GELU (exact, erf form) over contiguous float32, forward and backward, hand-vectorised (simd.h)
// and compiled per CPU level (cpu_level.h: AVX-512, AVX2 + FMA, baseline). The backward reuses the exp(-x^2 / 2) that
// erf's large-argument branch computes for the Gaussian density. The elementwise kernels
// (elementwise.cpp) call these for UnaryOp::gelu on contiguous float32 runs; strided runs and
// float64 keep the generic loops.
//   y  = x * Phi(x),                Phi(x) = (1 + erf(x / sqrt(2))) / 2
//   gx = gy * (Phi(x) + x * phi(x)), phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/simd.h"

namespace remat::cpu {

namespace {
constexpr float kInvSqrt2 = static_cast<float>(kernel::kInvSqrt2);
constexpr float kInvSqrt2Pi = static_cast<float>(kernel::kInvSqrt2Pi);
}  // namespace

REMAT_CPU_LEVELS(void, gelu_f32_contiguous, (const float* __restrict x, float* __restrict y, int64_t n), (x, y, n)) {
  using V = simd::Vec<float>;
  constexpr int64_t W = simd::kWidth<float>;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const V v = simd::load(x + i);
    simd::store(y + i, 0.5f * v * (1.0f + simd::erf_f32(v * kInvSqrt2)));
  }
  for (; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + vmath::erf_f(x[i] * kInvSqrt2));
}

REMAT_CPU_LEVELS(void, gelu_backward_f32_contiguous,
                 (const float* __restrict x, const float* __restrict gy, float* __restrict gx, int64_t n),
                 (x, gy, gx, n)) {
  using V = simd::Vec<float>;
  constexpr int64_t W = simd::kWidth<float>;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const V v = simd::load(x + i);
    V gauss;
    const V cdf = 0.5f * (1.0f + simd::erf_f32(v * kInvSqrt2, &gauss));
    simd::store(gx + i, simd::load(gy + i) * (cdf + v * (kInvSqrt2Pi * gauss)));
  }
  for (; i < n; ++i) {
    const float cdf = 0.5f * (1.0f + vmath::erf_f(x[i] * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * vmath::exp_f(-0.5f * x[i] * x[i]);
    gx[i] = gy[i] * (cdf + x[i] * pdf);
  }
}

}  // namespace remat::cpu
