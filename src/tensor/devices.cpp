// Which devices this build and machine offer (remat/devices.h). The CUDA side forwards to the
// backend's internal interface (tensor/cuda/cuda_backend.h), which asks the driver lazily: nothing
// here runs at load time, so the library loads and runs on the CPU where no driver is installed.
#include "remat/devices.h"

#include <unistd.h>

#include <charconv>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <mutex>

#include "remat/backend.h"
#include "remat/error.h"
#if REMAT_WITH_CUDA
#include "tensor/cuda/cuda_backend.h"
#endif

namespace remat {

namespace {

constexpr const char* kNoCudaBuild = "this remat was built without CUDA (REMAT_WITH_CUDA=OFF)";

#if REMAT_WITH_CUDA
std::mutex& registration_mutex() {
  static std::mutex m;
  return m;
}
#endif

// The first number in `path` (a /proc or /sys file), if it has one ("max" and unreadable files: none).
std::optional<size_t> read_number(const char* path, const char* key = nullptr) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (key != nullptr && line.rfind(key, 0) != 0) continue;
    const size_t digit = line.find_first_of("0123456789");
    if (digit == std::string::npos) return std::nullopt;
    size_t value = 0;
    const char* first = line.data() + digit;
    const auto [end, ec] = std::from_chars(first, line.data() + line.size(), value);
    if (ec != std::errc()) return std::nullopt;
    if (key != nullptr && std::string_view(end, line.data() + line.size()).find("kB") != std::string_view::npos)
      value = value > SIZE_MAX / 1024 ? SIZE_MAX : value * 1024;
    return value;
  }
  return std::nullopt;
}

// The host's memory: MemAvailable and physical memory, bounded by the limit and room of the cgroup
// mounted at /sys/fs/cgroup (a container's own).
DeviceMemory host_memory() {
  DeviceMemory m;
  const long page = sysconf(_SC_PAGESIZE), physical = sysconf(_SC_PHYS_PAGES), free_pages = sysconf(_SC_AVPHYS_PAGES);
  if (page > 0 && physical >= 0) m.total_bytes = static_cast<size_t>(physical) * static_cast<size_t>(page);
  const std::optional<size_t> available = read_number("/proc/meminfo", "MemAvailable:");
  if (available)
    m.free_bytes = *available;
  else if (page > 0 && free_pages >= 0)
    m.free_bytes = static_cast<size_t>(free_pages) * static_cast<size_t>(page);
  m.limited_by = "the host's available memory";
  // cgroup v2, else v1 (whose "no limit" is a huge number, above physical memory)
  std::optional<size_t> limit = read_number("/sys/fs/cgroup/memory.max");
  std::optional<size_t> usage = read_number("/sys/fs/cgroup/memory.current");
  if (!limit) {
    limit = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    usage = read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes");
  }
  if (limit && *limit < m.total_bytes) {
    m.total_bytes = *limit;
    const size_t room = usage && *usage < *limit ? *limit - *usage : 0;
    if (room < m.free_bytes) {
      m.free_bytes = room;
      m.limited_by = "the cgroup's memory limit";
    }
  }
  return m;
}

// A CUDA device that exists: else a remat::Error saying why not.
void check_cuda_index(int index) {
#if REMAT_WITH_CUDA
  const int n = cuda::device_count();
  REMAT_CHECK(n > 0, "no CUDA device: ", cuda::unavailable_reason());
  REMAT_CHECK(index >= 0 && index < n, "cuda:", index, " does not exist: ", n, " CUDA device", n == 1 ? "" : "s",
              " found (cuda:0", n == 1 ? "" : detail::concat(" to cuda:", n - 1), ")");
#else
  (void)index;
  throw Error(kNoCudaBuild);
#endif
}

// The device must have its backend (CPU: always).
void check_usable(const char* what, Device device) {
  REMAT_CHECK(has_backend(device), what, ": ", device_name(device), " is not in use; call remat::use_device(",
              device_name(device), ") first");
}

}  // namespace

