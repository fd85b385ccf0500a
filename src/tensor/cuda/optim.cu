// CUDA optimizer updates: SGD and AdamW in place, one thread per element, with the CPU's formulas
// and constants (src/tensor/cpu/optim.cpp): every element is independent, so the results do not
// depend on the launch shape.
#include <cmath>

#include "tensor/cuda/device_common.cuh"

namespace remat::cuda {

namespace {

template <class T>
struct SgdConstants {
  T lr, wd, mu, keep;
  bool decay, momentum, first, nesterov;
};

template <class T>
__global__ void sgd_kernel(T* p, const T* g, T* buf, int64_t n, SgdConstants<T> s) {
  REMAT_GRID_LOOP(i, n) {
    T d = s.decay ? g[i] + s.wd * p[i] : g[i];
    if (s.momentum) {
      const T m = s.first ? d : s.mu * buf[i] + s.keep * d;
      buf[i] = m;
      d = s.nesterov ? d + s.mu * m : m;
    }
    p[i] = p[i] - s.lr * d;
  }
}

template <class T>
struct AdamConstants {
  T decay, b1, c1, b2, c2, inv_sqrt_bc2, eps, step;
  bool decoupled;
};

template <class T>
__global__ void adamw_kernel(T* p, const T* g, T* m, T* v, int64_t n, AdamConstants<T> s) {
  REMAT_GRID_LOOP(i, n) {
    const T gi = g[i];
    const T pi = s.decoupled ? p[i] * s.decay : p[i];
    const T mi = s.b1 * m[i] + s.c1 * gi;
    const T vi = s.b2 * v[i] + s.c2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - s.step * (mi / (sqrt(vi) * s.inv_sqrt_bc2 + s.eps));
  }
}

void check_state(const Tensor& t, const Tensor& param, const char* op, const char* what) {
  REMAT_ASSERT(!t.defined() || (t.is_contiguous() && t.shape() == param.shape() && t.dtype() == param.dtype()), op,
               ": ", what, " of shape ", shape_str(t.shape()), " does not match the parameter ",
               shape_str(param.shape()));
}

}  // namespace

void CudaBackend::sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum, const SgdStep& s) {
  check_state(param, param, "sgd_step", "parameter");
  check_state(grad, param, "sgd_step", "gradient");
  check_state(momentum, param, "sgd_step", "momentum buffer");
  REMAT_ASSERT(s.momentum == 0.0 || momentum.defined(), "sgd_step: momentum without a buffer");
  const int64_t n = param.numel();
  if (n == 0) return;
  DeviceGuard guard(device_);
  dispatch_float(param.dtype(), "sgd_step", [&]<class T>() {
    const SgdConstants<T> c{static_cast<T>(s.lr),
                            static_cast<T>(s.weight_decay),
                            static_cast<T>(s.momentum),
                            static_cast<T>(1.0 - s.dampening),
                            s.weight_decay != 0.0,
                            s.momentum != 0.0,
                            s.first,
                            s.nesterov};
    sgd_kernel<T><<<grid_for(n), kThreads, 0, stream_>>>(ptr<T>(param), ptr<T>(grad), ptr<T>(momentum), n, c);
  });
  check_launch("sgd_step");
}

void CudaBackend::adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                             const AdamWStep& s) {
  check_state(param, param, "adamw_step", "parameter");
  check_state(grad, param, "adamw_step", "gradient");
  check_state(exp_avg, param, "adamw_step", "exp_avg");
  check_state(exp_avg_sq, param, "adamw_step", "exp_avg_sq");
  REMAT_ASSERT(exp_avg.defined() && exp_avg_sq.defined(), "adamw_step: state is undefined");
  const int64_t n = param.numel();
  if (n == 0) return;
  DeviceGuard guard(device_);
  dispatch_float(param.dtype(), "adamw_step", [&]<class T>() {
    const AdamConstants<T> c{static_cast<T>(1.0 - s.lr * s.weight_decay),
                             static_cast<T>(s.beta1),
                             static_cast<T>(1.0 - s.beta1),
                             static_cast<T>(s.beta2),
                             static_cast<T>(1.0 - s.beta2),
                             static_cast<T>(1.0 / std::sqrt(s.bias_correction2)),
                             static_cast<T>(s.eps),
                             static_cast<T>(s.lr / s.bias_correction1),
                             s.weight_decay != 0.0};
    adamw_kernel<T>
        <<<grid_for(n), kThreads, 0, stream_>>>(ptr<T>(param), ptr<T>(grad), ptr<T>(exp_avg), ptr<T>(exp_avg_sq), n, c);
  });
  check_launch("adamw_step");
}

}  // namespace remat::cuda
