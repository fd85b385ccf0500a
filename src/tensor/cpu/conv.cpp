// CPU 2-D convolution: remat's own im2col + GEMM (both dtypes) and the dispatch to oneDNN's
// primitives (conv_onednn.cpp) for float32. Which one serves f32 was decided by measurement
// (bench/bench_conv.cpp, docs/performance.md, "Kernel choices"); f64 always takes im2col + OpenBLAS dgemm,
// since oneDNN has no f64 convolution on the CPU.
//
// im2col, per image n and group g (Cg = C / groups input channels, Og = O / groups outputs):
//   col [Cg * KH * KW, OH * OW]:  col[(c KH + i) KW + j][oh OW + ow] = x[n, g Cg + c, oh sh - ph + i dh, ow sw - pw + j dw]
//                                 (0 outside the image)
//   y[n, g Og : (g + 1) Og] [Og, OH * OW] = w_g [Og, Cg KH KW] @ col              (one GEMM)
//   backward input:  gcol = w_g^T @ gy[n, g],  gx[n] += col2im(gcol)
//   backward weight: gw_g += gy[n, g] @ col^T
// A 1x1 kernel with stride 1 and no padding needs no col: x[n, g] is already [Cg, H * W].
//
// Threads and reproducibility. In float32 images run in parallel, each with one single-threaded
// GEMM and its own col buffer (dnnl_sgemm called inside a parallel region runs on the calling
// thread). OpenBLAS (float64) is a pthreads build that must not be called from several OpenMP
// threads at once, so f64 loops over images and lets OpenBLAS thread each GEMM. The weight
// gradient sums over images in FIXED blocks (their number depends on N only) combined in block
// order, and the bias gradient sums each channel in one fixed order, so results are bitwise
// the same for any thread count.
#include <omp.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "tensor/cpu/conv_onednn.h"
#include "tensor/cpu/cpu_backend.h"

namespace remat {

namespace {
std::atomic<ConvAlgorithm> g_conv_algorithm{ConvAlgorithm::automatic};
}

void set_conv_algorithm(ConvAlgorithm algorithm) { g_conv_algorithm.store(algorithm); }
ConvAlgorithm conv_algorithm() { return g_conv_algorithm.load(); }
const char* conv_algorithm_name(ConvAlgorithm algorithm) {
  switch (algorithm) {
    case ConvAlgorithm::automatic: return "automatic";
    case ConvAlgorithm::im2col_gemm: return "im2col_gemm";
    case ConvAlgorithm::onednn_plain: return "onednn_plain";
    case ConvAlgorithm::onednn_blocked: return "onednn_blocked";
  }
  return "?";
}

}  // namespace remat

