// Internal: whether the CUDA backend digests values on the device (the recomputation check of
// values on a GPU; Note [recomputation check] in src/autodiff/digest.cpp). Off until a device
// check has passed the kernel (tests/test_cuda_digest.cpp, run by scripts/cuda-check): then
// values on the GPU are not checked, as before the kernel existed. REMAT_CUDA_FAST=digest in the
// environment (docs/backends.md, "Switches"), or set_device_digest(true), turns it on.
#pragma once

namespace remat::cuda {

bool device_digest();
void set_device_digest(bool on);

}  // namespace remat::cuda
