// Which devices this build and machine offer (remat/devices.h), and the backend options chosen
// with a device. The CUDA side forwards to the backend's internal interface
// (tensor/cuda/cuda_backend.h), which asks the driver lazily: nothing here runs at load time, so
// the library loads and runs on the CPU where no driver is installed. A build without CUDA defines
// that interface here, each entry point saying the backend is not there: the one place this file
// depends on the build.
#include "remat/devices.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "remat/backend.h"
#include "remat/error.h"
#include "tensor/cuda/cuda_backend.h"

namespace remat {
namespace {
constexpr const char* kNoCudaBuild = "this remat was built without CUDA (REMAT_WITH_CUDA=OFF)";
}  // namespace
}  // namespace remat

#if REMAT_WITH_CUDA
namespace remat {
namespace {
constexpr bool kCudaBuilt = true;
}  // namespace
}  // namespace remat
#else
namespace remat {
namespace {
constexpr bool kCudaBuilt = false;
}  // namespace
}  // namespace remat
namespace remat::cuda {
int device_count() noexcept { return 0; }
std::string unavailable_reason() { return kNoCudaBuild; }
Backend& backend_for(int, const BackendOptions&) { throw Error(kNoCudaBuild); }
std::unique_ptr<Backend> make_backend(int, const BackendOptions&) { throw Error(kNoCudaBuild); }
std::string describe(int) { throw Error(kNoCudaBuild); }
MemoryInfo device_memory(int) { throw Error(kNoCudaBuild); }
std::vector<KernelTime> take_kernel_profile(int) { return {}; }
}  // namespace remat::cuda
#endif

namespace remat {

namespace {

std::mutex& registration_mutex() {
  static std::mutex m;
  return m;
}

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
  REMAT_CHECK(kCudaBuilt, kNoCudaBuild);
  const int n = cuda::device_count();
  REMAT_CHECK(n > 0, "no CUDA device: ", cuda::unavailable_reason());
  REMAT_CHECK(index >= 0 && index < n, "cuda:", index, " does not exist: ", n, " CUDA device", n == 1 ? "" : "s",
              " found (cuda:0", n == 1 ? "" : detail::concat(" to cuda:", n - 1), ")");
}

// The device must have its backend (CPU: always).
void check_usable(const char* what, Device device) {
  REMAT_CHECK(has_backend(device), what, ": ", device_name(device), " is not in use; call remat::use_device(",
              device_name(device), ") first");
}

}  // namespace

std::vector<std::string> compiled_backends() {
  if (kCudaBuilt) return {"cpu", "cuda"};
  return {"cpu"};
}