namespace remat::cpu {

namespace {

// What ConvAlgorithm::automatic means for float32, by measurement (bench/bench_conv.cpp on the
// ResNet shapes; docs/performance.md, "Kernel choices").
constexpr ConvAlgorithm kAutomaticConvAlgorithm = ConvAlgorithm::onednn_blocked;

// Below this many FLOPs (about 20 microseconds of one core) a convolution runs on the calling
// thread through im2col, whatever the algorithm: starting a parallel region, as oneDNN does for
// every call, costs more than it saves, and far more when another process holds a core (each
// OpenMP barrier then waits for a descheduled thread).
constexpr double kSmallConvFlops = 2.0 * (1 << 20);

double conv_flops(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dGeometry& g) {
  return 2.0 * static_cast<double>(y.numel()) * static_cast<double>(x.shape()[1] / g.groups) *
         static_cast<double>(w.shape()[2] * w.shape()[3]);
}

// The sizes of one convolution, read from its tensors.
struct ConvShape {
  int64_t n, c, h, w;      // input
  int64_t o, kh, kw;       // weight [o, c / groups, kh, kw]
  int64_t oh, ow;          // output
  int64_t groups, cg, og;  // groups and channels per group
  int64_t k() const { return cg * kh * kw; }  // GEMM depth per group
  int64_t p() const { return oh * ow; }       // output pixels per plane
};

ConvShape conv_shape(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dGeometry& g) {
  ConvShape s{x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3], w.shape()[0], w.shape()[2], w.shape()[3],
              y.shape()[2], y.shape()[3], g.groups, 0, 0};
  s.cg = s.c / g.groups;
  s.og = s.o / g.groups;
  return s;
}

bool is_pointwise(const ConvShape& s, const Conv2dGeometry& g) {
  return s.kh == 1 && s.kw == 1 && g.stride_h == 1 && g.stride_w == 1 && g.pad_h == 0 && g.pad_w == 0;
}

// The i in [0, count) with 0 <= i * stride + offset < limit, as [lo, hi).
void valid_range(int64_t offset, int64_t stride, int64_t limit, int64_t count, int64_t& lo, int64_t& hi) {
  // i * stride + offset >= 0  <=>  i >= ceil(-offset / stride)
  lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  // i * stride + offset < limit  <=>  i < ceil((limit - offset) / stride)
  hi = limit - offset <= 0 ? 0 : (limit - offset + stride - 1) / stride;
  lo = std::min(lo, count);
  hi = std::clamp(hi, lo, count);
}

// col [cg * kh * kw, oh * ow] from the cg planes at x (each h * w).
template <class T>
void im2col(const T* x, const ConvShape& s, const Conv2dGeometry& g, T* col) {
  const int64_t p = s.p();
  for (int64_t c = 0; c < s.cg; ++c)
    for (int64_t i = 0; i < s.kh; ++i)
      for (int64_t j = 0; j < s.kw; ++j) {
        T* row = col + ((c * s.kh + i) * s.kw + j) * p;
        const T* plane = x + c * s.h * s.w;
        const int64_t dh = i * g.dilation_h - g.pad_h, dw = j * g.dilation_w - g.pad_w;
        int64_t oh_lo, oh_hi, ow_lo, ow_hi;
        valid_range(dh, g.stride_h, s.h, s.oh, oh_lo, oh_hi);
        valid_range(dw, g.stride_w, s.w, s.ow, ow_lo, ow_hi);
        std::memset(row, 0, static_cast<size_t>(oh_lo * s.ow) * sizeof(T));
        for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          T* out = row + oh * s.ow;
          const T* in = plane + (oh * g.stride_h + dh) * s.w + dw;
          for (int64_t ow = 0; ow < ow_lo; ++ow) out[ow] = T(0);
          if (g.stride_w == 1) {
            std::memcpy(out + ow_lo, in + ow_lo, static_cast<size_t>(ow_hi - ow_lo) * sizeof(T));
          } else {
            for (int64_t ow = ow_lo; ow < ow_hi; ++ow) out[ow] = in[ow * g.stride_w];
          }
          for (int64_t ow = ow_hi; ow < s.ow; ++ow) out[ow] = T(0);
        }
        std::memset(row + oh_hi * s.ow, 0, static_cast<size_t>((s.oh - oh_hi) * s.ow) * sizeof(T));
      }
}

// gx planes (cg of h * w, zeroed by the caller) += col2im(col).
template <class T>
void col2im(const T* col, const ConvShape& s, const Conv2dGeometry& g, T* gx) {
  const int64_t p = s.p();
  for (int64_t c = 0; c < s.cg; ++c)
    for (int64_t i = 0; i < s.kh; ++i)
      for (int64_t j = 0; j < s.kw; ++j) {
        const T* row = col + ((c * s.kh + i) * s.kw + j) * p;
        T* plane = gx + c * s.h * s.w;
        const int64_t dh = i * g.dilation_h - g.pad_h, dw = j * g.dilation_w - g.pad_w;
        int64_t oh_lo, oh_hi, ow_lo, ow_hi;
        valid_range(dh, g.stride_h, s.h, s.oh, oh_lo, oh_hi);
        valid_range(dw, g.stride_w, s.w, s.ow, ow_lo, ow_hi);
        for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          const T* in = row + oh * s.ow;
          T* out = plane + (oh * g.stride_h + dh) * s.w + dw;
          if (g.stride_w == 1) {
#pragma omp simd
            for (int64_t ow = ow_lo; ow < ow_hi; ++ow) out[ow] += in[ow];
          } else {
            for (int64_t ow = ow_lo; ow < ow_hi; ++ow) out[ow * g.stride_w] += in[ow];
          }
        }
      }
}

// Runs body(n, scratch) for every image: in parallel (one scratch buffer per thread) for float,
// one after the other (the GEMM library threads) for double.
template <class T, class Body>
void for_images(int64_t images, int64_t scratch_elements, bool threads_allowed, Body&& body) {
  const bool parallel = threads_allowed && std::is_same_v<T, float> && images > 1 && omp_get_max_threads() > 1;
  const int threads = parallel ? omp_get_max_threads() : 1;
  Tensor scratch = scratch_elements > 0
                       ? Tensor::empty({threads * scratch_elements}, std::is_same_v<T, float> ? DType::f32 : DType::f64)
                       : Tensor();
  T* base = scratch.defined() ? scratch.data<T>() : nullptr;
  if (parallel) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t n = 0; n < images; ++n) body(n, base ? base + omp_get_thread_num() * scratch_elements : nullptr);
  } else {
    for (int64_t n = 0; n < images; ++n) body(n, base);
  }
}