std::vector<std::string> compiled_backends() {
#if REMAT_WITH_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

int device_count(DeviceType type) {
  switch (type) {
    case DeviceType::cpu:
      return 1;
    case DeviceType::cuda:
#if REMAT_WITH_CUDA
      return cuda::device_count();
#else
      return 0;
#endif
    case DeviceType::emulated:
      return 0;
  }
  return 0;
}

std::string unavailable_reason(DeviceType type) {
  switch (type) {
    case DeviceType::cpu:
      return "";
    case DeviceType::cuda:
#if REMAT_WITH_CUDA
      return cuda::device_count() > 0 ? "" : cuda::unavailable_reason();
#else
      return kNoCudaBuild;
#endif
    case DeviceType::emulated:
      return "the emulated device is registered by tests, not by the library";
  }
  return "";
}

Device parse_device(const std::string& text) {
  const auto bad = [&] {
    return Error(detail::concat("\"", text, "\" is not a device: expected cpu, cuda or cuda:N (N = 0, 1, ...)"));
  };
  if (text == "cpu") return kCpu;
  if (text == "cuda") return Device{DeviceType::cuda, 0};
  const std::string prefix = "cuda:";
  if (text.size() <= prefix.size() || text.compare(0, prefix.size(), prefix) != 0) throw bad();
  int64_t index = 0;
  for (size_t i = prefix.size(); i < text.size(); ++i) {
    const char c = text[i];
    if (c < '0' || c > '9') throw bad();
    index = index * 10 + (c - '0');
    if (index > 1'000'000) throw bad();
  }
  return Device{DeviceType::cuda, static_cast<int>(index)};
}

void use_device(Device device) {
  switch (device.type) {
    case DeviceType::cpu:
      return;
    case DeviceType::emulated:
      check_usable("use_device", device);
      return;
    case DeviceType::cuda:
      break;
  }
  check_cuda_index(device.index);
#if REMAT_WITH_CUDA
  std::lock_guard<std::mutex> lock(registration_mutex());
  if (!has_backend(device)) register_backend(device, &cuda::backend_for(device.index));
#endif
}

std::string describe_device(Device device) {
  if (device.type == DeviceType::cpu) return detail::concat("cpu (", num_threads(), num_threads() == 1 ? " thread)" : " threads)");
  check_usable("describe_device", device);
#if REMAT_WITH_CUDA
  if (device.type == DeviceType::cuda) return device_name(device) + ": " + cuda::describe(device.index);
#endif
  return device_name(device);
}

DeviceMemory device_memory(Device device) {
  if (device.type == DeviceType::cpu) return host_memory();
  check_usable("device_memory", device);
#if REMAT_WITH_CUDA
  if (device.type == DeviceType::cuda) {
    const cuda::MemoryInfo m = cuda::device_memory(device.index);
    return {m.free_bytes, m.total_bytes, "the device's free memory"};
  }
#endif
  return {};
}

void set_allow_tf32(bool allow) {
#if REMAT_WITH_CUDA
  cuda::set_allow_tf32(allow);
#else
  (void)allow;
#endif
}

bool allow_tf32() {
#if REMAT_WITH_CUDA
  return cuda::allow_tf32();
#else
  return false;
#endif
}

}  // namespace remat

namespace remat {

std::vector<std::string> fast_path_names() {
#if REMAT_WITH_CUDA
  return cuda::fast_path_names();
#else
  return {};
#endif
}

std::vector<std::string> fast_paths_on() {
#if REMAT_WITH_CUDA
  return cuda::fast_paths_on();
#else
  return {};
#endif
}

std::vector<KernelTime> take_kernel_profile(Device device) {
#if REMAT_WITH_CUDA
  if (device.type == DeviceType::cuda) return cuda::take_kernel_profile(device.index);
#else
  (void)device;
#endif
  return {};
}

}  // namespace remat
