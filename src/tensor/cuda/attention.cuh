// Internal: what the CUDA attention kernels share (.cu files only): the [B, H, T, D] operands
// and the problem the kernels (attention.cu, and the candidates of candidates/cuda/) take, with
// its causal mask and dropout factor.
#pragma once

#include "tensor/cuda/device_common.cuh"
#include "tensor/cuda/half.cuh"

namespace remat::cuda::attention_detail {

// A [B, H, T, D] operand: element (b, h, t, e) at b * s[0] + h * s[1] + t * s[2] + e.
template <class T>
struct Operand {
  T* p = nullptr;
  int64_t s[3] = {};
  __device__ T* row(int64_t bh, int64_t heads, int64_t t) const {
    return p + (bh / heads) * s[0] + (bh % heads) * s[1] + t * s[2];
  }
};
template <class T>
Operand<T> operand(const Tensor& t) {
  Operand<T> o;
  o.p = ptr<T>(t);
  for (int i = 0; i < 3; ++i) o.s[i] = t.strides()[i];
  return o;
}

// S is the operands' storage type, T the arithmetic type (Compute<S>: float for bf16 and f16),
// which the log-sum-exp, delta and the kernels' sums and shared tiles also take.
template <class S>
struct Problem {
  using T = Compute<S>;
  Operand<const S> q, k, v, out, gout;
  Operand<S> o, gq, gk, gv;
  T* lse_out = nullptr;
  const T* lse = nullptr;
  T* delta = nullptr;
  int64_t heads = 0, tq = 0, tk = 0, d = 0, dv = 0;
  T scale = 1;
  bool causal = true;
  double p = 0;
  T keep_scale = 1;
  uint64_t seed = 0, offset = 0;

  __device__ bool visible(int64_t i, int64_t j) const { return j < tk && (!causal || j <= i); }
  __device__ T dropout_factor(int64_t bh, int64_t i, int64_t j) const {
    if (p <= 0.0) return T(1);
    const uint64_t index = static_cast<uint64_t>(bh * tq + i) * static_cast<uint64_t>(tk) + static_cast<uint64_t>(j);
    return static_cast<double>(uniform_f(philox_word_at(seed, offset, index))) >= p ? keep_scale : T(0);
  }
};

}  // namespace remat::cuda::attention_detail