template <class T>
void im2col_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g, const Tensor& y,
                    bool threads) {
  const ConvShape s = conv_shape(x, w, y, g);
  const bool pointwise = is_pointwise(s, g);
  const int64_t k = s.k(), p = s.p();
  const T* xp = x.data<T>();
  const T* wp = w.data<T>();
  const T* bp = bias.defined() ? bias.data<T>() : nullptr;
  T* yp = y.data<T>();
  for_images<T>(s.n, pointwise ? 0 : k * p, threads, [&](int64_t n, T* col) {
    for (int64_t grp = 0; grp < s.groups; ++grp) {
      const T* xg = xp + (n * s.c + grp * s.cg) * s.h * s.w;
      T* yg = yp + (n * s.o + grp * s.og) * p;
      if (!pointwise) im2col(xg, s, g, col);
      // yg [og, p] = w_g [og, k] @ col [k, p]
      gemm_rowmajor<T>(false, false, s.og, p, k, T(1), wp + grp * s.og * k, k, pointwise ? xg : col, p, T(0), yg, p);
    }
    if (bp)
      for (int64_t o = 0; o < s.o; ++o) {
        T* row = yp + (n * s.o + o) * p;
        const T b = bp[o];
#pragma omp simd
        for (int64_t i = 0; i < p; ++i) row[i] += b;
      }
  });
}

template <class T>
void im2col_backward_input(const Tensor& gy, const Tensor& w, const Conv2dGeometry& g, const Tensor& gx,
                           bool threads) {
  const ConvShape s = conv_shape(gx, w, gy, g);
  const bool pointwise = is_pointwise(s, g);
  const int64_t k = s.k(), p = s.p();
  const T* gyp = gy.data<T>();
  const T* wp = w.data<T>();
  T* gxp = gx.data<T>();
  for_images<T>(s.n, pointwise ? 0 : k * p, threads, [&](int64_t n, T* col) {
    for (int64_t grp = 0; grp < s.groups; ++grp) {
      const T* gyg = gyp + (n * s.o + grp * s.og) * p;
      T* gxg = gxp + (n * s.c + grp * s.cg) * s.h * s.w;
      // [k, p] = w_g^T [k, og] @ gy_g [og, p]
      gemm_rowmajor<T>(true, false, k, p, s.og, T(1), wp + grp * s.og * k, k, gyg, p, T(0), pointwise ? gxg : col, p);
      if (!pointwise) {
        std::memset(gxg, 0, static_cast<size_t>(s.cg * s.h * s.w) * sizeof(T));
        col2im(col, s, g, gxg);
      }
    }
  });
}

// Images per block of the weight-gradient sum: a function of N only (see the file comment).
constexpr int64_t kWeightGradBlocks = 8;

template <class T>
void im2col_backward_weight(const Tensor& x, const Tensor& gy, const Conv2dGeometry& g, const Tensor& gw,
                            const Tensor& gbias, bool threads) {
  const T* xp = x.data<T>();
  const T* gyp = gy.data<T>();
  const int64_t p = gy.shape()[2] * gy.shape()[3];
  if (gw.defined()) {
    const ConvShape s = conv_shape(x, gw, gy, g);
    const int64_t k = s.k();
    const bool pointwise = is_pointwise(s, g);
    const int64_t blocks = std::min<int64_t>(s.n, kWeightGradBlocks);
    const int64_t per_block = (s.n + blocks - 1) / blocks;
    const int64_t wsize = s.o * k;
    const DType dt = std::is_same_v<T, float> ? DType::f32 : DType::f64;
    Tensor partial = Tensor::empty({blocks, wsize}, dt);
    T* pp = partial.data<T>();
    const bool parallel = threads && std::is_same_v<T, float> && blocks > 1 && omp_get_max_threads() > 1;
    const int threads = parallel ? omp_get_max_threads() : 1;
    Tensor scratch = pointwise ? Tensor() : Tensor::empty({threads * k * p}, dt);
    auto run_block = [&](int64_t b) {
      T* col = scratch.defined() ? scratch.data<T>() + (parallel ? omp_get_thread_num() : 0) * k * p : nullptr;
      T* acc = pp + b * wsize;
      const int64_t n0 = b * per_block, n1 = std::min(s.n, n0 + per_block);
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t grp = 0; grp < s.groups; ++grp) {
          const T* xg = xp + (n * s.c + grp * s.cg) * s.h * s.w;
          const T* gyg = gyp + (n * s.o + grp * s.og) * p;
          if (!pointwise) im2col(xg, s, g, col);
          // acc_g [og, k] (+)= gy_g [og, p] @ col^T [p, k]
          gemm_rowmajor<T>(false, true, s.og, k, p, T(1), gyg, p, pointwise ? xg : col, p, n == n0 ? T(0) : T(1),
                           acc + grp * s.og * k, k);
        }
      if (n1 <= n0) std::memset(acc, 0, static_cast<size_t>(wsize) * sizeof(T));
    };
    if (parallel) {
#pragma omp parallel for schedule(static) num_threads(threads)
      for (int64_t b = 0; b < blocks; ++b) run_block(b);
    } else {
      for (int64_t b = 0; b < blocks; ++b) run_block(b);
    }
    T* gwp = gw.data<T>();
    std::memcpy(gwp, pp, static_cast<size_t>(wsize) * sizeof(T));
    for (int64_t b = 1; b < blocks; ++b) {
      const T* src = pp + b * wsize;
#pragma omp simd
      for (int64_t i = 0; i < wsize; ++i) gwp[i] += src[i];
    }
  }
  if (gbias.defined()) {
    T* gbp = gbias.data<T>();
    const int64_t o_count = gy.shape()[1], n_count = gy.shape()[0];
    auto channel_sum = [&](int64_t o) {
      Acc<T> total = 0;
      for (int64_t n = 0; n < n_count; ++n) {
        const T* row = gyp + (n * o_count + o) * p;
        Acc<T> part = 0;
#pragma omp simd reduction(+ : part)
        for (int64_t i = 0; i < p; ++i) part += static_cast<Acc<T>>(row[i]);
        total += part;
      }
      gbp[o] = static_cast<T>(total);
    };
    if (threads) {
      for_rows(o_count, n_count * p, channel_sum);
    } else {
      for (int64_t o = 0; o < o_count; ++o) channel_sum(o);
    }
  }
}

