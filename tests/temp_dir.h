// A fresh, empty directory under the system's temporary directory for one test (offload: files).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

namespace remat::testing {

// <tmp>/remat-test-NAME-PID, emptied if it was there.
inline std::string fresh_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("remat-test-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace remat::testing
