// Candidate: the layer_norm_backward and rms_norm_backward rows in one pass over x and gy: the
// input gradient and the parameter gradients' per-chunk column sums in one kernel
// (norm_one_pass.cuh), then the chunks added in order. The same sums in the same order as the
// library's kernels (src/tensor/cuda/rows.cu: norm_backward_kernel, then column_partials and
// combine_partials per parameter), so the harness asks for their bits. Rows of at most 2048
// columns, gx defined.
#include "candidates/cuda/norm_one_pass.cuh"

namespace remat::candidates::cuda {

bool norm_backward_one_pass(CudaBackend& be, const Tensor& x_in, const Tensor& weight, const Tensor& mean_in,
                            const Tensor& rstd_in, const Tensor& gy_in, const Tensor& gx, const Tensor& gweight,
                            const Tensor& gbias) {
  const int64_t cols = row_length(x_in), rows = row_count(x_in, cols);
  if (!gx.defined() || !fits_one_pass(cols) || rows == 0) return false;
  DeviceGuard guard(be.device());
  Tensor x = be.contiguous(x_in), w = be.contiguous(weight), mean = be.contiguous(mean_in),
         rstd = be.contiguous(rstd_in), gy = be.contiguous(gy_in);
  dispatch_storage(x.dtype(), "norm backward (one pass)", [&]<class T>() {
    launch_one_pass<T>(be, x, w, mean, rstd, gy, Tensor(), gx, gweight, gbias, rows, cols,
                       "norm backward (one pass)", "norm backward (parameter sums)");
  });
  return true;
}

}  // namespace remat::candidates::cuda
