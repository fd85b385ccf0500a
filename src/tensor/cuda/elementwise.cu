// CUDA elementwise kernels: unary ops and their derivatives, broadcasting binary ops and where,
// over strided inputs (one thread per output element; the index is decoded into each operand's
// offset, device_common.cuh). The formulas are the CPU's (src/tensor/cpu/elementwise.cpp),
// including NaN propagation of relu, maximum and minimum (elementwise.cuh). bf16 and f16 operands
// (the backend option sixteen_bit) take the same kernels: each element widened to float, the float formula, the result
// rounded once (half.cuh), as the CPU computes them.
#include <array>
#include <cmath>
#include <cstdint>

#include "tensor/cuda/elementwise.cuh"

namespace remat::cuda {

namespace {

using elementwise::binary_value;
using elementwise::unary_grad;
using elementwise::unary_value;

template <class T>
__global__ void unary_kernel(UnaryOp op, Layout<2> l, T* y, const T* x, Compute<T> s) {
  using A = Compute<T>;
  REMAT_GRID_LOOP(i, l.numel) {
    int64_t off[2];
    offsets_of(l, i, off);
    y[off[0]] = convert<T>(unary_value<A>(op, convert<A>(x[off[1]]), s));
  }
}

template <class T>
__global__ void unary_backward_kernel(UnaryOp op, Layout<4> l, T* gx, const T* x, const T* y, const T* gy,
                                      Compute<T> s) {
  using A = Compute<T>;
  REMAT_GRID_LOOP(i, l.numel) {
    int64_t off[4];
    offsets_of(l, i, off);
    gx[off[0]] = convert<T>(unary_grad<A>(op, convert<A>(x[off[1]]), convert<A>(y[off[2]]), convert<A>(gy[off[3]]), s));
  }
}

template <class T>
__global__ void binary_kernel(BinaryOp op, Layout<3> l, T* out, const T* a, const T* b) {
  using A = Compute<T>;
  REMAT_GRID_LOOP(i, l.numel) {
    int64_t off[3];
    offsets_of(l, i, off);
    out[off[0]] = convert<T>(binary_value<A>(op, convert<A>(a[off[1]]), convert<A>(b[off[2]])));
  }
}

// Whether a condition element is nonzero (a 16-bit one through float, which holds it exactly).
template <class C>
__device__ inline bool nonzero(C v) {
  if constexpr (is_half_v<C>) return convert<float>(v) != 0.0f;
  else return v != C(0);
}

template <class C, class T>
__global__ void where_kernel(Layout<4> l, T* out, const C* cond, const T* a, const T* b) {
  REMAT_GRID_LOOP(i, l.numel) {
    int64_t off[4];
    offsets_of(l, i, off);
    out[off[0]] = nonzero(cond[off[1]]) ? a[off[2]] : b[off[3]];
  }
}

// The first element of a tensor's storage, typed (the layouts carry the offsets).
template <class T>
const T* base(const Tensor& t) {
  return static_cast<const T*>(t.storage()->data());
}

}  // namespace

void CudaBackend::unary(UnaryOp op, const Tensor& x, const Tensor& y, double scalar) {
  if (y.numel() == 0) return;
  DeviceGuard guard(device_);
  const Layout<2> l = make_layout<2>(y.shape(), {&y, &x});
  dispatch_storage(y.dtype(), unary_op_name(op), [&]<class T>() {
    unary_kernel<T><<<grid_for(l.numel), kThreads, 0, stream_>>>(op, l, static_cast<T*>(y.storage()->data()),
                                                                 base<T>(x), static_cast<Compute<T>>(scalar));
  });
  check_launch(unary_op_name(op));
}

void CudaBackend::unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& gy, const Tensor& gx,
                                 double scalar) {
  if (gx.numel() == 0) return;
  DeviceGuard guard(device_);
  // x or y may be undefined when the derivative does not need it: gy stands in
  const Tensor& xs = x.defined() ? x : gy;
  const Tensor& ys = y.defined() ? y : gy;
  const Layout<4> l = make_layout<4>(gx.shape(), {&gx, &xs, &ys, &gy});
  dispatch_storage(gx.dtype(), unary_op_name(op), [&]<class T>() {
    unary_backward_kernel<T><<<grid_for(l.numel), kThreads, 0, stream_>>>(
        op, l, static_cast<T*>(gx.storage()->data()), base<T>(xs), base<T>(ys), base<T>(gy),
        static_cast<Compute<T>>(scalar));
  });
  check_launch(unary_op_name(op));
}

void CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.numel() == 0) return;
  DeviceGuard guard(device_);
  const Layout<3> l = make_layout<3>(out.shape(), {&out, &a, &b});
  dispatch_storage(out.dtype(), binary_op_name(op), [&]<class T>() {
    binary_kernel<T><<<grid_for(l.numel), kThreads, 0, stream_>>>(op, l, static_cast<T*>(out.storage()->data()),
                                                                  base<T>(a), base<T>(b));
  });
  check_launch(binary_op_name(op));
}

void CudaBackend::where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.numel() == 0) return;
  DeviceGuard guard(device_);
  const Layout<4> l = make_layout<4>(out.shape(), {&out, &cond, &a, &b});
  dispatch_storage(out.dtype(), "where", [&]<class T>() {
    T* o = static_cast<T*>(out.storage()->data());
    switch (cond.dtype()) {
      case DType::f32:
        where_kernel<float, T>
            <<<grid_for(l.numel), kThreads, 0, stream_>>>(l, o, base<float>(cond), base<T>(a), base<T>(b));
        break;
      case DType::f64:
        where_kernel<double, T>
            <<<grid_for(l.numel), kThreads, 0, stream_>>>(l, o, base<double>(cond), base<T>(a), base<T>(b));
        break;
      case DType::i64:
        where_kernel<int64_t, T>
            <<<grid_for(l.numel), kThreads, 0, stream_>>>(l, o, base<int64_t>(cond), base<T>(a), base<T>(b));
        break;
      case DType::bf16:
        where_kernel<__nv_bfloat16, T><<<grid_for(l.numel), kThreads, 0, stream_>>>(
            l, o, base<__nv_bfloat16>(cond), base<T>(a), base<T>(b));
        break;
      case DType::f16:
        where_kernel<__half, T>
            <<<grid_for(l.numel), kThreads, 0, stream_>>>(l, o, base<__half>(cond), base<T>(a), base<T>(b));
        break;
    }
  });
  check_launch("where");
}

}  // namespace remat::cuda
