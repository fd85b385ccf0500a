// remat/devices.h - which devices this build and this machine offer, and choosing one.
//
// The CPU is always there. A build with REMAT_WITH_CUDA=ON (the default where CMake finds the CUDA
// toolkit) also has the CUDA backend; whether a GPU can be used is decided at run time, when the
// NVIDIA driver is asked for the first time. Nothing here needs the driver library to load: on a
// machine without one, device_count(cuda) is 0 and unavailable_reason says why.
//
//   for (const std::string& b : remat::compiled_backends()) std::printf("%s ", b.c_str());
//   remat::Device gpu = remat::parse_device("cuda:0");   // "cpu", "cuda" (= cuda:0), "cuda:N"
//   remat::use_device(gpu);          // registers the CUDA backend, or a remat::Error saying why not
//   model.to(gpu);
//   std::printf("%s\n", remat::describe_device(gpu).c_str());  // "cuda:0: NVIDIA H200 (sm_90, ...)"
//
// use_device is a remat::Error naming the reason when the device cannot be used: a build without
// CUDA ("this remat was built without CUDA (REMAT_WITH_CUDA=OFF)"), no usable device ("no CUDA
// device: <reason>"), or an index past the last device. It is idempotent and leaves nothing
// registered when it fails. DeviceType::emulated (the test device) is not offered here: tests
// register it themselves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "remat/tensor.h"

namespace remat {

// The backends compiled into this library: {"cpu"} or {"cpu", "cuda"}.
std::vector<std::string> compiled_backends();

// Devices of this type present: 1 for the CPU; for CUDA the GPUs the driver reports (0 in a build
// without CUDA, or without a driver or a device). Never throws.
int device_count(DeviceType type);

// Why device_count(type) is 0 ("" when it is not): the driver's error, or the build switch.
std::string unavailable_reason(DeviceType type);

// "cpu", "cuda" (cuda:0) or "cuda:N" (N a decimal index, no sign, no spaces). Any other text is a
// remat::Error quoting it. Does not check that the device exists (use_device does).
Device parse_device(const std::string& text);

// Makes `device` usable: for CUDA, registers its backend (register_backend) on first use. The CPU
// needs nothing. A remat::Error (see the top of this file) when it cannot be used.
void use_device(Device device);

// One line about the device: "cpu (16 threads)", "cuda:0: NVIDIA H200 (sm_90, 139.8 GiB)". The
// device must be usable (use_device).
std::string describe_device(Device device);

// The device's memory as its driver sees it: free and total bytes (for CUDA cudaMemGetInfo, other
// processes' use included; for the CPU the host's available memory (MemAvailable: free plus what
// the kernel can reclaim) and physical memory, each bounded by the process's cgroup, v2 or v1,
// when it has a memory limit: its room, limit minus usage, and the limit). `limited_by` says which
// bound the free bytes are. The device must be usable. remat's own counters for a device are
// remat::memory_stats(device).
struct DeviceMemory {
  size_t free_bytes = 0, total_bytes = 0;
  std::string limited_by;  // "the device's free memory", "the host's available memory", "the cgroup's memory limit"
};
DeviceMemory device_memory(Device device);

// Whether CUDA float32 GEMMs (and convolutions) may use TF32 tensor cores: about 10 bits of
// mantissa in the products, much faster. Off by default, so that float32 means float32 (results
// then differ from the CPU's only by summation order). Process-wide; set it before a training step,
// not during one (a recomputation must run the kernels its first run ran). No effect in a build
// without CUDA; allow_tf32() is then false.
void set_allow_tf32(bool allow);
bool allow_tf32();

// The CUDA backend's paths that have not yet passed a device check, each behind a switch named in
// the environment variable REMAT_CUDA_FAST (docs/backends.md, "Switches"): every name, and those
// on in this process (empty in a build without CUDA).
std::vector<std::string> fast_path_names();
std::vector<std::string> fast_paths_on();

// Device time per kernel of a CUDA device whose process runs with REMAT_CUDA_PROFILE=1: per
// kernel name, its launches and seconds since the last call (which waits for the device). Empty
// without profiling, for other devices and in a build without CUDA.
struct KernelTime {
  std::string name;
  uint64_t launches = 0;
  double seconds = 0;
};
std::vector<KernelTime> take_kernel_profile(Device device);

}  // namespace remat
