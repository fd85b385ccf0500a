// Kernels not yet written for CUDA: supports() answers false for them, so the dispatcher runs
// them on the CPU; calling them directly is a remat::Error.
#include "tensor/cuda/cuda_internal.h"

namespace remat::cuda {

#define REMAT_PENDING(name) throw Error("cuda backend: " #name " is not implemented yet (it runs on the CPU)")

void CudaBackend::conv2d(const Tensor&, const Tensor&, const Tensor&, const Conv2dGeometry&, const Tensor&) { REMAT_PENDING(conv2d); }
void CudaBackend::conv2d_backward_input(const Tensor&, const Tensor&, const Conv2dGeometry&, const Tensor&) { REMAT_PENDING(conv2d_backward_input); }
void CudaBackend::conv2d_backward_weight(const Tensor&, const Tensor&, const Conv2dGeometry&, const Tensor&, const Tensor&) { REMAT_PENDING(conv2d_backward_weight); }

}  // namespace remat::cuda
