// CUDA elementwise kernels: unary ops and their derivatives, broadcasting binary ops and where,
// over strided inputs (one thread per output element; the index is decoded into each operand's
// offset, device_common.cuh). The formulas are the CPU's (src/tensor/cpu/elementwise.cpp),
// including NaN propagation of relu, maximum and minimum. bf16 and f16 operands (REMAT_CUDA_FAST=
// bf16) take the generic kernels: each element widened to float, the float formula, the result
// rounded once (half.cuh), as the CPU computes them.
#include <array>
#include <cmath>
#include <cstdint>

#include "tensor/cuda/device_common.cuh"
#include "tensor/cuda/half.cuh"

namespace remat::cuda {

namespace {

using kernel::kGeluTanhCubic;
using kernel::kInvSqrt2;
using kernel::kInvSqrt2Pi;
using kernel::kSqrt2OverPi;

template <class T>
__device__ inline T sigmoid_of(T x) {
  return T(1) / (T(1) + exp(-x));
}

template <class T>
__device__ inline T unary_value(UnaryOp op, T x, T s) {
  switch (op) {
    case UnaryOp::neg: return -x;
    case UnaryOp::exp: return exp(x);
    case UnaryOp::log: return log(x);
    case UnaryOp::sqrt: return sqrt(x);
    case UnaryOp::abs: return fabs(x);
    case UnaryOp::tanh: return tanh(x);
    case UnaryOp::sigmoid: return sigmoid_of(x);
    case UnaryOp::relu: return x > T(0) || x != x ? x : T(0);  // NaN stays NaN
    case UnaryOp::gelu: return T(0.5) * x * (T(1) + erf(x * T(kInvSqrt2)));
    case UnaryOp::gelu_tanh: return T(0.5) * x * (T(1) + tanh(T(kSqrt2OverPi) * (x + T(kGeluTanhCubic) * x * x * x)));
    case UnaryOp::silu: return x * sigmoid_of(x);
    case UnaryOp::pow_scalar: return pow(x, s);
    case UnaryOp::square: return x * x;
    case UnaryOp::reciprocal: return T(1) / x;
    case UnaryOp::add_scalar: return x + s;
    case UnaryOp::mul_scalar: return x * s;
    case UnaryOp::sign: return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0));
  }
  return x;
}

// d op(x)/dx times gy, from x and/or y = op(x)
template <class T>
__device__ inline T unary_grad(UnaryOp op, T x, T y, T gy, T s) {
  switch (op) {
    case UnaryOp::neg: return -gy;
    case UnaryOp::exp: return gy * y;
    case UnaryOp::log: return gy / x;
    case UnaryOp::sqrt: return gy * T(0.5) / y;
    case UnaryOp::abs: return x > T(0) ? gy : (x < T(0) ? -gy : T(0));
    case UnaryOp::tanh: return gy * (T(1) - y * y);
    case UnaryOp::sigmoid: return gy * y * (T(1) - y);
    case UnaryOp::relu: return x > T(0) ? gy : T(0);
    case UnaryOp::gelu: {
      const T cdf = T(0.5) * (T(1) + erf(x * T(kInvSqrt2)));
      const T pdf = T(kInvSqrt2Pi) * exp(T(-0.5) * x * x);
      return gy * (cdf + x * pdf);
    }
    case UnaryOp::gelu_tanh: {
      const T inner = T(kSqrt2OverPi) * (x + T(kGeluTanhCubic) * x * x * x);
      const T t = tanh(inner);
      const T dinner = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluTanhCubic) * x * x);
      return gy * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * dinner);
    }
    case UnaryOp::silu: {
      const T sg = sigmoid_of(x);
      return gy * sg * (T(1) + x * (T(1) - sg));
    }
    case UnaryOp::pow_scalar: return gy * s * pow(x, s - T(1));
    case UnaryOp::square: return gy * T(2) * x;
    case UnaryOp::reciprocal: return -gy / (x * x);
    case UnaryOp::add_scalar: return gy;
    case UnaryOp::mul_scalar: return gy * s;
    case UnaryOp::sign: return T(0);
  }
  return gy;
}

template <class T>
__device__ inline T binary_value(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    // NaN propagates: a when a >= b (ties) or a is NaN; otherwise b (which may be NaN)
    case BinaryOp::maximum: return a >= b || a != a ? a : b;
    case BinaryOp::minimum: return a <= b || a != a ? a : b;
    case BinaryOp::maximum_picks_b: return a >= b || a != a ? T(0) : T(1);
    case BinaryOp::minimum_picks_b: return a <= b || a != a ? T(0) : T(1);
  }
  return a;
}

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

// ---- contiguous operands (REMAT_CUDA_FAST=elementwise): every operand one unit-stride run of the
// output's length, 16-byte aligned, fewer than 2^31 elements. 32-bit indices and 16-byte loads
// and stores; each element gets the generic kernels' expression, so the bits are theirs.
template <class T>
struct alignas(16) Vec16 {
  static constexpr int kN = 16 / sizeof(T);
  T v[kN];
};

