// CPU row kernels over the last axis: softmax / log-softmax, layer norm and RMS norm, forward and
// backward, and layer norm with the residual add fused in (add_layer_norm: each row's sum, then
// the layer-norm row code on it; its backward adds the residual's gradient to each row's gx). A
// tensor is viewed as [rows, cols]; rows run in parallel (OpenMP, one range of rows per thread)
// when the tensor is large, and each row is processed by one thread with hand-
// vectorised loops (row_ops.h) compiled per CPU level (cpu_level.h: AVX-512, AVX2 + FMA, baseline;
// one per process). Sums of f32 end in f64 (row_ops.h, WideSum), in a fixed order at each level.
//
// Reproducibility: every per-row sum runs in a fixed order inside one thread. The parameter
// gradients of the norms (gweight, gbias: sums over rows) are reduced over FIXED row blocks
// (their number depends on the shape only, never on the thread count) whose partial sums are
// combined in block order, so the result is bitwise identical for any number of threads.
#include <cmath>
#include <limits>
#include <memory>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/row_ops.h"

namespace remat::cpu {

namespace {

template <class T>
const T* cdata(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}
template <class T>
T* mdata(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

int64_t row_length(const Tensor& x) { return x.dim() == 0 ? 1 : x.shape().back(); }
int64_t row_count(const Tensor& x, int64_t cols) { return cols == 0 ? 0 : x.numel() / cols; }

// ---- softmax
//
// Three passes over a row: the max (from memory), exp(x - max) written to y with its float64 sum,
// and the scaling by 1 / sum (log-softmax: y = x - (max + log(sum)), with the exps not stored).
// The row (4 KiB at 1024 floats) stays in L1 between passes.

template <class T>
REMAT_SIMD_INLINE void softmax_row(const T* __restrict xr, T* __restrict yr, int64_t cols, bool log) {
  using namespace rowops;
  T m = rowops::max(xr, cols);
  // A row of -inf only: subtract 0 instead of -inf (the row sum is then 0 and the result NaN,
  // as in other libraries, rather than NaN from -inf - -inf inside exp).
  if (m == -std::numeric_limits<T>::infinity()) m = T(0);
  if (log) {
    const Acc<T> sum = exp_sum<T>(xr, m, nullptr, cols);
    const T shift = static_cast<T>(static_cast<Acc<T>>(m) + std::log(sum));
    map<T>(
        cols, [&](int64_t c) REMAT_ROW_LAMBDA { store(yr + c, load(xr + c) - shift); },
        [&](int64_t c) REMAT_ROW_LAMBDA { yr[c] = xr[c] - shift; });
  } else {
    const Acc<T> sum = exp_sum<T>(xr, m, yr, cols);
    const T inv = static_cast<T>(Acc<T>(1) / sum);
    map<T>(
        cols, [&](int64_t c) REMAT_ROW_LAMBDA { store(yr + c, load(yr + c) * inv); },
        [&](int64_t c) REMAT_ROW_LAMBDA { yr[c] = yr[c] * inv; });
  }
}

template <class T>
REMAT_SIMD_INLINE void softmax_backward_row(const T* __restrict yr, const T* __restrict gr, T* __restrict out,
                                            int64_t cols, bool log) {
  using namespace rowops;
  if (log) {
    // y = log softmax: gx = gy - softmax * sum(gy)
    const T st = static_cast<T>(rowops::sum(gr, cols));
    map<T>(
        cols, [&](int64_t c) REMAT_ROW_LAMBDA { store(out + c, load(gr + c) - simd::exp<T>(load(yr + c)) * st); },
        [&](int64_t c) REMAT_ROW_LAMBDA { out[c] = gr[c] - simd::exp_scalar<T>(yr[c]) * st; });
  } else {
    // gx = y * (gy - sum(gy * y))
    const T st = static_cast<T>(dot(gr, yr, cols));
    map<T>(
        cols, [&](int64_t c) REMAT_ROW_LAMBDA { store(out + c, load(yr + c) * (load(gr + c) - st)); },
        [&](int64_t c) REMAT_ROW_LAMBDA { out[c] = yr[c] * (gr[c] - st); });
  }
}

#define REMAT_ROW_RANGE(T, suffix)                                                                                \
  REMAT_CPU_LEVELS(void, softmax_range_##suffix, (const T* x, T* y, int64_t r0, int64_t r1, int64_t cols, bool log), \
                   (x, y, r0, r1, cols, log)) {                                                                   \
    for (int64_t r = r0; r < r1; ++r) softmax_row<T>(x + r * cols, y + r * cols, cols, log);                      \
  }                                                                                                               \
  REMAT_CPU_LEVELS(void, softmax_backward_range_##suffix,                                                         \
                   (const T* y, const T* gy, T* gx, int64_t r0, int64_t r1, int64_t cols, bool log),              \
                   (y, gy, gx, r0, r1, cols, log)) {                                                              \
    for (int64_t r = r0; r < r1; ++r)                                                                             \
      softmax_backward_row<T>(y + r * cols, gy + r * cols, gx + r * cols, cols, log);                            \
  }
REMAT_ROW_RANGE(float, f32)
REMAT_ROW_RANGE(double, f64)
#undef REMAT_ROW_RANGE

template <class T>
void softmax_rows(const T* x, T* y, int64_t rows, int64_t cols, bool log) {
  for_row_ranges(rows, cols, [&](int64_t r0, int64_t r1) {
    if constexpr (sizeof(T) == 4) softmax_range_f32(x, y, r0, r1, cols, log);
    else softmax_range_f64(x, y, r0, r1, cols, log);
  });
}

template <class T>
void softmax_backward_rows(const T* y, const T* gy, T* gx, int64_t rows, int64_t cols, bool log) {
  for_row_ranges(rows, cols, [&](int64_t r0, int64_t r1) {
    if constexpr (sizeof(T) == 4) softmax_backward_range_f32(y, gy, gx, r0, r1, cols, log);
    else softmax_backward_range_f64(y, gy, gx, r0, r1, cols, log);
  });
}

// ---- fixed row blocks for the parameter gradients

// The number of row blocks depends on the shape only (never on the thread count).
int64_t param_grad_blocks(int64_t rows) {
  constexpr int64_t kMinRowsPerBlock = 16, kMaxBlocks = 64;
  int64_t blocks = (rows + kMinRowsPerBlock - 1) / kMinRowsPerBlock;
  return std::clamp<int64_t>(blocks, 1, kMaxBlocks);
}
int64_t block_begin(int64_t block, int64_t blocks, int64_t rows) { return block * rows / blocks; }

// out[c] = sum over b in order of partial[b * cols + c]
template <class T>
void combine_blocks(const double* partial, int64_t blocks, int64_t cols, T* out) {
  for (int64_t c = 0; c < cols; ++c) {
    double s = 0;
    for (int64_t b = 0; b < blocks; ++b) s += partial[static_cast<size_t>(b * cols + c)];
    out[c] = static_cast<T>(s);
  }
}

// Runs block_body(b, partial_row_pointers...) over the fixed blocks, in parallel when large.
template <class Body>
void for_blocks(int64_t blocks, int64_t rows, int64_t cols, Body&& body) {
  if (blocks > 1 && rows * cols >= kParallelThreshold) {
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) body(b);
  } else {
    for (int64_t b = 0; b < blocks; ++b) body(b);
  }
}

// ---- layer norm and RMS norm
//
// Forward rows: statistics in Acc<T> (two passes for layer norm: mean, then the centred sum of
// squares), then y in T. Backward rows: gx from two row sums; the parameter gradients add
// gy * xhat (and gy) of each row into per-block float64 partials, through float32 partials
// flushed every kFlushRows rows (so each float64 partial receives sums of at most kFlushRows
// float32 terms, in a fixed order).

constexpr int64_t kFlushRows = 16;

template <class T>
struct NormArgs {
  const T* x;
  const T* w;     // may be null
  const T* bias;  // may be null (layer norm)
  double eps;
  T* y;
  T* mean;  // layer norm only
  T* rstd;
  int64_t cols;
};

template <class T>
REMAT_SIMD_INLINE void layer_norm_row(const NormArgs<T>& a, int64_t r) {
  using namespace rowops;
  const int64_t n = a.cols;
  const T* __restrict xr = a.x + r * n;
  T* __restrict yr = a.y + r * n;
  const Acc<T> mu = rowops::sum(xr, n) / static_cast<Acc<T>>(n);
  const T mu_t = static_cast<T>(mu);
  WideSum<T> squares;
  int64_t c = 0;
  for (; c + W<T> <= n; c += W<T>) {
    const V<T> d = load(xr + c) - mu_t;
    squares.add(d * d);
  }
  Acc<T> v = squares.total();
  for (; c < n; ++c) v += static_cast<Acc<T>>((xr[c] - mu_t) * (xr[c] - mu_t));
  const Acc<T> rs = Acc<T>(1) / std::sqrt(v / static_cast<Acc<T>>(n) + static_cast<Acc<T>>(a.eps));
  const T rs_t = static_cast<T>(rs);
  a.mean[r] = mu_t;
  a.rstd[r] = rs_t;
  const T* __restrict w = a.w;
  const T* __restrict b = a.bias;
  if (w && b) {
    map<T>(
        n, [&](int64_t k) REMAT_ROW_LAMBDA { store(yr + k, (load(xr + k) - mu_t) * rs_t * load(w + k) + load(b + k)); },
        [&](int64_t k) REMAT_ROW_LAMBDA { yr[k] = (xr[k] - mu_t) * rs_t * w[k] + b[k]; });
  } else if (w) {
    map<T>(
        n, [&](int64_t k) REMAT_ROW_LAMBDA { store(yr + k, (load(xr + k) - mu_t) * rs_t * load(w + k)); },
        [&](int64_t k) REMAT_ROW_LAMBDA { yr[k] = (xr[k] - mu_t) * rs_t * w[k]; });
  } else if (b) {
    map<T>(
        n, [&](int64_t k) REMAT_ROW_LAMBDA { store(yr + k, (load(xr + k) - mu_t) * rs_t + load(b + k)); },
        [&](int64_t k) REMAT_ROW_LAMBDA { yr[k] = (xr[k] - mu_t) * rs_t + b[k]; });
  } else {
    map<T>(
        n, [&](int64_t k) REMAT_ROW_LAMBDA { store(yr + k, (load(xr + k) - mu_t) * rs_t); },
        [&](int64_t k) REMAT_ROW_LAMBDA { yr[k] = (xr[k] - mu_t) * rs_t; });
  }
}

template <class T>
REMAT_SIMD_INLINE void rms_norm_row(const NormArgs<T>& a, int64_t r) {
  using namespace rowops;
  const int64_t n = a.cols;
  const T* __restrict xr = a.x + r * n;
  T* __restrict yr = a.y + r * n;
  const Acc<T> s = dot(xr, xr, n);
  const T rs = static_cast<T>(Acc<T>(1) / std::sqrt(s / static_cast<Acc<T>>(n) + static_cast<Acc<T>>(a.eps)));
  a.rstd[r] = rs;
  const T* __restrict w = a.w;
  if (w) {
    map<T>(
        n, [&](int64_t k) REMAT_ROW_LAMBDA { store(yr + k, load(xr + k) * rs * load(w + k)); },
        [&](int64_t k) REMAT_ROW_LAMBDA { yr[k] = xr[k] * rs * w[k]; });
  } else {
    map<T>(
        n, [&](int64_t k) REMAT_ROW_LAMBDA { store(yr + k, load(xr + k) * rs); },
        [&](int64_t k) REMAT_ROW_LAMBDA { yr[k] = xr[k] * rs; });
  }
}

template <class T>
struct NormBackwardArgs {
  const T* x;
  const T* w;  // may be null
  const T* mean;  // null for RMS norm
  const T* rstd;
  const T* gy;
  T* gx;  // may be null
  int64_t cols;
  const T* gres = nullptr;  // add_layer_norm_backward: the residual's gradient, added to gx
};

// gx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = gy * w, xhat = (x - mean) * rstd (RMS
// norm: no mean(g) term and xhat = x * rstd). Adds gy * xhat and gy into the float32 partials
// pw, pb (when given).
template <class T>
REMAT_SIMD_INLINE void norm_backward_row(const NormBackwardArgs<T>& a, int64_t r, T* __restrict pw,
                                         T* __restrict pb) {
  using namespace rowops;
  const int64_t n = a.cols;
  const T* __restrict xr = a.x + r * n;
  const T* __restrict gr = a.gy + r * n;
  const T* __restrict w = a.w;
  const bool centred = a.mean != nullptr;
  const T mu = centred ? a.mean[r] : T(0), rs = a.rstd[r];
  if (a.gx) {
    T* __restrict out = a.gx + r * n;
    WideSum<T> sum_g, sum_gx;
    int64_t c = 0;
    for (; c + W<T> <= n; c += W<T>) {
      const V<T> g = w ? load(gr + c) * load(w + c) : load(gr + c);
      const V<T> xhat = (load(xr + c) - mu) * rs;
      sum_g.add(g);
      sum_gx.add(g * xhat);
    }
    Acc<T> sg = sum_g.total(), sgx = sum_gx.total();
    for (; c < n; ++c) {
      const T g = w ? gr[c] * w[c] : gr[c];
      sg += static_cast<Acc<T>>(g);
      sgx += static_cast<Acc<T>>(g * ((xr[c] - mu) * rs));
    }
    const T mg = centred ? static_cast<T>(sg / static_cast<Acc<T>>(n)) : T(0);
    const T mgx = static_cast<T>(sgx / static_cast<Acc<T>>(n));
    map<T>(
        n,
        [&](int64_t k) REMAT_ROW_LAMBDA {
          const V<T> g = w ? load(gr + k) * load(w + k) : load(gr + k);
          store(out + k, rs * (g - mg - (load(xr + k) - mu) * rs * mgx));
        },
        [&](int64_t k) REMAT_ROW_LAMBDA {
          const T g = w ? gr[k] * w[k] : gr[k];
          out[k] = rs * (g - mg - (xr[k] - mu) * rs * mgx);
        });
  }
  if (pw) {
    map<T>(
        n, [&](int64_t k) REMAT_ROW_LAMBDA { store(pw + k, load(pw + k) + load(gr + k) * ((load(xr + k) - mu) * rs)); },
        [&](int64_t k) REMAT_ROW_LAMBDA { pw[k] += gr[k] * ((xr[k] - mu) * rs); });
  }
  if (pb) {
    map<T>(
        n, [&](int64_t k) REMAT_ROW_LAMBDA { store(pb + k, load(pb + k) + load(gr + k)); },
        [&](int64_t k) REMAT_ROW_LAMBDA { pb[k] += gr[k]; });
  }
}

// gx += gres over one row, after the row's gx is stored. Not inlined, so that no compiler can
// contract gx's last product with this addition into a fused multiply-add: gx is rounded to T
// first, as when layer_norm_backward's gx and the residual's gradient are added by binary(add).
template <class T>
__attribute__((noinline)) void add_residual_row(T* __restrict gx, const T* __restrict gres, int64_t n) {
  for (int64_t k = 0; k < n; ++k) gx[k] = gx[k] + gres[k];
}

// add_layer_norm's operands: s = x + r row by row, then layer_norm_row of s (norm.x is s).
template <class T>
struct AddNormArgs {
  const T* x;
  const T* r;
  T* s;
  NormArgs<T> norm;
};

template <class T>
REMAT_SIMD_INLINE void add_layer_norm_row(const AddNormArgs<T>& a, int64_t row) {
  using namespace rowops;
  const int64_t n = a.norm.cols;
  const T* __restrict xr = a.x + row * n;
  const T* __restrict rr = a.r + row * n;
  T* __restrict sr = a.s + row * n;
  map<T>(
      n, [&](int64_t k) REMAT_ROW_LAMBDA { store(sr + k, load(xr + k) + load(rr + k)); },
      [&](int64_t k) REMAT_ROW_LAMBDA { sr[k] = xr[k] + rr[k]; });
  layer_norm_row<T>(a.norm, row);
}

// Rows [r0, r1) of a block: partials pw32/pb32 (float32 for float; T) are added into the block's
// float64 partials pw64/pb64 every kFlushRows rows and at the end.
template <class T>
REMAT_SIMD_INLINE void norm_backward_block(const NormBackwardArgs<T>& a, int64_t r0, int64_t r1, T* pw32, T* pb32,
                                           double* pw64, double* pb64) {
  const int64_t n = a.cols;
  auto flush = [&]() REMAT_ROW_LAMBDA {
    for (int64_t k = 0; k < n; ++k) {
      if (pw32) pw64[k] += static_cast<double>(pw32[k]), pw32[k] = T(0);
      if (pb32) pb64[k] += static_cast<double>(pb32[k]), pb32[k] = T(0);
    }
  };
  for (T* p : {pw32, pb32})
    if (p) std::fill(p, p + n, T(0));
  for (double* p : {pw64, pb64})  // each block clears its own partials, on its own thread
    if (p) std::fill(p, p + n, 0.0);
  for (int64_t r = r0; r < r1; ++r) {
    norm_backward_row(a, r, pw32, pb32);
    if (a.gres) add_residual_row(a.gx + r * n, a.gres + r * n, n);
    if ((pw32 || pb32) && ((r - r0 + 1) % kFlushRows == 0 || r + 1 == r1)) flush();
  }
}

#define REMAT_NORM_RANGES(T, suffix)                                                                              \
  REMAT_CPU_LEVELS(void, layer_norm_range_##suffix, (const NormArgs<T>& a, int64_t r0, int64_t r1), (a, r0, r1)) {\
    for (int64_t r = r0; r < r1; ++r) layer_norm_row<T>(a, r);                                                   \
  }                                                                                                               \
  REMAT_CPU_LEVELS(void, add_layer_norm_range_##suffix, (const AddNormArgs<T>& a, int64_t r0, int64_t r1), (a, r0, r1)) {\
    for (int64_t r = r0; r < r1; ++r) add_layer_norm_row<T>(a, r);                                               \
  }                                                                                                               \
  REMAT_CPU_LEVELS(void, rms_norm_range_##suffix, (const NormArgs<T>& a, int64_t r0, int64_t r1), (a, r0, r1)) {  \
    for (int64_t r = r0; r < r1; ++r) rms_norm_row<T>(a, r);                                                     \
  }                                                                                                               \
  REMAT_CPU_LEVELS(void, norm_backward_block_##suffix,                                                            \
                   (const NormBackwardArgs<T>& a, int64_t r0, int64_t r1, T* pw32, T* pb32, double* pw64,         \
                    double* pb64),                                                                                \
                   (a, r0, r1, pw32, pb32, pw64, pb64)) {                                                         \
    norm_backward_block<T>(a, r0, r1, pw32, pb32, pw64, pb64);                                                    \
  }
REMAT_NORM_RANGES(float, f32)
REMAT_NORM_RANGES(double, f64)
#undef REMAT_NORM_RANGES

template <class T>
void layer_norm_rows(const NormArgs<T>& a, int64_t rows) {
  for_row_ranges(rows, a.cols, [&](int64_t r0, int64_t r1) {
    if constexpr (sizeof(T) == 4) layer_norm_range_f32(a, r0, r1);
    else layer_norm_range_f64(a, r0, r1);
  });
}
template <class T>
void add_layer_norm_rows(const AddNormArgs<T>& a, int64_t rows) {
  for_row_ranges(rows, a.norm.cols, [&](int64_t r0, int64_t r1) {
    if constexpr (sizeof(T) == 4) add_layer_norm_range_f32(a, r0, r1);
    else add_layer_norm_range_f64(a, r0, r1);
  });
}
template <class T>
void rms_norm_rows(const NormArgs<T>& a, int64_t rows) {
  for_row_ranges(rows, a.cols, [&](int64_t r0, int64_t r1) {
    if constexpr (sizeof(T) == 4) rms_norm_range_f32(a, r0, r1);
    else rms_norm_range_f64(a, r0, r1);
  });
}

// gx for every row; gw = sum over rows of gy * xhat and gb = sum of gy, each over the fixed
// blocks, combined in block order.
template <class T>
void norm_backward_rows(const NormBackwardArgs<T>& a, int64_t rows, T* gw, T* gb) {
  const int64_t cols = a.cols;
  auto run = [&](int64_t r0, int64_t r1, T* pw32, T* pb32, double* pw64, double* pb64) {
    if constexpr (sizeof(T) == 4) norm_backward_block_f32(a, r0, r1, pw32, pb32, pw64, pb64);
    else norm_backward_block_f64(a, r0, r1, pw32, pb32, pw64, pb64);
  };
  if (!gw && !gb) {
    for_row_ranges(rows, cols, [&](int64_t r0, int64_t r1) { run(r0, r1, nullptr, nullptr, nullptr, nullptr); });
    return;
  }
  const int64_t blocks = param_grad_blocks(rows);
  // float64 partials per block and float32 ones per thread, uninitialised (the blocks clear them)
  const int threads = rows * cols >= kParallelThreshold ? omp_get_max_threads() : 1;
  std::unique_ptr<double[]> pw(gw ? new double[static_cast<size_t>(blocks * cols)] : nullptr);
  std::unique_ptr<double[]> pb(gb ? new double[static_cast<size_t>(blocks * cols)] : nullptr);
  std::unique_ptr<T[]> p32(new T[static_cast<size_t>(2 * cols * threads)]);
  for_blocks(blocks, rows, cols, [&](int64_t b) {
    T* mine = p32.get() + 2 * cols * (threads > 1 ? omp_get_thread_num() : 0);
    run(block_begin(b, blocks, rows), block_begin(b + 1, blocks, rows), gw ? mine : nullptr, gb ? mine + cols : nullptr,
        gw ? pw.get() + b * cols : nullptr, gb ? pb.get() + b * cols : nullptr);
  });
  if (gw) combine_blocks(pw.get(), blocks, cols, gw);
  if (gb) combine_blocks(pb.get(), blocks, cols, gb);
}

void check_out(const Tensor& t, const char* op) {
  REMAT_ASSERT(!t.defined() || t.is_contiguous(), op, ": output of shape ", shape_str(t.shape()), " is not contiguous");
}

}  // namespace

void CpuKernels::softmax(const Tensor& x_in, const Tensor& y, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  check_out(y, op);
  if (y.numel() == 0) return;
  Tensor x = contiguous_input(x_in);
  const int64_t cols = row_length(x), rows = row_count(x, cols);
  dispatch_float(y.dtype(), op, [&]<class T>() { softmax_rows<T>(x.data<T>(), y.data<T>(), rows, cols, log); });
}

void CpuKernels::softmax_backward(const Tensor& y_in, const Tensor& gy_in, const Tensor& gx, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  check_out(gx, op);
  if (gx.numel() == 0) return;
  Tensor y = contiguous_input(y_in), gy = contiguous_input(gy_in);
  const int64_t cols = row_length(y), rows = row_count(y, cols);
  dispatch_float(gx.dtype(), op, [&]<class T>() {
    softmax_backward_rows<T>(y.data<T>(), gy.data<T>(), gx.data<T>(), rows, cols, log);
  });
}

void CpuKernels::layer_norm(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, double eps,
                            const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  check_out(y, "layer_norm");
  check_out(mean, "layer_norm");
  check_out(rstd, "layer_norm");
  Tensor x = contiguous_input(x_in), w = contiguous_input(weight_in), b = contiguous_input(bias_in);
  const int64_t cols = row_length(x), rows = row_count(x, cols);
  if (rows == 0) return;
  dispatch_float(y.dtype(), "layer_norm", [&]<class T>() {
    NormArgs<T> a{x.data<T>(), cdata<T>(w), cdata<T>(b), eps, y.data<T>(), mean.data<T>(), rstd.data<T>(), cols};
    layer_norm_rows<T>(a, rows);
  });
}

void CpuKernels::layer_norm_backward(const Tensor& x_in, const Tensor& weight_in, const Tensor& mean_in,
                                     const Tensor& rstd_in, const Tensor& gy_in, const Tensor& gx,
                                     const Tensor& gweight, const Tensor& gbias) {
  check_out(gx, "layer_norm_backward");
  check_out(gweight, "layer_norm_backward");
  check_out(gbias, "layer_norm_backward");
  Tensor x = contiguous_input(x_in), w = contiguous_input(weight_in), mean = contiguous_input(mean_in),
         rstd = contiguous_input(rstd_in), gy = contiguous_input(gy_in);
  const int64_t cols = row_length(x), rows = row_count(x, cols);
  dispatch_float(x.dtype(), "layer_norm_backward", [&]<class T>() {
    if (rows == 0) {  // empty batch: parameter gradients are zero
      for (T* p : {mdata<T>(gweight), mdata<T>(gbias)})
        if (p) std::fill(p, p + cols, T(0));
      return;
    }
    NormBackwardArgs<T> a{x.data<T>(), cdata<T>(w), mean.data<T>(), rstd.data<T>(), gy.data<T>(), mdata<T>(gx), cols};
    norm_backward_rows<T>(a, rows, mdata<T>(gweight), mdata<T>(gbias));
  });
}

void CpuKernels::add_layer_norm(const Tensor& x_in, const Tensor& r_in, const Tensor& weight_in, const Tensor& bias_in,
                                double eps, const Tensor& s, const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  for (const Tensor* t : {&s, &y, &mean, &rstd}) check_out(*t, "add_layer_norm");
  Tensor x = contiguous_input(x_in), r = contiguous_input(r_in), w = contiguous_input(weight_in),
         b = contiguous_input(bias_in);
  const int64_t cols = row_length(x), rows = row_count(x, cols);
  if (rows == 0) return;
  dispatch_float(y.dtype(), "add_layer_norm", [&]<class T>() {
    AddNormArgs<T> a{x.data<T>(), r.data<T>(), s.data<T>(),
                     {s.data<T>(), cdata<T>(w), cdata<T>(b), eps, y.data<T>(), mean.data<T>(), rstd.data<T>(), cols}};
    add_layer_norm_rows<T>(a, rows);
  });
}

void CpuKernels::add_layer_norm_backward(const Tensor& s_in, const Tensor& weight_in, const Tensor& mean_in,
                                         const Tensor& rstd_in, const Tensor& gy_in, const Tensor& gs_in,
                                         const Tensor& gx, const Tensor& gweight, const Tensor& gbias) {
  for (const Tensor* t : {&gx, &gweight, &gbias}) check_out(*t, "add_layer_norm_backward");
  REMAT_ASSERT(gx.defined(), "add_layer_norm_backward: the input gradient is undefined");
  Tensor s = contiguous_input(s_in), w = contiguous_input(weight_in), mean = contiguous_input(mean_in),
         rstd = contiguous_input(rstd_in), gy = contiguous_input(gy_in), gs = contiguous_input(gs_in);
  const int64_t cols = row_length(s), rows = row_count(s, cols);
  dispatch_float(s.dtype(), "add_layer_norm_backward", [&]<class T>() {
    if (rows == 0) {  // empty batch: parameter gradients are zero
      for (T* p : {mdata<T>(gweight), mdata<T>(gbias)})
        if (p) std::fill(p, p + cols, T(0));
      return;
    }
    NormBackwardArgs<T> a{s.data<T>(), cdata<T>(w), mean.data<T>(), rstd.data<T>(), gy.data<T>(), gx.data<T>(), cols,
                          gs.data<T>()};
    norm_backward_rows<T>(a, rows, mdata<T>(gweight), mdata<T>(gbias));
  });
}

void CpuKernels::rms_norm(const Tensor& x_in, const Tensor& weight_in, double eps, const Tensor& y,
                          const Tensor& rstd) {
  check_out(y, "rms_norm");
  check_out(rstd, "rms_norm");
  Tensor x = contiguous_input(x_in), w = contiguous_input(weight_in);
  const int64_t cols = row_length(x), rows = row_count(x, cols);
  if (rows == 0) return;
  dispatch_float(y.dtype(), "rms_norm", [&]<class T>() {
    NormArgs<T> a{x.data<T>(), cdata<T>(w), nullptr, eps, y.data<T>(), nullptr, rstd.data<T>(), cols};
    rms_norm_rows<T>(a, rows);
  });
}

void CpuKernels::rms_norm_backward(const Tensor& x_in, const Tensor& weight_in, const Tensor& rstd_in,
                                   const Tensor& gy_in, const Tensor& gx, const Tensor& gweight) {
  check_out(gx, "rms_norm_backward");
  check_out(gweight, "rms_norm_backward");
  Tensor x = contiguous_input(x_in), w = contiguous_input(weight_in), rstd = contiguous_input(rstd_in),
         gy = contiguous_input(gy_in);
  const int64_t cols = row_length(x), rows = row_count(x, cols);
  dispatch_float(x.dtype(), "rms_norm_backward", [&]<class T>() {
    if (rows == 0) {
      if (gweight.defined()) std::fill(gweight.data<T>(), gweight.data<T>() + cols, T(0));
      return;
    }
    NormBackwardArgs<T> a{x.data<T>(), cdata<T>(w), nullptr, rstd.data<T>(), gy.data<T>(), mdata<T>(gx), cols};
    norm_backward_rows<T>(a, rows, mdata<T>(gweight), nullptr);
  });
}

}  // namespace remat::cpu
