// CPU row kernels over the last axis: softmax / log-softmax, layer norm and RMS norm, forward and
// backward. A tensor is viewed as [rows, cols]; rows run in parallel (OpenMP) when the tensor is
// large, and each row is processed by one thread with vectorisable inner loops. Sums of f32
// accumulate in f64.
//
// Reproducibility: every per-row sum runs in a fixed order inside one thread. The parameter
// gradients of the norms (gweight, gbias: sums over rows) are reduced over FIXED row blocks
// (their number depends on the shape only, never on the thread count) whose partial sums are
// combined in block order, so the result is bitwise identical for any number of threads.
#include <cmath>
#include <limits>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/vmath.h"

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

template <class T>
void softmax_rows(const T* x, T* y, int64_t rows, int64_t cols, bool log) {
  for_rows(rows, cols, [&](int64_t r) {
    const T* __restrict xr = x + r * cols;
    T* __restrict yr = y + r * cols;
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
    // A row of -inf only: subtract 0 instead of -inf (the row sum is then 0 and the result NaN,
    // as in other libraries, rather than NaN from -inf - -inf inside exp).
    if (m == -std::numeric_limits<T>::infinity()) m = T(0);
    Acc<T> sum = 0;
    if (log) {
#pragma omp simd reduction(+ : sum)
      for (int64_t c = 0; c < cols; ++c) sum += static_cast<Acc<T>>(exp_any(xr[c] - m));
      const T shift = static_cast<T>(static_cast<Acc<T>>(m) + std::log(sum));
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) yr[c] = xr[c] - shift;
    } else {
#pragma omp simd reduction(+ : sum)
      for (int64_t c = 0; c < cols; ++c) {
        T e = exp_any(xr[c] - m);
        yr[c] = e;
        sum += static_cast<Acc<T>>(e);
      }
      const Acc<T> inv = Acc<T>(1) / sum;
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) yr[c] = static_cast<T>(static_cast<Acc<T>>(yr[c]) * inv);
    }
  });
}

template <class T>
void softmax_backward_rows(const T* y, const T* gy, T* gx, int64_t rows, int64_t cols, bool log) {
  for_rows(rows, cols, [&](int64_t r) {
    const T* __restrict yr = y + r * cols;
    const T* __restrict gr = gy + r * cols;
    T* __restrict out = gx + r * cols;
    Acc<T> s = 0;
    if (log) {
      // y = log softmax: gx = gy - softmax * sum(gy)
#pragma omp simd reduction(+ : s)
      for (int64_t c = 0; c < cols; ++c) s += static_cast<Acc<T>>(gr[c]);
      const T st = static_cast<T>(s);
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) out[c] = gr[c] - exp_any(yr[c]) * st;
    } else {
      // gx = y * (gy - sum(gy * y))
#pragma omp simd reduction(+ : s)
      for (int64_t c = 0; c < cols; ++c) s += static_cast<Acc<T>>(gr[c]) * static_cast<Acc<T>>(yr[c]);
      const T st = static_cast<T>(s);
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) out[c] = yr[c] * (gr[c] - st);
    }
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
void combine_blocks(const std::vector<double>& partial, int64_t blocks, int64_t cols, T* out) {
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

// ---- layer norm

template <class T>
void layer_norm_rows(const T* x, const T* w, const T* bias, double eps, T* y, T* mean_out, T* rstd_out,
                     int64_t rows, int64_t cols) {
  for_rows(rows, cols, [&](int64_t r) {
    const T* __restrict xr = x + r * cols;
    T* __restrict yr = y + r * cols;
    Acc<T> s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < cols; ++c) s += static_cast<Acc<T>>(xr[c]);
    const Acc<T> mu = s / static_cast<Acc<T>>(cols);
    Acc<T> v = 0;
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < cols; ++c) {
      Acc<T> d = static_cast<Acc<T>>(xr[c]) - mu;
      v += d * d;
    }
    const Acc<T> rs = Acc<T>(1) / std::sqrt(v / static_cast<Acc<T>>(cols) + static_cast<Acc<T>>(eps));
    const T mu_t = static_cast<T>(mu), rs_t = static_cast<T>(rs);
    mean_out[r] = mu_t;
    rstd_out[r] = rs_t;
    if (w && bias) {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - mu_t) * rs_t * w[c] + bias[c];
    } else if (w) {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - mu_t) * rs_t * w[c];
    } else if (bias) {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - mu_t) * rs_t + bias[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - mu_t) * rs_t;
    }
  });
}

