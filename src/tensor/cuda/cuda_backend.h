// Internal: the CUDA backend's entry points for the rest of the library (the command line, the
// device registry, tests). Compiled only with REMAT_WITH_CUDA; includes no CUDA header, so code
// built by the host compiler alone can call it. Everything here is safe on a machine without a
// GPU or a driver: device_count() is then 0 and unavailable_reason() says why.
//
//   if (remat::cuda::device_count() > 0) {
//     remat::register_backend({remat::DeviceType::cuda, 0}, &remat::cuda::backend_for(0));
//     std::cout << remat::cuda::describe(0) << "\n";   // "NVIDIA H200 (sm_90, 139.8 GiB)"
//   } else {
//     std::cout << "no GPU: " << remat::cuda::unavailable_reason() << "\n";
//   }
//
// Determinism on the GPU is explained in the Note at the top of cuda_backend.cpp.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "remat/backend.h"
#include "remat/devices.h"

namespace remat::cuda {

// The number of CUDA devices; 0 when there is no driver or no device. Never throws or aborts.
int device_count() noexcept;
// Why device_count() is 0 (the CUDA runtime's message); "" when a device is present.
std::string unavailable_reason();
// The backend of cuda:index, created on first use and kept until the process exits (it is not
// registered: the caller registers it). A remat::Error if index is not a device.
Backend& backend_for(int index);
// "NVIDIA H200 (sm_90, 139.8 GiB)"; a remat::Error if index is not a device.
std::string describe(int index);

struct MemoryInfo {
  size_t free_bytes = 0, total_bytes = 0;
};
// The device's free and total memory as the driver reports them (cudaMemGetInfo).
MemoryInfo device_memory(int index);

// Paths that have not yet passed a device check, each behind a name of the environment variable
// REMAT_CUDA_FAST (docs/backends.md, "Switches"): every name, and the names on in this process.
std::vector<std::string> fast_path_names();
std::vector<std::string> fast_paths_on();
// The switches a REMAT_CUDA_FAST value names, as a bit set ("" none, "all" every one); a
// remat::Error names an unknown name.
uint32_t parse_fast_paths(const std::string& text);

// The kernel profile of cuda:index while the environment variable REMAT_CUDA_PROFILE is 1
// (remat::take_kernel_profile). Empty when profiling is off or the backend was never used.
bool profiling();
std::vector<KernelTime> take_kernel_profile(int index);

// Whether float32 GEMMs and convolutions may use TF32 tensor cores (10-bit mantissa products,
// about 1e-3 relative error). Off by default: float32 results are then computed in float32.
// Process-wide; set it before a training step, not during one (a recomputation must run the
// same kernels as its first run).
void set_allow_tf32(bool allow);
bool allow_tf32();

}  // namespace remat::cuda
