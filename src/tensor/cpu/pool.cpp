// CPU 2-D pooling over NCHW planes: max (with the argmax positions for the backward), average
// (PyTorch's padding and ceil-mode rules) and adaptive average, forward and backward. Pooling
// reads each input element a few times and does no arithmetic to speak of, so it is memory-bound;
// direct loops over contiguous planes, one plane per thread at a time, serve both dtypes (oneDNN's
// pooling would need the same layout reorders as its convolutions; see docs/performance.md,
// "Kernel choices"). Each plane is written by one thread in a fixed order: results do not depend on the
// thread count.
#include <cmath>
#include <cstring>
#include <limits>

#include "tensor/cpu/cpu_backend.h"

namespace remat::cpu {

namespace {

using kernel::Planes;
using kernel::planes_of;

template <class T>
void max_pool_forward(const Tensor& x, const Pool2dGeometry& g, const Tensor& y, const Tensor& indices) {
  const Planes s = planes_of(x, y);
  const T* xp = x.data<T>();
  T* yp = y.data<T>();
  int64_t* ip = indices.data<int64_t>();
  for_rows(s.count, s.h * s.w, [&](int64_t plane) {
    const T* in = xp + plane * s.h * s.w;
    T* out = yp + plane * s.oh * s.ow;
    int64_t* idx = ip + plane * s.oh * s.ow;
    for (int64_t oh = 0; oh < s.oh; ++oh)
      for (int64_t ow = 0; ow < s.ow; ++ow) {
        const int64_t h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
        T best = -std::numeric_limits<T>::infinity();
        int64_t best_index = -1;
        for (int64_t i = 0; i < g.kernel_h; ++i) {
          const int64_t ih = h0 + i * g.dilation_h;
          if (ih < 0 || ih >= s.h) continue;
          for (int64_t j = 0; j < g.kernel_w; ++j) {
            const int64_t iw = w0 + j * g.dilation_w;
            if (iw < 0 || iw >= s.w) continue;
            const T v = in[ih * s.w + iw];
            // the first maximum wins; a NaN propagates (as in PyTorch)
            if (best_index < 0 || v > best || std::isnan(v)) {
              best = v;
              best_index = ih * s.w + iw;
            }
          }
        }
        out[oh * s.ow + ow] = best;
        idx[oh * s.ow + ow] = best_index;
      }
  });
}

template <class T>
void max_pool_backward(const Tensor& gy, const Tensor& indices, const Tensor& gx) {
  const Planes s = planes_of(gx, gy);
  const T* gyp = gy.data<T>();
  const int64_t* ip = indices.data<int64_t>();
  T* gxp = gx.data<T>();
  for_rows(s.count, s.h * s.w, [&](int64_t plane) {
    T* out = gxp + plane * s.h * s.w;
    std::memset(out, 0, static_cast<size_t>(s.h * s.w) * sizeof(T));
    const T* in = gyp + plane * s.oh * s.ow;
    const int64_t* idx = ip + plane * s.oh * s.ow;
    for (int64_t i = 0; i < s.oh * s.ow; ++i)
      if (idx[i] >= 0) out[idx[i]] += in[i];
  });
}

using kernel::AvgWindow;
using kernel::avg_window;

template <class T>
void avg_pool_forward(const Tensor& x, const Pool2dGeometry& g, const Tensor& y) {
  const Planes s = planes_of(x, y);
  const T* xp = x.data<T>();
  T* yp = y.data<T>();
  for_rows(s.count, s.h * s.w, [&](int64_t plane) {
    const T* in = xp + plane * s.h * s.w;
    T* out = yp + plane * s.oh * s.ow;
    for (int64_t oh = 0; oh < s.oh; ++oh)
      for (int64_t ow = 0; ow < s.ow; ++ow) {
        const AvgWindow win = avg_window(g, s.h, s.w, oh, ow);
        Acc<T> total = 0;
        for (int64_t ih = win.h0; ih < win.h1; ++ih)
          for (int64_t iw = win.w0; iw < win.w1; ++iw) total += static_cast<Acc<T>>(in[ih * s.w + iw]);
        out[oh * s.ow + ow] = win.divisor > 0 ? static_cast<T>(total / static_cast<Acc<T>>(win.divisor)) : T(0);
      }
  });
}

template <class T>
void avg_pool_backward(const Tensor& gy, const Pool2dGeometry& g, const Tensor& gx) {
  const Planes s = planes_of(gx, gy);
  const T* gyp = gy.data<T>();
  T* gxp = gx.data<T>();
  for_rows(s.count, s.h * s.w, [&](int64_t plane) {
    T* out = gxp + plane * s.h * s.w;
    std::memset(out, 0, static_cast<size_t>(s.h * s.w) * sizeof(T));
    const T* in = gyp + plane * s.oh * s.ow;
    for (int64_t oh = 0; oh < s.oh; ++oh)
      for (int64_t ow = 0; ow < s.ow; ++ow) {
        const AvgWindow win = avg_window(g, s.h, s.w, oh, ow);
        if (win.divisor <= 0) continue;
        const T share = static_cast<T>(static_cast<Acc<T>>(in[oh * s.ow + ow]) / static_cast<Acc<T>>(win.divisor));
        for (int64_t ih = win.h0; ih < win.h1; ++ih)
          for (int64_t iw = win.w0; iw < win.w1; ++iw) out[ih * s.w + iw] += share;
      }
  });
}

// Bin i of n over an axis of length len: [floor(i len / n), ceil((i + 1) len / n)).
inline int64_t bin_start(int64_t i, int64_t len, int64_t n) { return (i * len) / n; }
inline int64_t bin_end(int64_t i, int64_t len, int64_t n) { return ((i + 1) * len + n - 1) / n; }

template <class T>
void adaptive_forward(const Tensor& x, const Tensor& y) {
  const Planes s = planes_of(x, y);
  const T* xp = x.data<T>();
  T* yp = y.data<T>();
  for_rows(s.count, s.h * s.w, [&](int64_t plane) {
    const T* in = xp + plane * s.h * s.w;
    T* out = yp + plane * s.oh * s.ow;
    for (int64_t oh = 0; oh < s.oh; ++oh) {
      const int64_t h0 = bin_start(oh, s.h, s.oh), h1 = bin_end(oh, s.h, s.oh);
      for (int64_t ow = 0; ow < s.ow; ++ow) {
        const int64_t w0 = bin_start(ow, s.w, s.ow), w1 = bin_end(ow, s.w, s.ow);
        Acc<T> total = 0;
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) total += static_cast<Acc<T>>(in[ih * s.w + iw]);
        out[oh * s.ow + ow] = static_cast<T>(total / static_cast<Acc<T>>((h1 - h0) * (w1 - w0)));
      }
    }
  });
}

template <class T>
void adaptive_backward(const Tensor& gy, const Tensor& gx) {
  const Planes s = planes_of(gx, gy);
  const T* gyp = gy.data<T>();
  T* gxp = gx.data<T>();
  for_rows(s.count, s.h * s.w, [&](int64_t plane) {
    T* out = gxp + plane * s.h * s.w;
    std::memset(out, 0, static_cast<size_t>(s.h * s.w) * sizeof(T));
    const T* in = gyp + plane * s.oh * s.ow;
    for (int64_t oh = 0; oh < s.oh; ++oh) {
      const int64_t h0 = bin_start(oh, s.h, s.oh), h1 = bin_end(oh, s.h, s.oh);
      for (int64_t ow = 0; ow < s.ow; ++ow) {
        const int64_t w0 = bin_start(ow, s.w, s.ow), w1 = bin_end(ow, s.w, s.ow);
        const T share =
            static_cast<T>(static_cast<Acc<T>>(in[oh * s.ow + ow]) / static_cast<Acc<T>>((h1 - h0) * (w1 - w0)));
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) out[ih * s.w + iw] += share;
      }
    }
  });
}

}  // namespace