// gx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = gy * w, xhat = (x - mean) * rstd.
// Adds gy * xhat and gy of the row into pw / pb (when given).
template <class T>
void layer_norm_backward_row(const T* __restrict xr, const T* __restrict w, T mu, T rs, const T* __restrict gr,
                             T* __restrict out, double* __restrict pw, double* __restrict pb, int64_t cols) {
  if (out) {
    Acc<T> sg = 0, sgx = 0;
    if (w) {
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t c = 0; c < cols; ++c) {
        Acc<T> g = static_cast<Acc<T>>(gr[c]) * static_cast<Acc<T>>(w[c]);
        sg += g;
        sgx += g * static_cast<Acc<T>>((xr[c] - mu) * rs);
      }
    } else {
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t c = 0; c < cols; ++c) {
        Acc<T> g = static_cast<Acc<T>>(gr[c]);
        sg += g;
        sgx += g * static_cast<Acc<T>>((xr[c] - mu) * rs);
      }
    }
    const T a = static_cast<T>(sg / static_cast<Acc<T>>(cols));
    const T b = static_cast<T>(sgx / static_cast<Acc<T>>(cols));
    if (w) {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) out[c] = rs * (gr[c] * w[c] - a - (xr[c] - mu) * rs * b);
    } else {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) out[c] = rs * (gr[c] - a - (xr[c] - mu) * rs * b);
    }
  }
  if (pw) {
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) pw[c] += static_cast<double>(gr[c]) * static_cast<double>((xr[c] - mu) * rs);
  }
  if (pb) {
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) pb[c] += static_cast<double>(gr[c]);
  }
}

template <class T>
void layer_norm_backward_impl(const T* x, const T* w, const T* mean, const T* rstd, const T* gy, T* gx, T* gw,
                              T* gb, int64_t rows, int64_t cols) {
  if (!gw && !gb) {
    for_rows(rows, cols, [&](int64_t r) {
      layer_norm_backward_row<T>(x + r * cols, w, mean[r], rstd[r], gy + r * cols, gx ? gx + r * cols : nullptr,
                                 nullptr, nullptr, cols);
    });
    return;
  }
  const int64_t blocks = param_grad_blocks(rows);
  std::vector<double> pw(gw ? static_cast<size_t>(blocks * cols) : 0, 0.0);
  std::vector<double> pb(gb ? static_cast<size_t>(blocks * cols) : 0, 0.0);
  for_blocks(blocks, rows, cols, [&](int64_t b) {
    double* pwb = gw ? pw.data() + b * cols : nullptr;
    double* pbb = gb ? pb.data() + b * cols : nullptr;
    for (int64_t r = block_begin(b, blocks, rows), end = block_begin(b + 1, blocks, rows); r < end; ++r)
      layer_norm_backward_row<T>(x + r * cols, w, mean[r], rstd[r], gy + r * cols, gx ? gx + r * cols : nullptr,
                                 pwb, pbb, cols);
  });
  if (gw) combine_blocks(pw, blocks, cols, gw);
  if (gb) combine_blocks(pb, blocks, cols, gb);
}

// ---- RMS norm

template <class T>
void rms_norm_rows(const T* x, const T* w, double eps, T* y, T* rstd_out, int64_t rows, int64_t cols) {
  for_rows(rows, cols, [&](int64_t r) {
    const T* __restrict xr = x + r * cols;
    T* __restrict yr = y + r * cols;
    Acc<T> s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < cols; ++c) s += static_cast<Acc<T>>(xr[c]) * static_cast<Acc<T>>(xr[c]);
    const T rs = static_cast<T>(Acc<T>(1) / std::sqrt(s / static_cast<Acc<T>>(cols) + static_cast<Acc<T>>(eps)));
    rstd_out[r] = rs;
    if (w) {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) yr[c] = xr[c] * rs * w[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) yr[c] = xr[c] * rs;
    }
  });
}

// gx = rstd * (g - xhat * mean(g * xhat)), g = gy * w, xhat = x * rstd; adds gy * xhat to pw.
template <class T>
void rms_norm_backward_row(const T* __restrict xr, const T* __restrict w, T rs, const T* __restrict gr,
                           T* __restrict out, double* __restrict pw, int64_t cols) {
  if (out) {
    Acc<T> sgx = 0;
    if (w) {
#pragma omp simd reduction(+ : sgx)
      for (int64_t c = 0; c < cols; ++c)
        sgx += static_cast<Acc<T>>(gr[c]) * static_cast<Acc<T>>(w[c]) * static_cast<Acc<T>>(xr[c] * rs);
    } else {
#pragma omp simd reduction(+ : sgx)
      for (int64_t c = 0; c < cols; ++c) sgx += static_cast<Acc<T>>(gr[c]) * static_cast<Acc<T>>(xr[c] * rs);
    }
    const T b = static_cast<T>(sgx / static_cast<Acc<T>>(cols));
    if (w) {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) out[c] = rs * (gr[c] * w[c] - xr[c] * rs * b);
    } else {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) out[c] = rs * (gr[c] - xr[c] * rs * b);
    }
  }
  if (pw) {
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) pw[c] += static_cast<double>(gr[c]) * static_cast<double>(xr[c] * rs);
  }
}

