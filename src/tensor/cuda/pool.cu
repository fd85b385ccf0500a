// CUDA 2-D pooling over NCHW planes, mirroring src/tensor/cpu/pool.cpp: one thread per output
// element forward. The backwards never race on an input element: average and adaptive pooling
// compute each input element's gradient from the outputs whose windows hold it, in output order
// (the CPU's order of additions, so the sums are the CPU's); max pooling, whose backward gets no
// geometry, adds each plane's outputs into its input plane in output order on one thread.
#include <cmath>

#include "tensor/cuda/device_common.cuh"
#include "tensor/cuda/half.cuh"

namespace remat::cuda {

namespace {

using kernel::Planes;
using kernel::planes_of;

template <class S>
__global__ void max_pool_kernel(const S* x, Planes s, Pool2dGeometry g, S* y, int64_t* indices) {
  using T = Compute<S>;
  REMAT_GRID_LOOP(o, s.count * s.oh * s.ow) {
    const int64_t plane = o / (s.oh * s.ow), oh = (o / s.ow) % s.oh, ow = o % s.ow;
    const S* in = x + plane * s.h * s.w;
    const int64_t h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
    T best = -INFINITY;
    int64_t best_index = -1;
    for (int64_t i = 0; i < g.kernel_h; ++i) {
      const int64_t ih = h0 + i * g.dilation_h;
      if (ih < 0 || ih >= s.h) continue;
      for (int64_t j = 0; j < g.kernel_w; ++j) {
        const int64_t iw = w0 + j * g.dilation_w;
        if (iw < 0 || iw >= s.w) continue;
        const T v = convert<T>(in[ih * s.w + iw]);
        if (best_index < 0 || v > best || is_nan(v)) best = v, best_index = ih * s.w + iw;  // first max; NaN wins
      }
    }
    y[o] = convert<S>(best);
    indices[o] = best_index;
  }
}

template <class T>
__global__ void max_pool_backward_kernel(const T* gy, const int64_t* indices, T* gx, Planes s) {
  REMAT_GRID_LOOP(plane, s.count) {
    T* out = gx + plane * s.h * s.w;
    const T* in = gy + plane * s.oh * s.ow;
    const int64_t* idx = indices + plane * s.oh * s.ow;
    for (int64_t i = 0; i < s.oh * s.ow; ++i)
      if (idx[i] >= 0) out[idx[i]] += in[i];
  }
}

using kernel::AvgWindow;
using kernel::avg_window;

template <class S>
__global__ void avg_pool_kernel(const S* x, Planes s, Pool2dGeometry g, S* y) {
  using T = Compute<S>;
  REMAT_GRID_LOOP(o, s.count * s.oh * s.ow) {
    const int64_t plane = o / (s.oh * s.ow), oh = (o / s.ow) % s.oh, ow = o % s.ow;
    const S* in = x + plane * s.h * s.w;
    const AvgWindow win = avg_window(g, s.h, s.w, oh, ow);
    Acc<T> total = 0;
    for (int64_t ih = win.h0; ih < win.h1; ++ih)
      for (int64_t iw = win.w0; iw < win.w1; ++iw) total += static_cast<Acc<T>>(convert<T>(in[ih * s.w + iw]));
    y[o] = convert<S>(win.divisor > 0 ? static_cast<T>(total / static_cast<Acc<T>>(win.divisor)) : T(0));
  }
}

// Outputs along one axis whose (unclipped) window [o * stride - pad, + kernel) may hold `i`.
__device__ inline void candidates(int64_t i, int64_t pad, int64_t kernel, int64_t stride, int64_t count, int64_t& lo,
                                  int64_t& hi) {
  const int64_t first = i + pad - kernel + 1;
  lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  hi = min(count - 1, (i + pad) / stride);
}

template <class S>
__global__ void avg_pool_backward_kernel(const S* gy, Planes s, Pool2dGeometry g, S* gx) {
  using T = Compute<S>;
  REMAT_GRID_LOOP(e, s.count * s.h * s.w) {
    const int64_t plane = e / (s.h * s.w), ih = (e / s.w) % s.h, iw = e % s.w;
    const S* in = gy + plane * s.oh * s.ow;
    int64_t oh0, oh1, ow0, ow1;
    candidates(ih, g.pad_h, g.kernel_h, g.stride_h, s.oh, oh0, oh1);
    candidates(iw, g.pad_w, g.kernel_w, g.stride_w, s.ow, ow0, ow1);
    T acc = T(0);
    for (int64_t oh = oh0; oh <= oh1; ++oh)
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        const AvgWindow win = avg_window(g, s.h, s.w, oh, ow);
        if (win.divisor <= 0 || ih < win.h0 || ih >= win.h1 || iw < win.w0 || iw >= win.w1) continue;
        acc += static_cast<T>(static_cast<Acc<T>>(convert<T>(in[oh * s.ow + ow])) / static_cast<Acc<T>>(win.divisor));
      }
    gx[e] = convert<S>(acc);
  }
}

// Bin i of n over an axis of length len: [floor(i len / n), ceil((i + 1) len / n)).
__device__ inline int64_t bin_start(int64_t i, int64_t len, int64_t n) { return (i * len) / n; }
__device__ inline int64_t bin_end(int64_t i, int64_t len, int64_t n) { return ((i + 1) * len + n - 1) / n; }

template <class S>
__global__ void adaptive_kernel(const S* x, Planes s, S* y) {
  using T = Compute<S>;
  REMAT_GRID_LOOP(o, s.count * s.oh * s.ow) {
    const int64_t plane = o / (s.oh * s.ow), oh = (o / s.ow) % s.oh, ow = o % s.ow;
    const S* in = x + plane * s.h * s.w;
    const int64_t h0 = bin_start(oh, s.h, s.oh), h1 = bin_end(oh, s.h, s.oh);
    const int64_t w0 = bin_start(ow, s.w, s.ow), w1 = bin_end(ow, s.w, s.ow);
    Acc<T> total = 0;
    for (int64_t ih = h0; ih < h1; ++ih)
      for (int64_t iw = w0; iw < w1; ++iw) total += static_cast<Acc<T>>(convert<T>(in[ih * s.w + iw]));
    y[o] = convert<S>(static_cast<T>(total / static_cast<Acc<T>>((h1 - h0) * (w1 - w0))));
  }
}

// Bins along one axis that may hold input index i (checked again by the caller).
__device__ inline void bins_holding(int64_t i, int64_t len, int64_t n, int64_t& lo, int64_t& hi) {
  lo = max(int64_t(0), (i * n) / len - 1);
  hi = min(n - 1, ((i + 1) * n + len - 1) / len);
}

template <class S>
__global__ void adaptive_backward_kernel(const S* gy, Planes s, S* gx) {
  using T = Compute<S>;
  REMAT_GRID_LOOP(e, s.count * s.h * s.w) {
    const int64_t plane = e / (s.h * s.w), ih = (e / s.w) % s.h, iw = e % s.w;
    const S* in = gy + plane * s.oh * s.ow;
    int64_t oh0, oh1, ow0, ow1;
    bins_holding(ih, s.h, s.oh, oh0, oh1);
    bins_holding(iw, s.w, s.ow, ow0, ow1);
    T acc = T(0);
    for (int64_t oh = oh0; oh <= oh1; ++oh) {
      const int64_t h0 = bin_start(oh, s.h, s.oh), h1 = bin_end(oh, s.h, s.oh);
      if (ih < h0 || ih >= h1) continue;
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        const int64_t w0 = bin_start(ow, s.w, s.ow), w1 = bin_end(ow, s.w, s.ow);
        if (iw < w0 || iw >= w1) continue;
        acc += static_cast<T>(static_cast<Acc<T>>(convert<T>(in[oh * s.ow + ow])) /
                              static_cast<Acc<T>>((h1 - h0) * (w1 - w0)));
      }
    }
    gx[e] = convert<S>(acc);
  }
}

}  // namespace

