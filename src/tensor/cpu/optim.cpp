// CPU optimizer updates: SGD (momentum, dampening, Nesterov, coupled weight decay) and AdamW
// (decoupled weight decay), each one pass over the parameter, its gradient and its state,
// written in place. The formulas are PyTorch's torch.optim.SGD / AdamW (see remat/nn/optim.h);
// every element is independent, so results do not depend on the thread count. The loops are
// compiled per level (cpu_level.h).
//
// sum_squares, the gradient norm's sum: per tensor the square and the sum kernels of the
// CPU backend (widening 16-bit tensors as any kernel does), so each tensor's sum has the bits of
// sum(square(t)), then those sums added in float64 in list order. scale_each, the clipping's
// scaling: per tensor the mul_scalar and copy kernels, the bits of t.copy_(mul_scalar(t, scale)).
#include <cmath>
#include <numeric>

#include "tensor/allocate.h"
#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/cpu_level.h"

namespace remat::cpu {

namespace {

// Runs body(begin, end) over [0, n), split over the threads when n is large.
template <class Body>
void for_chunks(int64_t n, Body&& body) {
  if (n >= 4 * kParallelThreshold) {
#pragma omp parallel
    {
      const int64_t threads = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t begin = n * id / threads / 16 * 16, end = id + 1 == threads ? n : n * (id + 1) / threads / 16 * 16;
      if (end > begin) body(begin, end);
    }
  } else if (n > 0) {
    body(0, n);
  }
}

// Each kernel's constants in T, and its loop over [begin, end), compiled per level (cpu_level.h).
template <class T>
struct SgdConstants {
  T lr, wd, mu, keep;
  bool decay, momentum, first, nesterov;
};
template <class T>
struct AdamWConstants {
  T decay, b1, c1, b2, c2, inv_sqrt_bc2, eps, step;
  bool decoupled;
};

template <class T>
__attribute__((always_inline)) inline void sgd_loop(T* __restrict p, const T* __restrict g, T* __restrict buf,
                                                    int64_t begin, int64_t end, const SgdConstants<T>& k) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    T d = k.decay ? g[i] + k.wd * p[i] : g[i];
    if (k.momentum) {
      const T m = k.first ? d : k.mu * buf[i] + k.keep * d;
      buf[i] = m;
      d = k.nesterov ? d + k.mu * m : m;
    }
    p[i] = p[i] - k.lr * d;
  }
}

template <class T>
__attribute__((always_inline)) inline void adamw_loop(T* __restrict p, const T* __restrict g, T* __restrict m,
                                                      T* __restrict v, int64_t begin, int64_t end,
                                                      const AdamWConstants<T>& k) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    const T gi = g[i];
    const T pi = k.decoupled ? p[i] * k.decay : p[i];
    const T mi = k.b1 * m[i] + k.c1 * gi;
    const T vi = k.b2 * v[i] + k.c2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - k.step * (mi / (std::sqrt(vi) * k.inv_sqrt_bc2 + k.eps));
  }
}

#define REMAT_OPTIM_LOOPS(T, suffix)                                                                           \
  REMAT_CPU_LEVELS(void, sgd_loop_##suffix,                                                                    \
                   (T * p, const T* g, T* buf, int64_t begin, int64_t end, const SgdConstants<T>& k),          \
                   (p, g, buf, begin, end, k)) {                                                               \
    sgd_loop<T>(p, g, buf, begin, end, k);                                                                     \
  }                                                                                                            \
  REMAT_CPU_LEVELS(void, adamw_loop_##suffix,                                                                  \
                   (T * p, const T* g, T* m, T* v, int64_t begin, int64_t end, const AdamWConstants<T>& k),    \
                   (p, g, m, v, begin, end, k)) {                                                              \
    adamw_loop<T>(p, g, m, v, begin, end, k);                                                                  \
  }
REMAT_OPTIM_LOOPS(float, f32)
REMAT_OPTIM_LOOPS(double, f64)
#undef REMAT_OPTIM_LOOPS

template <class T>
void sgd_kernel(T* p, const T* g, T* buf, int64_t n, const SgdStep& s) {
  const SgdConstants<T> k{static_cast<T>(s.lr),           static_cast<T>(s.weight_decay),
                          static_cast<T>(s.momentum),     static_cast<T>(1.0 - s.dampening),
                          s.weight_decay != 0.0,          s.momentum != 0.0,
                          s.first,                        s.nesterov};
  for_chunks(n, [&](int64_t b, int64_t e) {
    if constexpr (sizeof(T) == 4) sgd_loop_f32(p, g, buf, b, e, k);
    else sgd_loop_f64(p, g, buf, b, e, k);
  });
}

