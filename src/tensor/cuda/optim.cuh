// Internal: the optimizer updates' element formulas and constants (.cu files only): the CPU's
// (src/tensor/cpu/optim.cpp), which the kernels of optim.cu and the candidate
// candidates/cuda/optimizer.cu apply to each element.
#pragma once

#include <cmath>

#include "tensor/cuda/device_common.cuh"

namespace remat::cuda::optim {

template <class T>
struct SgdConstants {
  T lr, wd, mu, keep;
  bool decay, momentum, first, nesterov;
};

template <class T>
__device__ inline void sgd_element(T* p, const T* g, T* buf, int64_t i, const SgdConstants<T>& s) {
  T d = s.decay ? g[i] + s.wd * p[i] : g[i];
  if (s.momentum) {
    const T m = s.first ? d : s.mu * buf[i] + s.keep * d;
    buf[i] = m;
    d = s.nesterov ? d + s.mu * m : m;
  }
  p[i] = p[i] - s.lr * d;
}

template <class T>
SgdConstants<T> sgd_constants(const SgdStep& s) {
  return {static_cast<T>(s.lr),
          static_cast<T>(s.weight_decay),
          static_cast<T>(s.momentum),
          static_cast<T>(1.0 - s.dampening),
          s.weight_decay != 0.0,
          s.momentum != 0.0,
          s.first,
          s.nesterov};
}

template <class T>
struct AdamConstants {
  T decay, b1, c1, b2, c2, inv_sqrt_bc2, eps, step;
  bool decoupled;
};

template <class T>
__device__ inline void adamw_element(T* p, const T* g, T* m, T* v, int64_t i, const AdamConstants<T>& s) {
  const T gi = g[i];
  const T pi = s.decoupled ? p[i] * s.decay : p[i];
  const T mi = s.b1 * m[i] + s.c1 * gi;
  const T vi = s.b2 * v[i] + s.c2 * (gi * gi);
  m[i] = mi;
  v[i] = vi;
  p[i] = pi - s.step * (mi / (sqrt(vi) * s.inv_sqrt_bc2 + s.eps));
}

template <class T>
AdamConstants<T> adamw_constants(const AdamWStep& s) {
  return {static_cast<T>(1.0 - s.lr * s.weight_decay),
          static_cast<T>(s.beta1),
          static_cast<T>(1.0 - s.beta1),
          static_cast<T>(s.beta2),
          static_cast<T>(1.0 - s.beta2),
          static_cast<T>(1.0 / std::sqrt(s.bias_correction2)),
          static_cast<T>(s.eps),
          static_cast<T>(s.lr / s.bias_correction1),
          s.weight_decay != 0.0};
}

}  // namespace remat::cuda::optim
