// Candidate: the residual add fused into layer norm (the add_layer_norm and add_layer_norm_backward
// rows of include/remat/backend.h), one kernel each way plus the parameter sums, for rows of at
// most 2048 columns, float32 and float64. The library runs the kernels the row fuses (binary(add)
// then layer_norm; layer_norm_backward then binary(add)), whose bits the row's contract names: the
// harness asks for them.
//
// Note [the residual norm kernels].
// - forward: a block per row; thread t adds x + r at columns t, t + blockDim.x, ... (at most
//   kFusedColumns of them), writes s and keeps it in registers, then forms the row's mean and
//   centred sum of squares in the order of layer_norm's kernel (src/tensor/cuda/rows.cu) and
//   writes y: its bits;
// - backward: the one-pass kernel (norm_one_pass.cuh), a block per chunk of kChunkRows rows walked
//   in order: gx = the norm's input gradient, rounded, plus gs (an addition written with __fadd_rn
//   / __dadd_rn, so that nvcc cannot contract it with the product before it), and each thread's
//   column sums of gy * xhat and gy over the chunk, in registers; combine_partials adds the chunks
//   in order, as the library's parameter sums do.
#include "candidates/cuda/norm_one_pass.cuh"

namespace remat::candidates::cuda {

namespace {

// s = x + r, y = (s - mean) * rstd * w + b, per row of cols <= blockDim.x * kFusedColumns.
template <class T>
__global__ void add_layer_norm_kernel(const T* x, const T* res, const T* w, const T* b, double eps, T* s, T* y,
                                      T* mean, T* rstd, int64_t rows, int64_t cols) {
  __shared__ Acc<T> shared[32];
  const Acc<T> n = static_cast<Acc<T>>(cols);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * cols;
    T v[kFusedColumns];
    Acc<T> sum = 0;
#pragma unroll
    for (int k = 0; k < kFusedColumns; ++k) {
      const int64_t c = threadIdx.x + int64_t(k) * blockDim.x;
      if (c >= cols) break;
      v[k] = x[base + c] + res[base + c];
      s[base + c] = v[k];
      sum += static_cast<Acc<T>>(v[k]);
    }
    const T mu = static_cast<T>(block_sum(sum, shared) / n);
    Acc<T> squares = 0;
#pragma unroll
    for (int k = 0; k < kFusedColumns; ++k) {
      const int64_t c = threadIdx.x + int64_t(k) * blockDim.x;
      if (c >= cols) break;
      const T d = v[k] - mu;
      squares += static_cast<Acc<T>>(d * d);
    }
    squares = block_sum(squares, shared);
    const T rs = static_cast<T>(Acc<T>(1) / sqrt(squares / n + static_cast<Acc<T>>(eps)));
    if (threadIdx.x == 0) {
      mean[r] = mu;
      rstd[r] = rs;
    }
#pragma unroll
    for (int k = 0; k < kFusedColumns; ++k) {
      const int64_t c = threadIdx.x + int64_t(k) * blockDim.x;
      if (c >= cols) break;
      T out = (v[k] - mu) * rs;
      if (w) out = out * w[c];
      if (b) out = out + b[c];
      y[base + c] = out;
    }
  }
}

}  // namespace

bool add_layer_norm_fused(CudaBackend& be, const Tensor& x_in, const Tensor& r_in, const Tensor& weight,
                          const Tensor& bias, double eps, const Tensor& s, const Tensor& y, const Tensor& mean,
                          const Tensor& rstd) {
  for (const Tensor* t : {&s, &y, &mean, &rstd})
    if (!t->is_contiguous()) return false;
  const int64_t cols = row_length(x_in), rows = row_count(x_in, cols);
  if (!fits_one_pass(cols) || rows == 0 || is_16bit_float(y.dtype())) return false;
  DeviceGuard guard(be.device());
  Tensor x = be.contiguous(x_in), r = be.contiguous(r_in), w = be.contiguous(weight), b = be.contiguous(bias);
  dispatch_float(y.dtype(), "add_layer_norm", [&]<class T>() {
    add_layer_norm_kernel<T><<<grid_for(rows, 1), kThreads, 0, be.stream()>>>(
        ptr<T>(x), ptr<T>(r), ptr<T>(w), ptr<T>(b), eps, ptr<T>(s), ptr<T>(y), ptr<T>(mean), ptr<T>(rstd), rows, cols);
  });
  check_launch("add_layer_norm (fused)");
  return true;
}

bool add_layer_norm_backward_fused(CudaBackend& be, const Tensor& s_in, const Tensor& weight, const Tensor& mean_in,
                                   const Tensor& rstd_in, const Tensor& gy_in, const Tensor& gs_in, const Tensor& gx,
                                   const Tensor& gweight, const Tensor& gbias) {
  for (const Tensor* t : {&gx, &gweight, &gbias})
    if (t->defined() && !t->is_contiguous()) return false;
  const int64_t cols = row_length(s_in), rows = row_count(s_in, cols);
  if (!fits_one_pass(cols) || rows == 0 || is_16bit_float(gx.dtype())) return false;
  DeviceGuard guard(be.device());
  Tensor s = be.contiguous(s_in), w = be.contiguous(weight), mean = be.contiguous(mean_in),
         rstd = be.contiguous(rstd_in), gy = be.contiguous(gy_in), gs = be.contiguous(gs_in);
  dispatch_float(s.dtype(), "add_layer_norm_backward", [&]<class T>() {
    launch_one_pass<T>(be, s, w, mean, rstd, gy, gs, gx, gweight, gbias, rows, cols,
                       "add_layer_norm backward (fused)", "add_layer_norm backward (parameter sums)");
  });
  return true;
}

}  // namespace remat::candidates::cuda
