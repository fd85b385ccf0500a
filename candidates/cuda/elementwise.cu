// Candidate: the elementwise kernels (unary, unary_backward, binary) over contiguous operands, as
// flat kernels with 32-bit indices and 16-byte loads and stores. They replace the strided kernels
// of src/tensor/cuda/elementwise.cu where every operand is one unit-stride run of the output's
// length, 16-byte aligned, with fewer than 2^31 elements (float32 and float64; 16-bit operands keep
// the strided kernels). Each element gets the strided kernels' expression (elementwise.cuh), so
// the harness asks for their bits.
#include "candidates/cuda/candidates.h"
#include "tensor/cuda/elementwise.cuh"

namespace remat::candidates::cuda {

namespace {

using remat::cuda::kThreads;
using remat::cuda::Layout;
using remat::cuda::make_layout;
using remat::cuda::elementwise::binary_value;
using remat::cuda::elementwise::unary_grad;
using remat::cuda::elementwise::unary_value;

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
  if (l.rank != 1 || l.numel >= (int64_t{1} << 31)) return false;
  for (int k = 0; k < N; ++k)
    if (l.strides[k][0] != 1 || reinterpret_cast<uintptr_t>(first[k]) % 16 != 0) return false;
  return true;
}
unsigned flat_grid(int64_t n, size_t element_bytes) {
  return remat::cuda::grid_for(n / static_cast<int64_t>(16 / element_bytes) + 1);
}

template <class T>
T* first(const Tensor& t, int64_t offset) {
  return static_cast<T*>(t.storage()->data()) + offset;
}

// Runs `launch.template operator()<T>()` for float or double `dtype`; false for any other.
template <class Launch>
bool float_or_double(DType dtype, Launch&& launch) {
  if (dtype == DType::f32) return launch.template operator()<float>();
  if (dtype == DType::f64) return launch.template operator()<double>();
  return false;
}

}  // namespace

bool unary_flat(CudaBackend& be, UnaryOp op, const Tensor& x, const Tensor& y, double scalar) {
  if (y.numel() == 0) return false;
  remat::cuda::DeviceGuard guard(be.device());
  const Layout<2> l = make_layout<2>(y.shape(), {&y, &x});
  return float_or_double(y.dtype(), [&]<class T>() {
    T* yp = first<T>(y, l.offsets[0]);
    const T* xp = first<T>(x, l.offsets[1]);
    if (!flat<2>(l, {yp, xp})) return false;
    flat_kernel<T><<<flat_grid(l.numel, sizeof(T)), kThreads, 0, be.stream()>>>(
        static_cast<int>(l.numel), UnaryFlat<T>{op, yp, xp, static_cast<T>(scalar)});
    remat::cuda::check_launch("unary (flat)");
    return true;
  });
}

bool unary_backward_flat(CudaBackend& be, UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& gy,
                         const Tensor& gx, double scalar) {
  if (gx.numel() == 0) return false;
  remat::cuda::DeviceGuard guard(be.device());
  const Tensor& xs = x.defined() ? x : gy;
  const Tensor& ys = y.defined() ? y : gy;
  const Layout<4> l = make_layout<4>(gx.shape(), {&gx, &xs, &ys, &gy});
  return float_or_double(gx.dtype(), [&]<class T>() {
    T* gp = first<T>(gx, l.offsets[0]);
    const T *xp = first<T>(xs, l.offsets[1]), *yp = first<T>(ys, l.offsets[2]), *gyp = first<T>(gy, l.offsets[3]);
    if (!flat<4>(l, {gp, xp, yp, gyp})) return false;
    flat_kernel<T><<<flat_grid(l.numel, sizeof(T)), kThreads, 0, be.stream()>>>(
        static_cast<int>(l.numel), UnaryBackwardFlat<T>{op, gp, xp, yp, gyp, static_cast<T>(scalar)});
    remat::cuda::check_launch("unary_backward (flat)");
    return true;
  });
}

bool binary_flat(CudaBackend& be, BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.numel() == 0) return false;
  remat::cuda::DeviceGuard guard(be.device());
  const Layout<3> l = make_layout<3>(out.shape(), {&out, &a, &b});
  return float_or_double(out.dtype(), [&]<class T>() {
    T* op_out = first<T>(out, l.offsets[0]);
    const T *ap = first<T>(a, l.offsets[1]), *bp = first<T>(b, l.offsets[2]);
    if (!flat<3>(l, {op_out, ap, bp})) return false;
    flat_kernel<T><<<flat_grid(l.numel, sizeof(T)), kThreads, 0, be.stream()>>>(static_cast<int>(l.numel),
                                                                                BinaryFlat<T>{op, op_out, ap, bp});
    remat::cuda::check_launch("binary (flat)");
    return true;
  });
}

}  // namespace remat::candidates::cuda