template <class T>
void rms_norm_backward_impl(const T* x, const T* w, const T* rstd, const T* gy, T* gx, T* gw, int64_t rows,
                            int64_t cols) {
  if (!gw) {
    for_rows(rows, cols, [&](int64_t r) {
      rms_norm_backward_row<T>(x + r * cols, w, rstd[r], gy + r * cols, gx ? gx + r * cols : nullptr, nullptr, cols);
    });
    return;
  }
  const int64_t blocks = param_grad_blocks(rows);
  std::vector<double> pw(static_cast<size_t>(blocks * cols), 0.0);
  for_blocks(blocks, rows, cols, [&](int64_t b) {
    double* pwb = pw.data() + b * cols;
    for (int64_t r = block_begin(b, blocks, rows), end = block_begin(b + 1, blocks, rows); r < end; ++r)
      rms_norm_backward_row<T>(x + r * cols, w, rstd[r], gy + r * cols, gx ? gx + r * cols : nullptr, pwb, cols);
  });
  combine_blocks(pw, blocks, cols, gw);
}

void check_out(const Tensor& t, const char* op) {
  REMAT_ASSERT(!t.defined() || t.is_contiguous(), op, ": output of shape ", shape_str(t.shape()), " is not contiguous");
}

}  // namespace

void CpuBackend::softmax(const Tensor& x_in, const Tensor& y, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  check_out(y, op);
  if (y.numel() == 0) return;
  Tensor x = contiguous_input(x_in);
  const int64_t cols = row_length(x), rows = row_count(x, cols);
  dispatch_float(y.dtype(), op, [&]<class T>() { softmax_rows<T>(x.data<T>(), y.data<T>(), rows, cols, log); });
}

void CpuBackend::softmax_backward(const Tensor& y_in, const Tensor& gy_in, const Tensor& gx, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  check_out(gx, op);
  if (gx.numel() == 0) return;
  Tensor y = contiguous_input(y_in), gy = contiguous_input(gy_in);
  const int64_t cols = row_length(y), rows = row_count(y, cols);
  dispatch_float(gx.dtype(), op, [&]<class T>() {
    softmax_backward_rows<T>(y.data<T>(), gy.data<T>(), gx.data<T>(), rows, cols, log);
  });
}

void CpuBackend::layer_norm(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, double eps,
                            const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  check_out(y, "layer_norm");
  check_out(mean, "layer_norm");
  check_out(rstd, "layer_norm");
  Tensor x = contiguous_input(x_in), w = contiguous_input(weight_in), b = contiguous_input(bias_in);
  const int64_t cols = row_length(x), rows = row_count(x, cols);
  if (rows == 0) return;
  dispatch_float(y.dtype(), "layer_norm", [&]<class T>() {
    layer_norm_rows<T>(x.data<T>(), cdata<T>(w), cdata<T>(b), eps, y.data<T>(), mean.data<T>(), rstd.data<T>(), rows,
                       cols);
  });
}

void CpuBackend::layer_norm_backward(const Tensor& x_in, const Tensor& weight_in, const Tensor& mean_in,
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
    layer_norm_backward_impl<T>(x.data<T>(), cdata<T>(w), mean.data<T>(), rstd.data<T>(), gy.data<T>(), mdata<T>(gx),
                                mdata<T>(gweight), mdata<T>(gbias), rows, cols);
  });
}

void CpuBackend::rms_norm(const Tensor& x_in, const Tensor& weight_in, double eps, const Tensor& y,
                          const Tensor& rstd) {
  check_out(y, "rms_norm");
  check_out(rstd, "rms_norm");
  Tensor x = contiguous_input(x_in), w = contiguous_input(weight_in);
  const int64_t cols = row_length(x), rows = row_count(x, cols);
  if (rows == 0) return;
  dispatch_float(y.dtype(), "rms_norm", [&]<class T>() {
    rms_norm_rows<T>(x.data<T>(), cdata<T>(w), eps, y.data<T>(), rstd.data<T>(), rows, cols);
  });
}

void CpuBackend::rms_norm_backward(const Tensor& x_in, const Tensor& weight_in, const Tensor& rstd_in,
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
    rms_norm_backward_impl<T>(x.data<T>(), cdata<T>(w), rstd.data<T>(), gy.data<T>(), mdata<T>(gx),
                              mdata<T>(gweight), rows, cols);
  });
}

}  // namespace remat::cpu
