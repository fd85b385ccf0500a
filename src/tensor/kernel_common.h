// Internal: host-side logic that every backend's kernels share (the CPU's src/tensor/cpu/, the
// CUDA backend's src/tensor/cuda/), stated once: dtype dispatch, the constants of GELU, which
// strided [batch, rows, cols] operands a BLAS takes as they are, the planes of a pooling problem
// and its average windows, the channel layout of batch norm, index ranges known on the host, the
// optimizer state checks and the strides of a broadcast operand. Backend-neutral: no backend's
// headers, and the few functions a device kernel also calls are marked REMAT_HOST_DEVICE
// (compiled for both sides by nvcc).
//
//   dispatch_float(x.dtype(), "exp", [&]<class T>() { run<T>(x, y); });
//   const Planes s = planes_of(x, y);   // x [N, C, H, W] -> s.count = N * C planes of H x W
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "remat/backend.h"

#if defined(__CUDACC__)
#define REMAT_HOST_DEVICE __host__ __device__
#else
#define REMAT_HOST_DEVICE
#endif

namespace remat::kernel {

// Calls f.template operator()<T>() with T = float or double for f32 or f64; any other dtype is a
// remat::Error naming `op`.
template <class F>
decltype(auto) dispatch_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    default: throw Error(detail::concat(op, ": unsupported dtype ", dtype_name(dtype)));
  }
}

// ---- GELU: 0.5 x (1 + erf(x / sqrt 2)), and the tanh form 0.5 x (1 + tanh(sqrt(2 / pi) (x + c x^3)))
inline constexpr double kInvSqrt2 = 0.7071067811865476;      // 1 / sqrt(2)
inline constexpr double kInvSqrt2Pi = 0.3989422804014327;    // 1 / sqrt(2 pi), the normal density's factor
inline constexpr double kSqrt2OverPi = 0.7978845608028654;   // sqrt(2 / pi)
inline constexpr double kGeluTanhCubic = 0.044715;           // c

// ---- matrix products
// A [batch, rows, cols] operand as a row-major BLAS takes it: leading dimension ld and whether the
// stored matrix is the transpose of the logical one (the caller adds the base pointer).
struct MatrixLayout {
  int64_t batch_stride = 0;  // 0 broadcasts one matrix over the batch
  int64_t ld = 0;
  bool trans = false;
};
// Whether t's strides are a matrix with one unit stride and a leading dimension a BLAS accepts (at
// most `max_leading`, the int limit of CBLAS and cuBLAS); if so, its layout. Other operands are
// copied to a contiguous one first.
inline bool matrix_layout(const Tensor& t, bool logical_trans, int64_t max_leading, MatrixLayout& out) {
  const auto& st = t.strides();
  const int64_t rows = t.shape()[1], cols = t.shape()[2];
  out.batch_stride = t.shape()[0] == 1 ? 0 : st[0];
  if ((st[2] == 1 || cols == 1) && st[1] >= std::max<int64_t>(cols, 1) && st[1] <= max_leading) {
    out.ld = std::max<int64_t>(st[1], 1);
    out.trans = logical_trans;
    return true;
  }
  if ((st[1] == 1 || rows == 1) && st[2] >= std::max<int64_t>(rows, 1) && st[2] <= max_leading) {
    out.ld = std::max<int64_t>(st[2], 1);
    out.trans = !logical_trans;
    return true;
  }
  return false;
}

// ---- broadcasting: the strides of t broadcast to `shape` (0 on broadcast axes), right-aligned
inline std::vector<int64_t> broadcast_strides(const Tensor& t, const Shape& shape) {
  std::vector<int64_t> strides(shape.size(), 0);
  const size_t lead = shape.size() - t.shape().size();
  for (size_t i = 0; i < t.shape().size(); ++i) strides[lead + i] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  return strides;
}

// ---- pooling over NCHW planes: x [N, C, H, W] -> y [N, C, OH, OW], count = N * C
struct Planes {
  int64_t count, h, w, oh, ow;
};
inline Planes planes_of(const Tensor& x, const Tensor& y) {
  return {x.shape()[0] * x.shape()[1], x.shape()[2], x.shape()[3], y.shape()[2], y.shape()[3]};
}
// The window of average-pooling output (oh, ow) clipped to the input [h, w], and its divisor
// (Pool2dGeometry's count_include_pad rule).
struct AvgWindow {
  int64_t h0, h1, w0, w1;
  int64_t divisor;
};
REMAT_HOST_DEVICE inline AvgWindow avg_window(const Pool2dGeometry& g, int64_t h, int64_t w, int64_t oh, int64_t ow) {
  int64_t h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
  int64_t h1 = h0 + g.kernel_h < h + g.pad_h ? h0 + g.kernel_h : h + g.pad_h;
  int64_t w1 = w0 + g.kernel_w < w + g.pad_w ? w0 + g.kernel_w : w + g.pad_w;
  const int64_t padded = (h1 - h0) * (w1 - w0);
  h0 = h0 > 0 ? h0 : 0;
  w0 = w0 > 0 ? w0 : 0;
  h1 = h1 < h ? h1 : h;
  w1 = w1 < w ? w1 : w;
  const int64_t inside = (h1 > h0 ? h1 - h0 : 0) * (w1 > w0 ? w1 - w0 : 0);
  return {h0, h1, w0, w1, g.count_include_pad ? padded : inside};
}

// ---- batch normalisation: x [N, C, S...] as n x c channels of s elements each
struct ChannelLayout {
  int64_t n, c, s;
};
inline ChannelLayout channel_layout(const Tensor& x) {
  int64_t s = 1;
  for (int64_t i = 2; i < x.dim(); ++i) s *= x.shape()[i];
  return {x.shape()[0], x.shape()[1], s};
}
// The flat index of element k (of n * s) of channel c.
REMAT_HOST_DEVICE inline int64_t channel_element(const ChannelLayout& l, int64_t c, int64_t k) {
  return ((k / l.s) * l.c + c) * l.s + k % l.s;
}

// ---- index checks: whether the values of the i64 tensor t are known, without reading it, to lie
// in [lo, hi) (Storage::index_range: written from host values or by arange). An asynchronous
// device then skips its check on the device, and with it a wait for the verdict.
inline bool indices_known_within(const Tensor& t, int64_t lo, int64_t hi) {
  int64_t smallest = 0, largest = 0;
  return t.numel() == 0 || (t.storage()->index_range(smallest, largest) && smallest >= lo && largest < hi);
}

// ---- optimizer updates: a state tensor (parameter, gradient, moment) must be contiguous, of the
// parameter's shape and dtype; an undefined one (no momentum buffer) passes.
inline void check_optimizer_state(const Tensor& t, const Tensor& param, const char* op, const char* what) {
  REMAT_ASSERT(!t.defined() || (t.is_contiguous() && t.shape() == param.shape() && t.dtype() == param.dtype()), op,
               ": ", what, " of shape ", shape_str(t.shape()), " does not match the parameter ",
               shape_str(param.shape()));
}

}  // namespace remat::kernel
