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

#include "remat/backend.h"
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

// Makes `device` usable: for CUDA, registers its backend (register_backend) on first use, with
// default_backend_options(). The CPU needs nothing. A remat::Error (see the top of this file)
// when it cannot be used.
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

// ---- backend options (BackendOptions in remat/backend.h): a value chosen with the device.
// Their names, as the command line (--backend-options) and REMAT_BACKEND_OPTIONS write them:
// async, stream_ordered_allocator, copy_stream, sixteen_bit, tf32, profile.
//
//   remat::BackendOptions o = remat::parse_backend_options("tf32,async");
//   remat::use_device(gpu, o);      // the backend of cuda:0 runs with them for the whole process
//   std::printf("%s\n", remat::describe_backend_options(gpu).text.c_str());
//   // "cuda:0 backend options: async (not device-checked), tf32"
//
// A comma-separated list of names, each turning an option on; "-NAME" turns one off, "none" all
// of them; empty text changes nothing. Applied to `base`. An unknown name is a remat::Error
// listing the known ones.
BackendOptions parse_backend_options(const std::string& text, BackendOptions base = {});
// The names of the options on, comma-separated ("none" when none is).
std::string backend_options_text(const BackendOptions& options);
// The defaults use_device(device) takes: REMAT_BACKEND_OPTIONS parsed once per process (the one
// place the library reads the environment about backends), all off without it. A bad value is the
// remat::Error of parse_backend_options, at every call.
BackendOptions default_backend_options();

// Makes `device` usable with `options` (use_device(device) above takes default_backend_options()
// for a device that has options; the CPU has none). Options are chosen once per device: a device
// already in use with other options is a remat::Error naming both (a test that needs another value
// registers a backend of its own), and so is an option the device's backend does not have.
void use_device(Device device, const BackendOptions& options);

// The options in force on a device that is in use, for a run's report: each option's name, whether
// it is on, and whether its path has passed a device check in this build; `text` is one line
// ("cuda:0 backend options: none (the device-checked default path)", or the options on, each
// unchecked one marked). The CPU's list is empty ("cpu backend options: none (the CPU has none)").
struct BackendOptionState {
  std::string name;          // "async"
  bool on = false;
  bool device_checked = false;
  std::string what;          // one line: what the option changes
};
struct BackendOptionsReport {
  std::string device;        // "cuda:0"
  std::vector<BackendOptionState> options;
  std::string text;
};
BackendOptionsReport describe_backend_options(Device device);

// Device time per kernel of a CUDA device in use with the backend option `profile`: per kernel
// name, its launches and seconds since the last call (which waits for the device). Empty without
// the option, for other devices and in a build without CUDA.
struct KernelTime {
  std::string name;
  uint64_t launches = 0;
  double seconds = 0;
};
std::vector<KernelTime> take_kernel_profile(Device device);

}  // namespace remat
