// CUDA row kernels over the last axis: softmax / log-softmax, layer norm and RMS norm, forward and
// backward, mirroring src/tensor/cpu/rows.cpp (the same formulas, the same float64 sums of f32).
// One block of kThreads threads per row: thread t takes columns t, t + kThreads, ... and the
// block folds the sums in a fixed tree (device_common.cuh). The parameter gradients of the norms
// (sums over rows) use the fixed two-pass column sums (column_partials / combine_partials).
#include <cmath>
#include <utility>

#include "tensor/cuda/norm_rows.cuh"

namespace remat::cuda {

namespace {

#define REMAT_FOR_ROWS(r, rows) for (int64_t r = blockIdx.x; r < (rows); r += gridDim.x)
#define REMAT_FOR_COLS(c, cols) for (int64_t c = threadIdx.x; c < (cols); c += blockDim.x)

template <class T>
__device__ inline T row_max(const T* xr, int64_t cols, T* shared) {
  T m = -INFINITY;
  REMAT_FOR_COLS(c, cols) m = xr[c] > m ? xr[c] : m;  // NaN entries are skipped, as on the CPU
  return block_max(m, shared);
}

template <class T>
__global__ void softmax_kernel(const T* x, T* y, int64_t rows, int64_t cols, bool log) {
  __shared__ T shared_t[32];
  __shared__ Acc<T> shared[32];
  REMAT_FOR_ROWS(r, rows) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    T m = row_max(xr, cols, shared_t);
    if (m == -INFINITY) m = T(0);  // a row of -inf only: the sum is 0 and the result NaN
    Acc<T> sum = 0;
    REMAT_FOR_COLS(c, cols) sum += static_cast<Acc<T>>(exp(xr[c] - m));
    sum = block_sum(sum, shared);
    if (log) {
      const T shift = static_cast<T>(static_cast<Acc<T>>(m) + ::log(sum));
      REMAT_FOR_COLS(c, cols) yr[c] = xr[c] - shift;
    } else {
      const T inv = static_cast<T>(Acc<T>(1) / sum);
      REMAT_FOR_COLS(c, cols) yr[c] = exp(xr[c] - m) * inv;
    }
  }
}

template <class T>
__global__ void softmax_backward_kernel(const T* y, const T* gy, T* gx, int64_t rows, int64_t cols, bool log) {
  __shared__ Acc<T> shared[32];
  REMAT_FOR_ROWS(r, rows) {
    const T* yr = y + r * cols;
    const T* gr = gy + r * cols;
    T* out = gx + r * cols;
    Acc<T> s = 0;
    if (log) {
      REMAT_FOR_COLS(c, cols) s += static_cast<Acc<T>>(gr[c]);  // gx = gy - softmax * sum(gy)
    } else {
      REMAT_FOR_COLS(c, cols) s += static_cast<Acc<T>>(gr[c] * yr[c]);  // gx = y * (gy - sum(gy * y))
    }
    const T st = static_cast<T>(block_sum(s, shared));
    if (log) {
      REMAT_FOR_COLS(c, cols) out[c] = gr[c] - exp(yr[c]) * st;
    } else {
      REMAT_FOR_COLS(c, cols) out[c] = yr[c] * (gr[c] - st);
    }
  }
}

// y = (x - mean) * rstd * w + b (layer norm, centred) or x * rstd * w (RMS norm)
template <class T>
__global__ void norm_kernel(const T* x, const T* w, const T* b, double eps, T* y, T* mean, T* rstd, int64_t rows,
                            int64_t cols, bool centred) {
  __shared__ Acc<T> shared[32];
  const Acc<T> n = static_cast<Acc<T>>(cols);
  REMAT_FOR_ROWS(r, rows) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    T mu = T(0);
    Acc<T> squares = 0;
    if (centred) {
      Acc<T> s = 0;
      REMAT_FOR_COLS(c, cols) s += static_cast<Acc<T>>(xr[c]);
      mu = static_cast<T>(block_sum(s, shared) / n);
    }
    REMAT_FOR_COLS(c, cols) {
      const T d = xr[c] - mu;
      squares += static_cast<Acc<T>>(d * d);
    }
    squares = block_sum(squares, shared);
    const T rs = static_cast<T>(Acc<T>(1) / sqrt(squares / n + static_cast<Acc<T>>(eps)));
    if (threadIdx.x == 0) {
      if (centred) mean[r] = mu;
      rstd[r] = rs;
    }
    REMAT_FOR_COLS(c, cols) {
      T v = (xr[c] - mu) * rs;
      if (w) v = v * w[c];
      if (b) v = v + b[c];
      yr[c] = v;
    }
  }
}