void CpuKernels::max_pool2d(const Tensor& x, const Pool2dGeometry& g, const Tensor& y, const Tensor& indices) {
  Tensor xc = contiguous_input(x);
  if (y.numel() == 0) return;
  dispatch_float(x.dtype(), "max_pool2d", [&]<class T>() { max_pool_forward<T>(xc, g, y, indices); });
}

void CpuKernels::max_pool2d_backward(const Tensor& gy, const Tensor& indices, const Tensor& gx) {
  Tensor gyc = contiguous_input(gy), ic = contiguous_input(indices);
  if (gx.numel() == 0) return;
  dispatch_float(gx.dtype(), "max_pool2d_backward", [&]<class T>() { max_pool_backward<T>(gyc, ic, gx); });
}

void CpuKernels::avg_pool2d(const Tensor& x, const Pool2dGeometry& g, const Tensor& y) {
  Tensor xc = contiguous_input(x);
  if (y.numel() == 0) return;
  dispatch_float(x.dtype(), "avg_pool2d", [&]<class T>() { avg_pool_forward<T>(xc, g, y); });
}

void CpuKernels::avg_pool2d_backward(const Tensor& gy, const Pool2dGeometry& g, const Tensor& gx) {
  Tensor gyc = contiguous_input(gy);
  if (gx.numel() == 0) return;
  dispatch_float(gx.dtype(), "avg_pool2d_backward", [&]<class T>() { avg_pool_backward<T>(gyc, g, gx); });
}

void CpuKernels::adaptive_avg_pool2d(const Tensor& x, const Tensor& y) {
  Tensor xc = contiguous_input(x);
  if (y.numel() == 0) return;
  dispatch_float(x.dtype(), "adaptive_avg_pool2d", [&]<class T>() { adaptive_forward<T>(xc, y); });
}

void CpuKernels::adaptive_avg_pool2d_backward(const Tensor& gy, const Tensor& gx) {
  Tensor gyc = contiguous_input(gy);
  if (gx.numel() == 0) return;
  dispatch_float(gx.dtype(), "adaptive_avg_pool2d_backward", [&]<class T>() { adaptive_backward<T>(gyc, gx); });
}

}  // namespace remat::cpu
