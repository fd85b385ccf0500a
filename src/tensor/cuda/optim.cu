// CUDA optimizer updates: SGD and AdamW in place, one thread per element, with the CPU's formulas
// and constants (src/tensor/cpu/optim.cpp): every element is independent, so the results do not
// depend on the launch shape. sum_squares, the gradient norm's sum: the composition of square, sum
// and a float64 add per tensor. scale_each, the clipping's scaling: the mul_scalar and copy kernels
// per tensor. (Few-launch forms of the three are candidates: candidates/cuda/optimizer.cu and
// grad_norm.cu.)
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <type_traits>

#include "tensor/cuda/half.cuh"
#include "tensor/cuda/optim.cuh"

namespace remat::cuda {

namespace {

using optim::adamw_constants;
using optim::adamw_element;
using optim::AdamConstants;
using optim::sgd_constants;
using optim::sgd_element;
using optim::SgdConstants;

template <class T>
__global__ void sgd_kernel(T* p, const T* g, T* buf, int64_t n, SgdConstants<T> s) {
  REMAT_GRID_LOOP(i, n) { sgd_element(p, g, buf, i, s); }
}

template <class T>
__global__ void adamw_kernel(T* p, const T* g, T* m, T* v, int64_t n, AdamConstants<T> s) {
  REMAT_GRID_LOOP(i, n) { adamw_element(p, g, m, v, i, s); }
}

}  // namespace

void CudaBackend::sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum, const SgdStep& s) {
  kernel::check_optimizer_state(param, param, "sgd_step", "parameter");
  kernel::check_optimizer_state(grad, param, "sgd_step", "gradient");
  kernel::check_optimizer_state(momentum, param, "sgd_step", "momentum buffer");
  REMAT_ASSERT(s.momentum == 0.0 || momentum.defined(), "sgd_step: momentum without a buffer");
  const int64_t n = param.numel();
  if (n == 0) return;
  dispatch_float(param.dtype(), "sgd_step", [&]<class T>() {
    const SgdConstants<T> c = sgd_constants<T>(s);
    DeviceGuard guard(device_);
    sgd_kernel<T><<<grid_for(n), kThreads, 0, stream_>>>(ptr<T>(param), ptr<T>(grad), ptr<T>(momentum), n, c);
    check_launch("sgd_step");
  });
}

void CudaBackend::adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                             const AdamWStep& s) {
  kernel::check_optimizer_state(param, param, "adamw_step", "parameter");
  kernel::check_optimizer_state(grad, param, "adamw_step", "gradient");
  kernel::check_optimizer_state(exp_avg, param, "adamw_step", "exp_avg");
  kernel::check_optimizer_state(exp_avg_sq, param, "adamw_step", "exp_avg_sq");
  REMAT_ASSERT(exp_avg.defined() && exp_avg_sq.defined(), "adamw_step: state is undefined");
  const int64_t n = param.numel();
  if (n == 0) return;
  dispatch_float(param.dtype(), "adamw_step", [&]<class T>() {
    const AdamConstants<T> c = adamw_constants<T>(s);
    DeviceGuard guard(device_);
    adamw_kernel<T>
        <<<grid_for(n), kThreads, 0, stream_>>>(ptr<T>(param), ptr<T>(grad), ptr<T>(exp_avg), ptr<T>(exp_avg_sq), n, c);
    check_launch("adamw_step");
  });
}

namespace {

// Each tensor alone: square, sum in its dtype, widen, add in order (the ops' kernels, their bits).
void sum_squares_composed(CudaBackend& be, const TensorList& tensors, const Tensor& out) {
  bool first = true;
  for (const Tensor& t : tensors) {
    Tensor squares = be.scratch(t.shape(), t.dtype());
    be.unary(UnaryOp::square, t, squares, 0.0);
    std::vector<int64_t> axes(static_cast<size_t>(t.dim()));
    std::iota(axes.begin(), axes.end(), int64_t{0});
    Tensor one = be.scratch({}, t.dtype());
    be.reduce(ReduceOp::sum, squares, axes, one);
    if (first) {
      be.copy(one, out);
    } else {
      Tensor wide = be.scratch({}, DType::f64);
      be.copy(one, wide);
      be.binary(BinaryOp::add, out, wide, out);
    }
    first = false;
  }
  if (first) be.fill(out, 0.0);
}

}  // namespace

void CudaBackend::sum_squares(const TensorList& tensors, const Tensor& out) {
  REMAT_ASSERT(out.dtype() == DType::f64 && out.numel() == 1 && out.is_contiguous(),
               "sum_squares: out must be one contiguous f64 value");
  sum_squares_composed(*this, tensors, out);
}

void CudaBackend::scale_each(const TensorList& tensors, double scale) {
  for (const Tensor& t : tensors) {  // the kernels of t.copy_(mul_scalar(t, scale))
    Tensor scaled = scratch(t.shape(), t.dtype());
    unary(UnaryOp::mul_scalar, t, scaled, scale);
    copy(scaled, t);
  }
}

}  // namespace remat::cuda