// gx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = gy * w, xhat = (x - mean) * rstd (RMS
// norm: no mean(g) term, xhat = x * rstd)
template <class T>
__global__ void norm_backward_kernel(const T* x, const T* w, const T* mean, const T* rstd, const T* gy, T* gx,
                                     int64_t rows, int64_t cols) {
  __shared__ Acc<T> shared[32];
  const Acc<T> n = static_cast<Acc<T>>(cols);
  REMAT_FOR_ROWS(r, rows) {
    const T* xr = x + r * cols;
    const T* gr = gy + r * cols;
    T* out = gx + r * cols;
    const T mu = mean ? mean[r] : T(0), rs = rstd[r];
    Acc<T> sg = 0, sgx = 0;
    REMAT_FOR_COLS(c, cols) {
      const T g = w ? gr[c] * w[c] : gr[c];
      sg += static_cast<Acc<T>>(g);
      sgx += static_cast<Acc<T>>(g * ((xr[c] - mu) * rs));
    }
    sg = block_sum(sg, shared);
    sgx = block_sum(sgx, shared);
    const T mg = mean ? static_cast<T>(sg / n) : T(0);
    const T mgx = static_cast<T>(sgx / n);
    REMAT_FOR_COLS(c, cols) {
      const T g = w ? gr[c] * w[c] : gr[c];
      out[c] = rs * (g - mg - (xr[c] - mu) * rs * mgx);
    }
  }
}

// gy * xhat (the weight gradient's terms) or gy (the bias gradient's)
template <class T>
struct NormParamTerm {
  const T* x;
  const T* mean;  // null for RMS norm
  const T* rstd;
  const T* gy;
  int64_t cols;
  bool weight;
  __device__ Acc<T> operator()(int64_t r, int64_t c) const {
    const T g = gy[r * cols + c];
    if (!weight) return static_cast<Acc<T>>(g);
    const T mu = mean ? mean[r] : T(0);
    return static_cast<Acc<T>>(g * ((x[r * cols + c] - mu) * rstd[r]));
  }
};

void check_out(const Tensor& t, const char* op) {
  REMAT_ASSERT(!t.defined() || t.is_contiguous(), op, ": output of shape ", shape_str(t.shape()), " is not contiguous");
}

}  // namespace

void CudaBackend::softmax(const Tensor& x_in, const Tensor& y, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  check_out(y, op);
  if (y.numel() == 0) return;
  DeviceGuard guard(device_);
  Tensor x = contiguous(x_in);
  const int64_t cols = row_length(x), rows = row_count(x, cols);
  dispatch_float(y.dtype(), op, [&]<class T>() {
    softmax_kernel<T><<<grid_for(rows, 1), kThreads, 0, stream_>>>(ptr<T>(x), ptr<T>(y), rows, cols, log);
  });
  check_launch(op);
}

void CudaBackend::softmax_backward(const Tensor& y_in, const Tensor& gy_in, const Tensor& gx, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  check_out(gx, op);
  if (gx.numel() == 0) return;
  DeviceGuard guard(device_);
  Tensor y = contiguous(y_in), gy = contiguous(gy_in);
  const int64_t cols = row_length(y), rows = row_count(y, cols);
  dispatch_float(gx.dtype(), op, [&]<class T>() {
    softmax_backward_kernel<T>
        <<<grid_for(rows, 1), kThreads, 0, stream_>>>(ptr<T>(y), ptr<T>(gy), ptr<T>(gx), rows, cols, log);
  });
  check_launch(op);
}

void CudaBackend::layer_norm(const Tensor& x_in, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                             const Tensor& mean, const Tensor& rstd) {
  for (const Tensor* t : {&y, &mean, &rstd}) check_out(*t, "layer_norm");
  DeviceGuard guard(device_);
  Tensor x = contiguous(x_in), w = contiguous(weight), b = contiguous(bias);
  const int64_t cols = row_length(x), rows = row_count(x, cols);
  if (rows == 0) return;
  dispatch_float(y.dtype(), "layer_norm", [&]<class T>() {
    norm_kernel<T><<<grid_for(rows, 1), kThreads, 0, stream_>>>(ptr<T>(x), ptr<T>(w), ptr<T>(b), eps, ptr<T>(y),
                                                                ptr<T>(mean), ptr<T>(rstd), rows, cols, true);
  });
  check_launch("layer_norm");
}

