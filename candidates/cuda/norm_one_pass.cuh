// What the candidates norm_backward.cu (the one-pass layer- and RMS-norm backward) and
// residual_norm.cu (the residual add fused into layer norm) share: the row shape of a tensor, and
// the one-pass norm backward kernel.
#pragma once

#include <utility>

#include "candidates/cuda/candidates.h"
#include "tensor/cuda/device_common.cuh"
#include "tensor/cuda/half.cuh"

namespace remat::candidates::cuda {

using namespace remat::cuda;  // the device helpers (device_common.cuh, half.cuh)

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
// keeps the sums of columns t, t + blockDim.x, ... (at most kFusedColumns) in registers. S is
// the storage type, T its arithmetic type (as in src/tensor/cuda/rows.cu): 16-bit elements are
// widened on load and gx
// rounded once (with gs, the norm's gradient is rounded before gs is added, as the unfused kernels
// round it).
template <class S>
__global__ void norm_backward_fused_kernel(const S* x, const S* w, const Compute<S>* mean, const Compute<S>* rstd,
                                           const S* gy, const S* gs, S* gx, int64_t rows, int64_t cols,
                                           Acc<Compute<S>>* partial_w, Acc<Compute<S>>* partial_b) {
  using T = Compute<S>;
  __shared__ Acc<T> shared[32];
  const Acc<T> n = static_cast<Acc<T>>(cols);
  const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    Acc<T> sum_w[kFusedColumns], sum_b[kFusedColumns];
#pragma unroll
    for (int k = 0; k < kFusedColumns; ++k) sum_w[k] = sum_b[k] = 0;
    const int64_t r1 = min(rows, (chunk + 1) * kChunkRows);
    for (int64_t r = chunk * kChunkRows; r < r1; ++r) {
      const S* xr = x + r * cols;
      const S* gr = gy + r * cols;
      S* out = gx + r * cols;
      const T mu = mean ? mean[r] : T(0), rs = rstd[r];
      Acc<T> sg = 0, sgx = 0;
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        const T g = w ? convert<T>(gr[c]) * convert<T>(w[c]) : convert<T>(gr[c]);
        sg += static_cast<Acc<T>>(g);
        sgx += static_cast<Acc<T>>(g * ((convert<T>(xr[c]) - mu) * rs));
      }
      sg = block_sum(sg, shared);
      sgx = block_sum(sgx, shared);
      const T mg = mean ? static_cast<T>(sg / n) : T(0);
      const T mgx = static_cast<T>(sgx / n);
#pragma unroll
      for (int k = 0; k < kFusedColumns; ++k) {
        const int64_t c = threadIdx.x + int64_t(k) * blockDim.x;
        if (c >= cols) break;
        const T g = w ? convert<T>(gr[c]) * convert<T>(w[c]) : convert<T>(gr[c]);
        const T norm_grad = rs * (g - mg - (convert<T>(xr[c]) - mu) * rs * mgx);
        // with gs: the norm's gradient rounded to S, then the rounded sum (convert is the identity for f32, f64)
        out[c] = gs ? convert<S>(add_rounded(convert<T>(convert<S>(norm_grad)), convert<T>(gs[r * cols + c])))
                    : convert<S>(norm_grad);
        sum_w[k] += static_cast<Acc<T>>(convert<T>(gr[c]) * ((convert<T>(xr[c]) - mu) * rs));
        sum_b[k] += static_cast<Acc<T>>(convert<T>(gr[c]));
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
void launch_one_pass(CudaBackend& be, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                     const Tensor& gy, const Tensor& gs, const Tensor& gx, const Tensor& gweight, const Tensor& gbias,
                     int64_t rows, int64_t cols, const char* kernel_name, const char* sums_name) {
  using C = Compute<T>;
  cudaStream_t stream = be.stream();
  const int64_t chunks = chunk_count(rows);
  Tensor partial_w, partial_b;
  if (gweight.defined()) partial_w = be.scratch({chunks, cols}, DType::f64);  // Acc<C> is double
  if (gbias.defined()) partial_b = be.scratch({chunks, cols}, DType::f64);
  norm_backward_fused_kernel<T><<<grid_for(chunks, 1), kThreads, 0, stream>>>(
      ptr<T>(x), ptr<T>(w), ptr<C>(mean), ptr<C>(rstd), ptr<T>(gy), ptr<T>(gs), ptr<T>(gx), rows, cols,
      ptr<Acc<C>>(partial_w), ptr<Acc<C>>(partial_b));
  check_launch(kernel_name);
  for (const auto& [g, partial] : {std::pair{&gweight, &partial_w}, std::pair{&gbias, &partial_b}}) {
    if (!g->defined()) continue;
    combine_partials<Acc<C>, T, C>
        <<<grid_for(cols), kThreads, 0, stream>>>(ptr<Acc<C>>(*partial), chunks, cols, Acc<C>(1), ptr<T>(*g));
    check_launch(sums_name);
  }
}

}  // namespace remat::candidates::cuda