void CudaBackend::max_pool2d(const Tensor& x_in, const Pool2dGeometry& g, const Tensor& y, const Tensor& indices) {
  if (y.numel() == 0) return;
  DeviceGuard guard(device_);
  Tensor x = contiguous(x_in);
  const Planes s = planes_of(x, y);
  dispatch_storage(x.dtype(), "max_pool2d", [&]<class T>() {
    max_pool_kernel<T>
        <<<grid_for(y.numel()), kThreads, 0, stream_>>>(ptr<T>(x), s, g, ptr<T>(y), ptr<int64_t>(indices));
  });
  check_launch("max_pool2d");
}

void CudaBackend::max_pool2d_backward(const Tensor& gy_in, const Tensor& indices_in, const Tensor& gx) {
  if (gx.numel() == 0) return;
  DeviceGuard guard(device_);
  Tensor gy = contiguous(gy_in), indices = contiguous(indices_in);
  const Planes s = planes_of(gx, gy);
  fill(gx, 0.0);
  dispatch_float(gx.dtype(), "max_pool2d_backward", [&]<class T>() {
    max_pool_backward_kernel<T>
        <<<grid_for(s.count, 64), 64, 0, stream_>>>(ptr<T>(gy), ptr<int64_t>(indices), ptr<T>(gx), s);
  });
  check_launch("max_pool2d_backward");
}