int device_count(DeviceType type) {
  switch (type) {
    case DeviceType::cpu:
      return 1;
    case DeviceType::cuda:
      return cuda::device_count();
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
      return cuda::device_count() > 0 ? "" : cuda::unavailable_reason();
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
  if (device.type == DeviceType::cpu) return;
  if (device.type == DeviceType::emulated || has_backend(device)) return check_usable("use_device", device);
  use_device(device, default_backend_options());
}

void use_device(Device device, const BackendOptions& options) {
  switch (device.type) {
    case DeviceType::cpu:
      REMAT_CHECK(options == BackendOptions{}, "use_device: the CPU backend has no options (asked for ",
                  backend_options_text(options), ")");
      return;
    case DeviceType::emulated:
      check_usable("use_device", device);
      break;
    case DeviceType::cuda:
      check_cuda_index(device.index);
      break;
  }
  std::lock_guard<std::mutex> lock(registration_mutex());
  if (device.type == DeviceType::cuda && !has_backend(device))
    register_backend(device, &cuda::backend_for(device.index, options));
  const BackendOptions& in_force = backend(device).options();
  REMAT_CHECK(in_force == options, "use_device: ", device_name(device), " is in use with backend options ",
              backend_options_text(in_force), ", not ", backend_options_text(options),
              " (options are chosen with the device, once per process)");
}

std::string describe_device(Device device) {
  if (device.type == DeviceType::cpu) return detail::concat("cpu (", num_threads(), num_threads() == 1 ? " thread)" : " threads)");
  check_usable("describe_device", device);
  if (device.type == DeviceType::cuda) return device_name(device) + ": " + cuda::describe(device.index);
  return device_name(device);
}

DeviceMemory device_memory(Device device) {
  if (device.type == DeviceType::cpu) return host_memory();
  check_usable("device_memory", device);
  if (device.type == DeviceType::cuda) {
    const cuda::MemoryInfo m = cuda::device_memory(device.index);
    return {m.free_bytes, m.total_bytes, "the device's free memory"};
  }
  return {};
}

// ---- backend options

namespace {

// Every option: its name, its field, whether its path has passed a device check in this build
// (set here by the commit that records the check's report in bench/results/cuda-DATE.md), and
// what it changes. Off is always the device-checked path.
struct OptionInfo {
  const char* name;
  bool BackendOptions::*field;
  bool device_checked;
  const char* what;
};
constexpr OptionInfo kOptions[] = {
    {"async", &BackendOptions::async, false,
     "no host wait in a step: region time marks as device events, index checks read at the next wait, uploads that "
     "return at once"},
    {"stream_ordered_allocator", &BackendOptions::stream_ordered_allocator, false,
     "device memory from the driver's stream-ordered pool (cudaMallocAsync) on the backend's stream"},
    {"copy_stream", &BackendOptions::copy_stream, false, "offloaded device values copied on a second stream"},
    {"sixteen_bit", &BackendOptions::sixteen_bit, false, "bf16 and f16 tensors on the device, with its 16-bit kernels"},
    {"tf32", &BackendOptions::tf32, true, "float32 products and convolutions on TF32 tensor cores"},
    {"profile", &BackendOptions::profile, false, "every launch timed with device events (take_kernel_profile)"},
};

std::string known_options() {
  std::string names;
  for (const OptionInfo& o : kOptions) names += detail::concat(names.empty() ? "" : ", ", o.name);
  return names;
}

}  // namespace

BackendOptions parse_backend_options(const std::string& text, BackendOptions base) {
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    std::string name = text.substr(at, comma - at);
    at = comma + 1;
    if (name.empty()) continue;
    if (name == "none") {
      base = BackendOptions{};
      continue;
    }
    const bool off = name[0] == '-';
    if (off) name.erase(0, 1);
    const OptionInfo* found = nullptr;
    for (const OptionInfo& o : kOptions)
      if (name == o.name) found = &o;
    REMAT_CHECK(found != nullptr, "backend options: unknown option '", name, "' in \"", text, "\" (known: ",
                known_options(), "; 'none', and '-NAME' to turn one off)");
    base.*(found->field) = !off;
  }
  return base;
}

std::string backend_options_text(const BackendOptions& options) {
  std::string text;
  for (const OptionInfo& o : kOptions)
    if (options.*(o.field)) text += detail::concat(text.empty() ? "" : ",", o.name);
  return text.empty() ? "none" : text;
}

BackendOptions default_backend_options() {
  static const std::string text = [] {
    const char* env = std::getenv("REMAT_BACKEND_OPTIONS");
    return std::string(env ? env : "");
  }();
  try {
    return parse_backend_options(text);
  } catch (const Error& e) {
    throw Error(detail::concat("REMAT_BACKEND_OPTIONS: ", e.what()));
  }
}

BackendOptionsReport describe_backend_options(Device device) {
  BackendOptionsReport r;
  r.device = device_name(device);
  if (device.type == DeviceType::cpu) {
    r.text = "cpu backend options: none (the CPU has none)";
    return r;
  }
  check_usable("describe_backend_options", device);
  const BackendOptions& in_force = backend(device).options();
  std::string on;
  for (const OptionInfo& o : kOptions) {
    r.options.push_back({o.name, in_force.*(o.field), o.device_checked, o.what});
    if (in_force.*(o.field))
      on += detail::concat(on.empty() ? "" : ", ", o.name, o.device_checked ? "" : " (not device-checked)");
  }
  r.text = detail::concat(r.device, " backend options: ", on.empty() ? "none (the device-checked default path)" : on);
  return r;
}

std::vector<KernelTime> take_kernel_profile(Device device) {
  if (device.type == DeviceType::cuda) return cuda::take_kernel_profile(device.index);
  return {};
}

}  // namespace remat
