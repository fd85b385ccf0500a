// Internal: the CUDA backend's entry points for the rest of the library (the command line, the
// device registry, tests). Defined by src/tensor/cuda/ with REMAT_WITH_CUDA, and by
// src/tensor/devices.cpp (each saying there is no CUDA) without; includes no CUDA header, so code
// built by the host compiler alone can call it. Everything here is safe on a machine without a
// GPU or a driver: device_count() is then 0 and unavailable_reason() says why.
//
//   if (remat::cuda::device_count() > 0) {
//     remat::register_backend({remat::DeviceType::cuda, 0}, &remat::cuda::backend_for(0, {}));
//     std::cout << remat::cuda::describe(0) << "\n";   // "NVIDIA H200 (sm_90, 139.8 GiB)"
//   } else {
//     std::cout << "no GPU: " << remat::cuda::unavailable_reason() << "\n";
//   }
//
// Determinism on the GPU is explained in the Note at the top of cuda_backend.cpp.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "remat/backend.h"
#include "remat/devices.h"

namespace remat::cuda {

// The number of CUDA devices; 0 when there is no driver or no device. Never throws or aborts.
int device_count() noexcept;
// Why device_count() is 0 (the CUDA runtime's message); "" when a device is present.
std::string unavailable_reason();
// The backend of cuda:index, created with `options` on first use and kept until the process
// exits (it is not registered: the caller registers it). A remat::Error if index is not a device,
// or if its backend was made with other options (options are chosen with the device).
Backend& backend_for(int index, const BackendOptions& options);
// A backend of its own for cuda:index with `options`, for a test that compares options in one
// process; the caller registers it (in place of backend_for's) and keeps it alive meanwhile.
std::unique_ptr<Backend> make_backend(int index, const BackendOptions& options);
// "NVIDIA H200 (sm_90, 139.8 GiB)"; a remat::Error if index is not a device.
std::string describe(int index);

struct MemoryInfo {
  size_t free_bytes = 0, total_bytes = 0;
};
// The device's free and total memory as the driver reports them (cudaMemGetInfo).
MemoryInfo device_memory(int index);

// The kernel profile of cuda:index, whose backend runs with the option `profile`
// (remat::take_kernel_profile). Empty without it, or when the backend was never used.
std::vector<KernelTime> take_kernel_profile(int index);

}  // namespace remat::cuda
