// The residual add fused into layer norm, forward and backward (the add_layer_norm kernels of
// include/remat/backend.h), mirroring src/tensor/cpu/rows.cpp.
//
// Note [the residual norm kernels]. By default the kernels run as the kernels they fuse, already
// checked on a device: binary(add) then layer_norm forward; layer_norm_backward then binary(add)
// backward (the default path's bits, three and two or more launches). With
// REMAT_CUDA_FAST=residual_norm (not yet run on a GPU) each is one kernel plus the parameter sums:
// - forward: a block per row; thread t adds x + r at columns t, t + blockDim.x, ... (at most
//   kFusedColumns of them), writes s and keeps it in registers, then forms the row's mean and
//   centred sum of squares in the order of layer_norm's kernel (rows.cu) and writes y: its bits;
// - backward: the layer_norm switch's one-pass kernel (norm_rows.cuh), a block per chunk of
//   kChunkRows rows walked in order: gx = the norm's input gradient, rounded, plus gs (an
//   addition written with __fadd_rn / __dadd_rn, so that nvcc cannot contract it with the product
//   before it), and each thread's column sums of gy * xhat and gy over the chunk, in registers;
//   combine_partials adds the chunks in order, as the default path's parameter sums do.
// Rows longer than blockDim.x * kFusedColumns run the default path.
#include "tensor/cuda/norm_rows.cuh"

namespace remat::cuda {

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

bool fused_row(int64_t cols) { return fast(Fast::residual_norm) && fits_one_pass(cols); }

}  // namespace

void CudaBackend::add_layer_norm(const Tensor& x_in, const Tensor& r_in, const Tensor& weight, const Tensor& bias,
                                 double eps, const Tensor& s, const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  for (const Tensor* t : {&s, &y, &mean, &rstd})
    REMAT_ASSERT(t->is_contiguous(), "add_layer_norm: an output of shape ", shape_str(t->shape()), " is not contiguous");
  const int64_t cols = row_length(x_in), rows = row_count(x_in, cols);
  if (!fused_row(cols)) {
    binary(BinaryOp::add, x_in, r_in, s);
    layer_norm(s, weight, bias, eps, y, mean, rstd);
    return;
  }
  if (rows == 0) return;
  DeviceGuard guard(device_);
  Tensor x = contiguous(x_in), r = contiguous(r_in), w = contiguous(weight), b = contiguous(bias);
  dispatch_float(y.dtype(), "add_layer_norm", [&]<class T>() {
    add_layer_norm_kernel<T><<<grid_for(rows, 1), kThreads, 0, stream_>>>(
        ptr<T>(x), ptr<T>(r), ptr<T>(w), ptr<T>(b), eps, ptr<T>(s), ptr<T>(y), ptr<T>(mean), ptr<T>(rstd), rows, cols);
  });
  check_launch("add_layer_norm");
}

void CudaBackend::add_layer_norm_backward(const Tensor& s_in, const Tensor& weight, const Tensor& mean_in,
                                          const Tensor& rstd_in, const Tensor& gy_in, const Tensor& gs_in,
                                          const Tensor& gx, const Tensor& gweight, const Tensor& gbias) {
  for (const Tensor* t : {&gx, &gweight, &gbias})
    REMAT_ASSERT(!t->defined() || t->is_contiguous(), "add_layer_norm_backward: an output of shape ",
                 shape_str(t->shape()), " is not contiguous");
  const int64_t cols = row_length(s_in), rows = row_count(s_in, cols);
  if (!fused_row(cols) || rows == 0) {
    layer_norm_backward(s_in, weight, mean_in, rstd_in, gy_in, gx, gweight, gbias);
    binary(BinaryOp::add, gx, gs_in, gx);
    return;
  }
  DeviceGuard guard(device_);
  Tensor s = contiguous(s_in), w = contiguous(weight), mean = contiguous(mean_in), rstd = contiguous(rstd_in),
         gy = contiguous(gy_in), gs = contiguous(gs_in);
  dispatch_float(s.dtype(), "add_layer_norm_backward", [&]<class T>() {
    norm_backward_one_pass<T>(*this, s, w, mean, rstd, gy, gs, gx, gweight, gbias, rows, cols,
                              "add_layer_norm backward", "add_layer_norm backward (parameter sums)");
  });
}

}  // namespace remat::cuda