template <class T, class F>
__device__ inline void flat_loop(int n, F&& element) {
  constexpr int kN = Vec16<T>::kN;
  const int vecs = n / kN, stride = gridDim.x * blockDim.x;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < vecs; i += stride) element.vector(i);
  for (int i = vecs * kN + blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) element.scalar(i);
}

template <class T>
struct UnaryFlat {
  UnaryOp op;
  T* y;
  const T* x;
  T s;
  __device__ void vector(int i) const {
    Vec16<T> in = reinterpret_cast<const Vec16<T>*>(x)[i], out;
#pragma unroll
    for (int e = 0; e < Vec16<T>::kN; ++e) out.v[e] = unary_value<T>(op, in.v[e], s);
    reinterpret_cast<Vec16<T>*>(y)[i] = out;
  }
  __device__ void scalar(int i) const { y[i] = unary_value<T>(op, x[i], s); }
};
template <class T>
struct UnaryBackwardFlat {
  UnaryOp op;
  T* gx;
  const T *x, *y, *gy;
  T s;
  __device__ void vector(int i) const {
    const Vec16<T> a = reinterpret_cast<const Vec16<T>*>(x)[i], b = reinterpret_cast<const Vec16<T>*>(y)[i],
                   g = reinterpret_cast<const Vec16<T>*>(gy)[i];
    Vec16<T> out;
#pragma unroll
    for (int e = 0; e < Vec16<T>::kN; ++e) out.v[e] = unary_grad<T>(op, a.v[e], b.v[e], g.v[e], s);
    reinterpret_cast<Vec16<T>*>(gx)[i] = out;
  }
  __device__ void scalar(int i) const { gx[i] = unary_grad<T>(op, x[i], y[i], gy[i], s); }
};
template <class T>
struct BinaryFlat {
  BinaryOp op;
  T* out;
  const T *a, *b;
  __device__ void vector(int i) const {
    const Vec16<T> u = reinterpret_cast<const Vec16<T>*>(a)[i], w = reinterpret_cast<const Vec16<T>*>(b)[i];
    Vec16<T> r;
#pragma unroll
    for (int e = 0; e < Vec16<T>::kN; ++e) r.v[e] = binary_value<T>(op, u.v[e], w.v[e]);
    reinterpret_cast<Vec16<T>*>(out)[i] = r;
  }
  __device__ void scalar(int i) const { out[i] = binary_value<T>(op, a[i], b[i]); }
};

template <class T, class E>
__global__ void flat_kernel(int n, E element) {
  flat_loop<T>(n, element);
}

// Whether the layout's operands all qualify for the flat kernels (pointers: each operand's first
// element).
template <int N>
bool flat(const Layout<N>& l, const std::array<const void*, N>& first) {
  if (!fast(Fast::elementwise) || l.rank != 1 || l.numel >= (int64_t{1} << 31)) return false;
  for (int k = 0; k < N; ++k)
    if (l.strides[k][0] != 1 || reinterpret_cast<uintptr_t>(first[k]) % 16 != 0) return false;
  return true;
}
unsigned flat_grid(int64_t n, size_t element_bytes) { return grid_for(n / static_cast<int64_t>(16 / element_bytes) + 1); }

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
    T* yp = static_cast<T*>(y.storage()->data()) + l.offsets[0];
    const T* xp = base<T>(x) + l.offsets[1];
    if constexpr (!is_half_v<T>)
      if (flat<2>(l, {yp, xp}))
        return flat_kernel<T><<<flat_grid(l.numel, sizeof(T)), kThreads, 0, stream_>>>(
            static_cast<int>(l.numel), UnaryFlat<T>{op, yp, xp, static_cast<T>(scalar)});
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
    T* gp = static_cast<T*>(gx.storage()->data()) + l.offsets[0];
    const T *xp = base<T>(xs) + l.offsets[1], *yp = base<T>(ys) + l.offsets[2], *gyp = base<T>(gy) + l.offsets[3];
    if constexpr (!is_half_v<T>)
      if (flat<4>(l, {gp, xp, yp, gyp}))
        return flat_kernel<T><<<flat_grid(l.numel, sizeof(T)), kThreads, 0, stream_>>>(
            static_cast<int>(l.numel), UnaryBackwardFlat<T>{op, gp, xp, yp, gyp, static_cast<T>(scalar)});
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
    T* op_out = static_cast<T*>(out.storage()->data()) + l.offsets[0];
    const T *ap = base<T>(a) + l.offsets[1], *bp = base<T>(b) + l.offsets[2];
    if constexpr (!is_half_v<T>)
      if (flat<3>(l, {op_out, ap, bp}))
        return flat_kernel<T><<<flat_grid(l.numel, sizeof(T)), kThreads, 0, stream_>>>(
            static_cast<int>(l.numel), BinaryFlat<T>{op, op_out, ap, bp});
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
