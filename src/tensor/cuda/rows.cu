// CUDA row kernels over the last axis: softmax / log-softmax, layer norm and RMS norm, forward and
// backward, mirroring src/tensor/cpu/rows.cpp (the same formulas, the same float64 sums of f32).
// One block of kThreads threads per row: thread t takes columns t, t + kThreads, ... and the
// block folds the sums in a fixed tree (device_common.cuh). The parameter gradients of the norms
// (sums over rows) use the fixed two-pass column sums (column_partials / combine_partials).
// Each kernel is written for a storage type S and its arithmetic type C = Compute<S> (half.cuh):
// S itself for f32 and f64; float for bf16 and f16 (the option sixteen_bit), whose elements are
// widened on load and rounded once on store, with float32 statistics (mean, rstd) and the float32
// kernel's expressions and sums in their order: the widened float32 kernel's results, without the
// float32 copies of the operands (Note [16-bit floats on the GPU] in widen.cpp). The residual add
// fused into layer norm (add_layer_norm) runs as the kernels it fuses.
#include <cmath>
#include <initializer_list>
#include <utility>

#include "tensor/cuda/device_common.cuh"
#include "tensor/cuda/half.cuh"

namespace remat::cuda {

namespace {

int64_t row_length(const Tensor& x) { return x.dim() == 0 ? 1 : x.shape().back(); }
int64_t row_count(const Tensor& x, int64_t cols) { return cols == 0 ? 0 : x.numel() / cols; }

#define REMAT_FOR_ROWS(r, rows) for (int64_t r = blockIdx.x; r < (rows); r += gridDim.x)
#define REMAT_FOR_COLS(c, cols) for (int64_t c = threadIdx.x; c < (cols); c += blockDim.x)

template <class S, class T = Compute<S>>
__device__ inline T row_max(const S* xr, int64_t cols, T* shared) {
  T m = -INFINITY;
  REMAT_FOR_COLS(c, cols) {
    const T v = convert<T>(xr[c]);
    m = v > m ? v : m;  // NaN entries are skipped, as on the CPU
  }
  return block_max(m, shared);
}

template <class S>
__global__ void softmax_kernel(const S* x, S* y, int64_t rows, int64_t cols, bool log) {
  using T = Compute<S>;
  __shared__ T shared_t[32];
  __shared__ Acc<T> shared[32];
  REMAT_FOR_ROWS(r, rows) {
    const S* xr = x + r * cols;
    S* yr = y + r * cols;
    T m = row_max(xr, cols, shared_t);
    if (m == -INFINITY) m = T(0);  // a row of -inf only: the sum is 0 and the result NaN
    Acc<T> sum = 0;
    REMAT_FOR_COLS(c, cols) sum += static_cast<Acc<T>>(exp(convert<T>(xr[c]) - m));
    sum = block_sum(sum, shared);
    if (log) {
      const T shift = static_cast<T>(static_cast<Acc<T>>(m) + ::log(sum));
      REMAT_FOR_COLS(c, cols) yr[c] = convert<S>(convert<T>(xr[c]) - shift);
    } else {
      const T inv = static_cast<T>(Acc<T>(1) / sum);
      REMAT_FOR_COLS(c, cols) yr[c] = convert<S>(exp(convert<T>(xr[c]) - m) * inv);
    }
  }
}

template <class S>
__global__ void softmax_backward_kernel(const S* y, const S* gy, S* gx, int64_t rows, int64_t cols, bool log) {
  using T = Compute<S>;
  __shared__ Acc<T> shared[32];
  REMAT_FOR_ROWS(r, rows) {
    const S* yr = y + r * cols;
    const S* gr = gy + r * cols;
    S* out = gx + r * cols;
    Acc<T> s = 0;
    if (log) {
      REMAT_FOR_COLS(c, cols) s += static_cast<Acc<T>>(convert<T>(gr[c]));  // gx = gy - softmax * sum(gy)
    } else {
      REMAT_FOR_COLS(c, cols) s += static_cast<Acc<T>>(convert<T>(gr[c]) * convert<T>(yr[c]));  // gx = y * (gy - sum(gy * y))
    }
    const T st = static_cast<T>(block_sum(s, shared));
    if (log) {
      REMAT_FOR_COLS(c, cols) out[c] = convert<S>(convert<T>(gr[c]) - exp(convert<T>(yr[c])) * st);
    } else {
      REMAT_FOR_COLS(c, cols) out[c] = convert<S>(convert<T>(yr[c]) * (convert<T>(gr[c]) - st));
    }
  }
}

// y = (x - mean) * rstd * w + b (layer norm, centred) or x * rstd * w (RMS norm)
template <class S>
__global__ void norm_kernel(const S* x, const S* w, const S* b, double eps, S* y, Compute<S>* mean, Compute<S>* rstd,
                            int64_t rows, int64_t cols, bool centred) {
  using T = Compute<S>;
  __shared__ Acc<T> shared[32];
  const Acc<T> n = static_cast<Acc<T>>(cols);
  REMAT_FOR_ROWS(r, rows) {
    const S* xr = x + r * cols;
    S* yr = y + r * cols;
    T mu = T(0);
    Acc<T> squares = 0;
    if (centred) {
      Acc<T> s = 0;
      REMAT_FOR_COLS(c, cols) s += static_cast<Acc<T>>(convert<T>(xr[c]));
      mu = static_cast<T>(block_sum(s, shared) / n);
    }
    REMAT_FOR_COLS(c, cols) {
      const T d = convert<T>(xr[c]) - mu;
      squares += static_cast<Acc<T>>(d * d);
    }
    squares = block_sum(squares, shared);
    const T rs = static_cast<T>(Acc<T>(1) / sqrt(squares / n + static_cast<Acc<T>>(eps)));
    if (threadIdx.x == 0) {
      if (centred) mean[r] = mu;
      rstd[r] = rs;
    }
    REMAT_FOR_COLS(c, cols) {
      T v = (convert<T>(xr[c]) - mu) * rs;
      if (w) v = v * convert<T>(w[c]);
      if (b) v = v + convert<T>(b[c]);
      yr[c] = convert<S>(v);
    }
  }
}

// gx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = gy * w, xhat = (x - mean) * rstd (RMS
// norm: no mean(g) term, xhat = x * rstd)
template <class S>
__global__ void norm_backward_kernel(const S* x, const S* w, const Compute<S>* mean, const Compute<S>* rstd,
                                     const S* gy, S* gx, int64_t rows, int64_t cols) {
  using T = Compute<S>;
  __shared__ Acc<T> shared[32];
  const Acc<T> n = static_cast<Acc<T>>(cols);
  REMAT_FOR_ROWS(r, rows) {
    const S* xr = x + r * cols;
    const S* gr = gy + r * cols;
    S* out = gx + r * cols;
    const T mu = mean ? mean[r] : T(0), rs = rstd[r];
    Acc<T> sg = 0, sgx = 0;
    REMAT_FOR_COLS(c, cols) {
      const T g = w ? convert<T>(gr[c]) * convert<T>(w[c]) : convert<T>(gr[c]);
      sg += static_cast<Acc<T>>(g);
      sgx += static_cast<Acc<T>>(g * ((convert<T>(xr[c]) - mu) * rs));
    }
    sg = block_sum(sg, shared);
    sgx = block_sum(sgx, shared);
    const T mg = mean ? static_cast<T>(sg / n) : T(0);
    const T mgx = static_cast<T>(sgx / n);
    REMAT_FOR_COLS(c, cols) {
      const T g = w ? convert<T>(gr[c]) * convert<T>(w[c]) : convert<T>(gr[c]);
      out[c] = convert<S>(rs * (g - mg - (convert<T>(xr[c]) - mu) * rs * mgx));
    }
  }
}

// gy * xhat (the weight gradient's terms) or gy (the bias gradient's)
template <class S, class T = Compute<S>>
struct NormParamTerm {
  const S* x;
  const T* mean;  // null for RMS norm
  const T* rstd;
  const S* gy;
  int64_t cols;
  bool weight;
  __device__ Acc<T> operator()(int64_t r, int64_t c) const {
    const T g = convert<T>(gy[r * cols + c]);
    if (!weight) return static_cast<Acc<T>>(g);
    const T mu = mean ? mean[r] : T(0);
    return static_cast<Acc<T>>(g * ((convert<T>(x[r * cols + c]) - mu) * rstd[r]));
  }
};

void check_out(const Tensor& t, const char* op) {
  REMAT_ASSERT(!t.defined() || t.is_contiguous(), op, ": output of shape ", shape_str(t.shape()), " is not contiguous");
}

// The kernels take x's dtype for the row operands and accumulate_dtype's for the statistics.
void check_dtypes(const char* op, const Tensor& x, std::initializer_list<const Tensor*> rows,
                  std::initializer_list<const Tensor*> statistics) {
  for (const Tensor* t : rows)
    REMAT_ASSERT(!t->defined() || t->dtype() == x.dtype(), op, ": an operand of dtype ", dtype_name(t->dtype()),
                 " beside ", dtype_name(x.dtype()));
  for (const Tensor* t : statistics)
    REMAT_ASSERT(!t->defined() || t->dtype() == accumulate_dtype(x.dtype()), op, ": statistics of dtype ",
                 dtype_name(t->dtype()), " for ", dtype_name(x.dtype()));
}

}  // namespace

void CudaBackend::softmax(const Tensor& x_in, const Tensor& y, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  check_out(y, op);
  check_dtypes(op, x_in, {&y}, {});
  if (y.numel() == 0) return;
  DeviceGuard guard(device_);
  Tensor x = contiguous(x_in);
  const int64_t cols = row_length(x), rows = row_count(x, cols);
  dispatch_storage(y.dtype(), op, [&]<class T>() {
    softmax_kernel<T><<<grid_for(rows, 1), kThreads, 0, stream_>>>(ptr<T>(x), ptr<T>(y), rows, cols, log);
  });
  check_launch(op);
}

void CudaBackend::softmax_backward(const Tensor& y_in, const Tensor& gy_in, const Tensor& gx, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  check_out(gx, op);
  check_dtypes(op, y_in, {&gy_in, &gx}, {});
  if (gx.numel() == 0) return;
  DeviceGuard guard(device_);
  Tensor y = contiguous(y_in), gy = contiguous(gy_in);
  const int64_t cols = row_length(y), rows = row_count(y, cols);
  dispatch_storage(gx.dtype(), op, [&]<class T>() {
    softmax_backward_kernel<T>
        <<<grid_for(rows, 1), kThreads, 0, stream_>>>(ptr<T>(y), ptr<T>(gy), ptr<T>(gx), rows, cols, log);
  });
  check_launch(op);
}

void CudaBackend::layer_norm(const Tensor& x_in, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                             const Tensor& mean, const Tensor& rstd) {
  for (const Tensor* t : {&y, &mean, &rstd}) check_out(*t, "layer_norm");
  check_dtypes("layer_norm", x_in, {&weight, &bias, &y}, {&mean, &rstd});
  DeviceGuard guard(device_);
  Tensor x = contiguous(x_in), w = contiguous(weight), b = contiguous(bias);
  const int64_t cols = row_length(x), rows = row_count(x, cols);
  if (rows == 0) return;
  dispatch_storage(y.dtype(), "layer_norm", [&]<class T>() {
    norm_kernel<T><<<grid_for(rows, 1), kThreads, 0, stream_>>>(ptr<T>(x), ptr<T>(w), ptr<T>(b), eps, ptr<T>(y),
                                                                ptr<Compute<T>>(mean), ptr<Compute<T>>(rstd), rows,
                                                                cols, true);
  });
  check_launch("layer_norm");
}

void CudaBackend::rms_norm(const Tensor& x_in, const Tensor& weight, double eps, const Tensor& y, const Tensor& rstd) {
  check_out(y, "rms_norm");
  check_out(rstd, "rms_norm");
  check_dtypes("rms_norm", x_in, {&weight, &y}, {&rstd});
  DeviceGuard guard(device_);
  Tensor x = contiguous(x_in), w = contiguous(weight);
  const int64_t cols = row_length(x), rows = row_count(x, cols);
  if (rows == 0) return;
  dispatch_storage(y.dtype(), "rms_norm", [&]<class T>() {
    norm_kernel<T><<<grid_for(rows, 1), kThreads, 0, stream_>>>(ptr<T>(x), ptr<T>(w), nullptr, eps, ptr<T>(y),
                                                                nullptr, ptr<Compute<T>>(rstd), rows, cols, false);
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
  using C = Compute<T>;
  if (gx.defined()) {
    norm_backward_kernel<T><<<grid_for(rows, 1), kThreads, 0, stream>>>(
        ptr<T>(x), ptr<T>(w), ptr<C>(mean), ptr<C>(rstd), ptr<T>(gy), ptr<T>(gx), rows, cols);
    check_launch("norm backward");
  }
  for (const Tensor* g : {&gweight, &gbias}) {
    if (!g->defined()) continue;
    Tensor partial = be.scratch({chunks, cols}, DType::f64);
    const NormParamTerm<T> term{ptr<T>(x), ptr<C>(mean), ptr<C>(rstd), ptr<T>(gy), cols, g == &gweight};
    column_partials<Acc<C>><<<grid_for(chunks * cols), kThreads, 0, stream>>>(term, rows, cols, ptr<Acc<C>>(partial));
    check_launch("norm backward (parameter partials)");
    combine_partials<Acc<C>, T, C>
        <<<grid_for(cols), kThreads, 0, stream>>>(ptr<Acc<C>>(partial), chunks, cols, Acc<C>(1), ptr<T>(*g));
    check_launch("norm backward (parameter sums)");
  }
}

}  // namespace

void CudaBackend::layer_norm_backward(const Tensor& x_in, const Tensor& weight, const Tensor& mean_in,
                                      const Tensor& rstd_in, const Tensor& gy_in, const Tensor& gx,
                                      const Tensor& gweight, const Tensor& gbias) {
  for (const Tensor* t : {&gx, &gweight, &gbias}) check_out(*t, "layer_norm_backward");
  check_dtypes("layer_norm_backward", x_in, {&weight, &gy_in, &gx, &gweight, &gbias}, {&mean_in, &rstd_in});
  DeviceGuard guard(device_);
  Tensor x = contiguous(x_in), w = contiguous(weight), mean = contiguous(mean_in), rstd = contiguous(rstd_in),
         gy = contiguous(gy_in);
  dispatch_storage(x.dtype(), "layer_norm_backward",
                 [&]<class T>() { norm_backward<T>(*this, x, w, mean, rstd, gy, gx, gweight, gbias); });
}

void CudaBackend::rms_norm_backward(const Tensor& x_in, const Tensor& weight, const Tensor& rstd_in,
                                    const Tensor& gy_in, const Tensor& gx, const Tensor& gweight) {
  check_out(gx, "rms_norm_backward");
  check_out(gweight, "rms_norm_backward");
  check_dtypes("rms_norm_backward", x_in, {&weight, &gy_in, &gx, &gweight}, {&rstd_in});
  DeviceGuard guard(device_);
  Tensor x = contiguous(x_in), w = contiguous(weight), rstd = contiguous(rstd_in), gy = contiguous(gy_in);
  dispatch_storage(x.dtype(), "rms_norm_backward",
                 [&]<class T>() { norm_backward<T>(*this, x, w, Tensor(), rstd, gy, gx, gweight, Tensor()); });
}

// The kernels add_layer_norm fuses: binary(add) then layer_norm forward; layer_norm_backward then
// binary(add) backward (the bits the row's contract names).
void CudaBackend::add_layer_norm(const Tensor& x, const Tensor& r, const Tensor& weight, const Tensor& bias, double eps,
                                 const Tensor& s, const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  binary(BinaryOp::add, x, r, s);
  layer_norm(s, weight, bias, eps, y, mean, rstd);
}

void CudaBackend::add_layer_norm_backward(const Tensor& s, const Tensor& weight, const Tensor& mean,
                                          const Tensor& rstd, const Tensor& gy, const Tensor& gs, const Tensor& gx,
                                          const Tensor& gweight, const Tensor& gbias) {
  layer_norm_backward(s, weight, mean, rstd, gy, gx, gweight, gbias);
  binary(BinaryOp::add, gx, gs, gx);
}

}  // namespace remat::cuda