void CudaBackend::avg_pool2d(const Tensor& x_in, const Pool2dGeometry& g, const Tensor& y) {
  if (y.numel() == 0) return;
  DeviceGuard guard(device_);
  Tensor x = contiguous(x_in);
  const Planes s = planes_of(x, y);
  dispatch_storage(x.dtype(), "avg_pool2d", [&]<class T>() {
    avg_pool_kernel<T><<<grid_for(y.numel()), kThreads, 0, stream_>>>(ptr<T>(x), s, g, ptr<T>(y));
  });
  check_launch("avg_pool2d");
}

void CudaBackend::avg_pool2d_backward(const Tensor& gy_in, const Pool2dGeometry& g, const Tensor& gx) {
  if (gx.numel() == 0) return;
  DeviceGuard guard(device_);
  Tensor gy = contiguous(gy_in);
  const Planes s = planes_of(gx, gy);
  dispatch_storage(gx.dtype(), "avg_pool2d_backward", [&]<class T>() {
    avg_pool_backward_kernel<T><<<grid_for(gx.numel()), kThreads, 0, stream_>>>(ptr<T>(gy), s, g, ptr<T>(gx));
  });
  check_launch("avg_pool2d_backward");
}

void CudaBackend::adaptive_avg_pool2d(const Tensor& x_in, const Tensor& y) {
  if (y.numel() == 0) return;
  DeviceGuard guard(device_);
  Tensor x = contiguous(x_in);
  const Planes s = planes_of(x, y);
  dispatch_storage(x.dtype(), "adaptive_avg_pool2d", [&]<class T>() {
    adaptive_kernel<T><<<grid_for(y.numel()), kThreads, 0, stream_>>>(ptr<T>(x), s, ptr<T>(y));
  });
  check_launch("adaptive_avg_pool2d");
}

void CudaBackend::adaptive_avg_pool2d_backward(const Tensor& gy_in, const Tensor& gx) {
  if (gx.numel() == 0) return;
  DeviceGuard guard(device_);
  Tensor gy = contiguous(gy_in);
  const Planes s = planes_of(gx, gy);
  dispatch_storage(gx.dtype(), "adaptive_avg_pool2d_backward", [&]<class T>() {
    adaptive_backward_kernel<T><<<grid_for(gx.numel()), kThreads, 0, stream_>>>(ptr<T>(gy), s, ptr<T>(gx));
  });
  check_launch("adaptive_avg_pool2d_backward");
}

}  // namespace remat::cuda
