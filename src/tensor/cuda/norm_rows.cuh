// What the row kernels of layer norm (rows.cu) and of the residual add fused into it
// (residual_norm.cu) share: the row shape of a tensor, and the one-pass norm backward.
#pragma once

#include <utility>

#include "tensor/cuda/device_common.cuh"

namespace remat::cuda {

inline int64_t row_length(const Tensor& x) { return x.dim() == 0 ? 1 : x.shape().back(); }
inline int64_t row_count(const Tensor& x, int64_t cols) { return cols == 0 ? 0 : x.numel() / cols; }

// Columns one thread holds in the one-pass kernels: rows of up to 2048 with kThreads threads.
inline constexpr int kFusedColumns = 8;
inline bool fits_one_pass(int64_t cols) { return cols <= int64_t{kThreads} * kFusedColumns; }

// a + b rounded on its own (nvcc cannot contract it with a product before it)
__device__ inline float add_rounded(float a, float b) { return __fadd_rn(a, b); }
__device__ inline double add_rounded(double a, double b) { return __dadd_rn(a, b); }

// The norm backward in one pass over x and gy (mean null for RMS norm): gx = rstd * (g - mean(g)
// - xhat * mean(g * xhat)), g = gy * w, xhat = (x - mean) * rstd, plus gs where gs is given (the
// residual's gradient, added with add_rounded); and the per-chunk column sums of the parameter
// gradients (gy * xhat into partial_w, gy into partial_b, each may be null), the sums of
// column_partials in its order. A block per chunk of kChunkRows rows walks them in order; thread t
// keeps the sums of columns t, t + blockDim.x, ... (at most kFusedColumns) in registers.
template <class T>
__global__ void norm_backward_fused_kernel(const T* x, const T* w, const T* mean, const T* rstd, const T* gy,
                                           const T* gs, T* gx, int64_t rows, int64_t cols, Acc<T>* partial_w,
                                           Acc<T>* partial_b) {
  __shared__ Acc<T> shared[32];
  const Acc<T> n = static_cast<Acc<T>>(cols);
  const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    Acc<T> sum_w[kFusedColumns], sum_b[kFusedColumns];
#pragma unroll
    for (int k = 0; k < kFusedColumns; ++k) sum_w[k] = sum_b[k] = 0;
    const int64_t r1 = min(rows, (chunk + 1) * kChunkRows);
    for (int64_t r = chunk * kChunkRows; r < r1; ++r) {
      const T* xr = x + r * cols;
      const T* gr = gy + r * cols;
      T* out = gx + r * cols;
      const T mu = mean ? mean[r] : T(0), rs = rstd[r];
      Acc<T> sg = 0, sgx = 0;
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        const T g = w ? gr[c] * w[c] : gr[c];
        sg += static_cast<Acc<T>>(g);
        sgx += static_cast<Acc<T>>(g * ((xr[c] - mu) * rs));
      }
      sg = block_sum(sg, shared);
      sgx = block_sum(sgx, shared);
      const T mg = mean ? static_cast<T>(sg / n) : T(0);
      const T mgx = static_cast<T>(sgx / n);
#pragma unroll
      for (int k = 0; k < kFusedColumns; ++k) {
        const int64_t c = threadIdx.x + int64_t(k) * blockDim.x;
        if (c >= cols) break;
        const T g = w ? gr[c] * w[c] : gr[c];
        const T norm_grad = rs * (g - mg - (xr[c] - mu) * rs * mgx);
        out[c] = gs ? add_rounded(norm_grad, gs[r * cols + c]) : norm_grad;
        sum_w[k] += static_cast<Acc<T>>(gr[c] * ((xr[c] - mu) * rs));
        sum_b[k] += static_cast<Acc<T>>(gr[c]);
      }
    }
#pragma unroll
    for (int k = 0; k < kFusedColumns; ++k) {
      const int64_t c = threadIdx.x + int64_t(k) * blockDim.x;
      if (c >= cols) break;
      if (partial_w) partial_w[chunk * cols + c] = sum_w[k];
      if (partial_b) partial_b[chunk * cols + c] = sum_b[k];
    }
  }
}

// Launches the one-pass kernel over contiguous operands (gs may be undefined) and adds the chunks'
// parameter sums in order (combine_partials); rows > 0 and fits_one_pass(cols). The names are the
// launches' in the counters and the profile.
template <class T>
void norm_backward_one_pass(CudaBackend& be, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                            const Tensor& gy, const Tensor& gs, const Tensor& gx, const Tensor& gweight,
                            const Tensor& gbias, int64_t rows, int64_t cols, const char* kernel_name,
                            const char* sums_name) {
  cudaStream_t stream = be.stream();
  const int64_t chunks = chunk_count(rows);
  Tensor partial_w, partial_b;
  if (gweight.defined()) partial_w = be.scratch({chunks, cols}, DType::f64);  // Acc<T> is double
  if (gbias.defined()) partial_b = be.scratch({chunks, cols}, DType::f64);
  norm_backward_fused_kernel<T><<<grid_for(chunks, 1), kThreads, 0, stream>>>(
      ptr<T>(x), ptr<T>(w), ptr<T>(mean), ptr<T>(rstd), ptr<T>(gy), ptr<T>(gs), ptr<T>(gx), rows, cols,
      ptr<Acc<T>>(partial_w), ptr<Acc<T>>(partial_b));
  check_launch(kernel_name);
  for (const auto& [g, partial] : {std::pair{&gweight, &partial_w}, std::pair{&gbias, &partial_b}}) {
    if (!g->defined()) continue;
    combine_partials<Acc<T>, T>
        <<<grid_for(cols), kThreads, 0, stream>>>(ptr<Acc<T>>(*partial), chunks, cols, Acc<T>(1), ptr<T>(*g));
    check_launch(sums_name);
  }
}

}  // namespace remat::cuda