void CudaBackend::rms_norm(const Tensor& x_in, const Tensor& weight, double eps, const Tensor& y, const Tensor& rstd) {
  check_out(y, "rms_norm");
  check_out(rstd, "rms_norm");
  DeviceGuard guard(device_);
  Tensor x = contiguous(x_in), w = contiguous(weight);
  const int64_t cols = row_length(x), rows = row_count(x, cols);
  if (rows == 0) return;
  dispatch_float(y.dtype(), "rms_norm", [&]<class T>() {
    norm_kernel<T><<<grid_for(rows, 1), kThreads, 0, stream_>>>(ptr<T>(x), ptr<T>(w), nullptr, eps, ptr<T>(y), nullptr,
                                                                ptr<T>(rstd), rows, cols, false);
  });
  check_launch("rms_norm");
}

namespace {

// gx (when defined) and the parameter gradients gweight, gbias (when defined) of a norm.
template <class T>
void norm_backward(CudaBackend& be, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                   const Tensor& gy, const Tensor& gx, const Tensor& gweight, const Tensor& gbias) {
  const int64_t cols = row_length(x), rows = row_count(x, cols);
  cudaStream_t stream = be.stream();
  if (rows == 0) {  // empty batch: parameter gradients are zero
    for (const Tensor* g : {&gweight, &gbias})
      if (g->defined()) be.fill(*g, 0.0);
    return;
  }
  const int64_t chunks = chunk_count(rows);
  if (fast(Fast::layer_norm) && gx.defined() && fits_one_pass(cols)) {  // the results are the default path's bits
    norm_backward_one_pass<T>(be, x, w, mean, rstd, gy, Tensor(), gx, gweight, gbias, rows, cols,
                              "norm backward (one pass)", "norm backward (parameter sums)");
    return;
  }
  if (gx.defined()) {
    norm_backward_kernel<T><<<grid_for(rows, 1), kThreads, 0, stream>>>(
        ptr<T>(x), ptr<T>(w), ptr<T>(mean), ptr<T>(rstd), ptr<T>(gy), ptr<T>(gx), rows, cols);
    check_launch("norm backward");
  }
  for (const Tensor* g : {&gweight, &gbias}) {
    if (!g->defined()) continue;
    Tensor partial = be.scratch({chunks, cols}, DType::f64);
    const NormParamTerm<T> term{ptr<T>(x), ptr<T>(mean), ptr<T>(rstd), ptr<T>(gy), cols, g == &gweight};
    column_partials<Acc<T>><<<grid_for(chunks * cols), kThreads, 0, stream>>>(term, rows, cols, ptr<Acc<T>>(partial));
    check_launch("norm backward (parameter partials)");
    combine_partials<Acc<T>, T>
        <<<grid_for(cols), kThreads, 0, stream>>>(ptr<Acc<T>>(partial), chunks, cols, Acc<T>(1), ptr<T>(*g));
    check_launch("norm backward (parameter sums)");
  }
}

}  // namespace

void CudaBackend::layer_norm_backward(const Tensor& x_in, const Tensor& weight, const Tensor& mean_in,
                                      const Tensor& rstd_in, const Tensor& gy_in, const Tensor& gx,
                                      const Tensor& gweight, const Tensor& gbias) {
  for (const Tensor* t : {&gx, &gweight, &gbias}) check_out(*t, "layer_norm_backward");
  DeviceGuard guard(device_);
  Tensor x = contiguous(x_in), w = contiguous(weight), mean = contiguous(mean_in), rstd = contiguous(rstd_in),
         gy = contiguous(gy_in);
  dispatch_float(x.dtype(), "layer_norm_backward",
                 [&]<class T>() { norm_backward<T>(*this, x, w, mean, rstd, gy, gx, gweight, gbias); });
}

void CudaBackend::rms_norm_backward(const Tensor& x_in, const Tensor& weight, const Tensor& rstd_in,
                                    const Tensor& gy_in, const Tensor& gx, const Tensor& gweight) {
  check_out(gx, "rms_norm_backward");
  check_out(gweight, "rms_norm_backward");
  DeviceGuard guard(device_);
  Tensor x = contiguous(x_in), w = contiguous(weight), rstd = contiguous(rstd_in), gy = contiguous(gy_in);
  dispatch_float(x.dtype(), "rms_norm_backward",
                 [&]<class T>() { norm_backward<T>(*this, x, w, Tensor(), rstd, gy, gx, gweight, Tensor()); });
}

}  // namespace remat::cuda
