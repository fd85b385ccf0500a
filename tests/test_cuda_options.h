// What the CUDA tests share about backend options: cuda:0 served, for a scope, by a backend of its
// own with other options (BackendOptions), so that one test process checks the default path and
// each option beside it, with no environment variable.
//
//   REQUIRE_GPU();
//   {
//     CudaWithOptions tf32({.tf32 = true});   // cuda:0 now computes float32 products on TF32 cores
//     Tensor y = matmul(a.to(kGpu), b.to(kGpu));
//   }                                          // back to the process's backend (its default options)
#pragma once

#include <memory>

#include "remat/backend.h"
#include "remat/devices.h"
#include "tensor/cuda/cuda_backend.h"

namespace remat::testing {

// Registers, for its life, a backend of cuda:0 with `options` in place of the process's (the
// caller has made cuda:0 usable: use_device); tensors made on the device meanwhile must be gone
// before it ends. Not nested.
class CudaWithOptions {
 public:
  explicit CudaWithOptions(const BackendOptions& options)
      : process_(&cuda::backend_for(0, backend(device()).options())), own_(cuda::make_backend(0, options)) {
    register_backend(device(), own_.get());
  }
  ~CudaWithOptions() { register_backend(device(), process_); }
  CudaWithOptions(const CudaWithOptions&) = delete;
  CudaWithOptions& operator=(const CudaWithOptions&) = delete;
  static Device device() { return {DeviceType::cuda, 0}; }

 private:
  Backend* process_;  // backend_for's, registered by use_device
  std::unique_ptr<Backend> own_;
};

}  // namespace remat::testing
