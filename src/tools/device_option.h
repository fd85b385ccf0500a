// The --device and --backend-options options of `remat train` and `remat sample`, and the lines
// that name devices and their backend options (the run's report and its JSON, `remat --version`).
//
//   Device d = select_device("train --device", "cuda:0", "tf32");  // usable now, or an error saying why not
//   check_device_dtype("train --dtype", d, DType::bf16);           // or the reason the device holds none
//   say("device: %s\n", device_summary(d).c_str());
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "remat/devices.h"
#include "remat/tensor.h"

namespace remat::tools {

// Parses and readies the device: text that names no device is a UsageError (exit code 2); a
// device this build or machine cannot use (a build without CUDA, no CUDA device, an index past the
// last) is a remat::Error (exit code 1: the command line was right, the machine cannot run it).
// `options` is the --backend-options text (remat/devices.h: names, -NAME, none) applied to the
// defaults (REMAT_BACKEND_OPTIONS); a name that is no option is a UsageError, and so is an option
// given for the CPU, which has none.
Device select_device(const std::string& what, const std::string& text, const std::string& options = "");

// A remat::Error (exit code 1) unless `device` holds tensors of `dtype`, naming why not in the
// backend's words (Backend::why_not_held: bf16 on CUDA without the backend option sixteen_bit, "bf16
// on CUDA has not passed a device check in this build").
void check_device_dtype(const std::string& what, Device device, DType dtype);

// "cuda:0: NVIDIA H200 (sm_90, 139.8 GiB), 130.1 GiB free of 139.8 GiB; backend options: none (the
// device-checked default path)" or "cpu (16 threads)".
std::string device_summary(Device device);
// {"name": "cuda:0", "description": ..., "free_bytes": ..., "total_bytes": ..., "backend_options":
// {"text": ..., "options": [{"name": "async", "on": false, "device_checked": false}, ...]}}; the
// CPU's has the name and description only (it has no options).
nlohmann::json device_json(Device device);
// The "backend_options" object of device_json (remat::describe_backend_options as JSON).
nlohmann::json backend_options_json(Device device);

// What `remat --version` prints: the version, then the compiled backends and the devices found,
// e.g. "backends: cpu, cuda (no CUDA device: no NVIDIA driver)".
std::string version_text();

}  // namespace remat::tools
