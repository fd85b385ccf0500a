// Kernels not yet written for CUDA: supports() answers false for them, so the dispatcher runs
// them on the CPU; calling them directly is a remat::Error.
#include "tensor/cuda/cuda_internal.h"

namespace remat::cuda {

#define REMAT_PENDING(name) throw Error("cuda backend: " #name " is not implemented yet (it runs on the CPU)")

void CudaBackend::conv2d(const Tensor&, const Tensor&, const Tensor&, const Conv2dGeometry&, const Tensor&) { REMAT_PENDING(conv2d); }
void CudaBackend::conv2d_backward_input(const Tensor&, const Tensor&, const Conv2dGeometry&, const Tensor&) { REMAT_PENDING(conv2d_backward_input); }
void CudaBackend::conv2d_backward_weight(const Tensor&, const Tensor&, const Conv2dGeometry&, const Tensor&, const Tensor&) { REMAT_PENDING(conv2d_backward_weight); }
void CudaBackend::max_pool2d(const Tensor&, const Pool2dGeometry&, const Tensor&, const Tensor&) { REMAT_PENDING(max_pool2d); }
void CudaBackend::max_pool2d_backward(const Tensor&, const Tensor&, const Tensor&) { REMAT_PENDING(max_pool2d_backward); }
void CudaBackend::avg_pool2d(const Tensor&, const Pool2dGeometry&, const Tensor&) { REMAT_PENDING(avg_pool2d); }
void CudaBackend::avg_pool2d_backward(const Tensor&, const Pool2dGeometry&, const Tensor&) { REMAT_PENDING(avg_pool2d_backward); }
void CudaBackend::adaptive_avg_pool2d(const Tensor&, const Tensor&) { REMAT_PENDING(adaptive_avg_pool2d); }
void CudaBackend::adaptive_avg_pool2d_backward(const Tensor&, const Tensor&) { REMAT_PENDING(adaptive_avg_pool2d_backward); }
void CudaBackend::batch_norm_statistics(const Tensor&, const Tensor&, const Tensor&) { REMAT_PENDING(batch_norm_statistics); }
void CudaBackend::batch_norm_apply(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) { REMAT_PENDING(batch_norm_apply); }
void CudaBackend::batch_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool, const Tensor&, const Tensor&, const Tensor&) { REMAT_PENDING(batch_norm_backward); }

}  // namespace remat::cuda