// The implementation for this call: an explicit choice (set_conv_algorithm) is followed; the
// automatic one is im2col on the calling thread for small problems (any dtype) and otherwise
// kAutomaticConvAlgorithm for float32, im2col for float64.
struct Choice {
  bool onednn = false, blocked = false, threads = true;
};
Choice choose(DType dtype, double flops) {
  const ConvAlgorithm chosen = conv_algorithm();
  Choice c;
  if (chosen == ConvAlgorithm::automatic && flops < kSmallConvFlops) {
    c.threads = false;
    return c;
  }
  const ConvAlgorithm a = chosen == ConvAlgorithm::automatic ? kAutomaticConvAlgorithm : chosen;
  c.onednn = dtype == DType::f32 && a != ConvAlgorithm::im2col_gemm;
  c.blocked = a == ConvAlgorithm::onednn_blocked;
  return c;
}

}  // namespace

void CpuKernels::conv2d(const Tensor& xin, const Tensor& win, const Tensor& bin, const Conv2dGeometry& g,
                        const Tensor& y) {
  Tensor x = contiguous_input(xin), w = contiguous_input(win), bias = contiguous_input(bin);
  if (y.numel() == 0) return;
  const Choice c = choose(x.dtype(), conv_flops(x, w, y, g));
  if (c.onednn && onednn_conv2d_forward(x, w, bias, g, y, c.blocked)) return;
  dispatch_float(x.dtype(), "conv2d", [&]<class T>() { im2col_forward<T>(x, w, bias, g, y, c.threads); });
}

void CpuKernels::conv2d_backward_input(const Tensor& gyin, const Tensor& win, const Conv2dGeometry& g,
                                       const Tensor& gx) {
  Tensor gy = contiguous_input(gyin), w = contiguous_input(win);
  if (gx.numel() == 0) return;
  if (gy.numel() == 0) return fill(gx, 0.0);
  const Choice c = choose(gy.dtype(), conv_flops(gx, w, gy, g));
  if (c.onednn && onednn_conv2d_backward_input(gy, w, g, gx, c.blocked)) return;
  dispatch_float(gy.dtype(), "conv2d_backward", [&]<class T>() { im2col_backward_input<T>(gy, w, g, gx, c.threads); });
}

void CpuKernels::conv2d_backward_weight(const Tensor& xin, const Tensor& gyin, const Conv2dGeometry& g,
                                        const Tensor& gw, const Tensor& gbias) {
  Tensor x = contiguous_input(xin), gy = contiguous_input(gyin);
  if (!gw.defined() && !gbias.defined()) return;
  if (gy.numel() == 0 || x.shape()[0] == 0) {
    if (gw.defined()) fill(gw, 0.0);
    if (gbias.defined()) fill(gbias, 0.0);
    return;
  }
  if (!gw.defined()) {  // the bias gradient alone: a reduction over gy
    dispatch_float(x.dtype(), "conv2d_backward", [&]<class T>() {
      im2col_backward_weight<T>(x, gy, g, gw, gbias, gy.numel() >= kParallelThreshold);
    });
    return;
  }
  const Choice c = choose(x.dtype(), conv_flops(x, gw, gy, g));
  if (c.onednn && onednn_conv2d_backward_weight(x, gy, g, gw, gbias, c.blocked)) return;
  dispatch_float(x.dtype(), "conv2d_backward", [&]<class T>() {
    im2col_backward_weight<T>(x, gy, g, gw, gbias, c.threads);
  });
}

}  // namespace remat::cpu