template <class T>
void adamw_kernel(T* p, const T* g, T* m, T* v, int64_t n, const AdamWStep& s) {
  const AdamWConstants<T> k{static_cast<T>(1.0 - s.lr * s.weight_decay),
                            static_cast<T>(s.beta1),
                            static_cast<T>(1.0 - s.beta1),
                            static_cast<T>(s.beta2),
                            static_cast<T>(1.0 - s.beta2),
                            static_cast<T>(1.0 / std::sqrt(s.bias_correction2)),
                            static_cast<T>(s.eps),
                            static_cast<T>(s.lr / s.bias_correction1),
                            s.weight_decay != 0.0};
  for_chunks(n, [&](int64_t b, int64_t e) {
    if constexpr (sizeof(T) == 4) adamw_loop_f32(p, g, m, v, b, e, k);
    else adamw_loop_f64(p, g, m, v, b, e, k);
  });
}

}  // namespace

void CpuKernels::sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum, const SgdStep& s) {
  kernel::check_optimizer_state(param, param, "sgd_step", "parameter");
  kernel::check_optimizer_state(grad, param, "sgd_step", "gradient");
  kernel::check_optimizer_state(momentum, param, "sgd_step", "momentum buffer");
  REMAT_ASSERT(s.momentum == 0.0 || momentum.defined(), "sgd_step: momentum without a buffer");
  dispatch_float(param.dtype(), "sgd_step", [&]<class T>() {
    sgd_kernel<T>(param.data<T>(), grad.data<T>(), momentum.defined() ? momentum.data<T>() : nullptr, param.numel(), s);
  });
}

void CpuKernels::adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                            const AdamWStep& s) {
  kernel::check_optimizer_state(param, param, "adamw_step", "parameter");
  kernel::check_optimizer_state(grad, param, "adamw_step", "gradient");
  kernel::check_optimizer_state(exp_avg, param, "adamw_step", "exp_avg");
  kernel::check_optimizer_state(exp_avg_sq, param, "adamw_step", "exp_avg_sq");
  REMAT_ASSERT(exp_avg.defined() && exp_avg_sq.defined(), "adamw_step: state is undefined");
  dispatch_float(param.dtype(), "adamw_step", [&]<class T>() {
    adamw_kernel<T>(param.data<T>(), grad.data<T>(), exp_avg.data<T>(), exp_avg_sq.data<T>(), param.numel(), s);
  });
}

void CpuKernels::sum_squares(const TensorList& tensors, const Tensor& out) {
  REMAT_ASSERT(out.dtype() == DType::f64 && out.numel() == 1, "sum_squares: out must be one f64 value, got ",
               dtype_name(out.dtype()), " of shape ", shape_str(out.shape()));
  double total = 0.0;
  for (const Tensor& t : tensors) {
    REMAT_ASSERT(t.defined() && is_floating(t.dtype()), "sum_squares: an operand is undefined or not floating");
    Tensor squares = detail::allocate_tensor("sum_squares squares", t.shape(), t.dtype(), memory::Tag::other, t.device());
    cpu_backend().unary(UnaryOp::square, t, squares, 0.0);
    std::vector<int64_t> axes(static_cast<size_t>(t.dim()));
    std::iota(axes.begin(), axes.end(), int64_t{0});
    Tensor one = detail::allocate_tensor("sum_squares sum", {}, t.dtype(), memory::Tag::other, t.device());
    cpu_backend().reduce(ReduceOp::sum, squares, axes, one);
    Tensor wide = detail::allocate_tensor("sum_squares sum", {}, DType::f64, memory::Tag::other, t.device());
    cpu_backend().copy(one, wide);
    total += *wide.data<double>();
  }
  cpu_backend().fill(out, total);
}

void CpuKernels::scale_each(const TensorList& tensors, double scale) {
  for (const Tensor& t : tensors) {
    REMAT_ASSERT(t.defined() && is_floating(t.dtype()), "scale_each: an operand is undefined or not floating");
    Tensor scaled = detail::allocate_tensor("scale_each product", t.shape(), t.dtype(), memory::Tag::other, t.device());
    cpu_backend().unary(UnaryOp::mul_scalar, t, scaled, scale);
    cpu_backend().copy(scaled, t);
  }
}

}  // namespace remat::cpu
