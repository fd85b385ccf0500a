// The --device option of `remat train` and `remat sample`, and the lines that name devices (the
// run's report, `remat --version`).
//
//   Device d = select_device("train --device", "cuda:0");  // usable now, or an error saying why not
//   say("device: %s\n", device_summary(d).c_str());
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "remat/devices.h"

namespace remat::tools {

// Parses and readies the device: text that names no device is a UsageError (exit code 2); a
// device this build or machine cannot use (a build without CUDA, no CUDA device, an index past the
// last) is a remat::Error (exit code 1: the command line was right, the machine cannot run it).
Device select_device(const std::string& what, const std::string& text);

// "cuda:0: NVIDIA H200 (sm_90, 139.8 GiB), 130.1 GiB free of 139.8 GiB" or "cpu (16 threads)".
std::string device_summary(Device device);
// {"name": "cuda:0", "description": ..., "free_bytes": ..., "total_bytes": ...}; the CPU's has the
// name and description only.
nlohmann::json device_json(Device device);

// What `remat --version` prints: the version, then the compiled backends and the devices found,
// e.g. "backends: cpu, cuda (no CUDA device: no NVIDIA driver)".
std::string version_text();

}  // namespace remat::tools
