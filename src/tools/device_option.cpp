#include "device_option.h"

#include "usage.h"
#include "remat/backend.h"

namespace remat::tools {

Device select_device(const std::string& what, const std::string& text) {
  Device device;
  try {
    device = parse_device(text);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(detail::concat(what, ": ", e.what()));
  }
  try {
    use_device(device);
  } catch (const Error& e) {
    throw Error(detail::concat(what, " ", text, ": ", e.what()));
  }
  return device;
}

std::string device_summary(Device device) {
  if (device.type == DeviceType::cpu) return describe_device(device);
  const DeviceMemory m = device_memory(device);
  return detail::concat(describe_device(device), ", ", memory::format_bytes(static_cast<double>(m.free_bytes)),
                        " free of ", memory::format_bytes(static_cast<double>(m.total_bytes)));
}

nlohmann::json device_json(Device device) {
  nlohmann::json j = {{"name", device_name(device)}, {"description", describe_device(device)}};
  if (device.type == DeviceType::cpu) return j;  // the host's free memory would make runs differ
  const DeviceMemory m = device_memory(device);
  j["free_bytes"] = m.free_bytes;
  j["total_bytes"] = m.total_bytes;
  return j;
}

std::string version_text() {
  std::string text = detail::concat("remat ", REMAT_VERSION, "\nbackends:");
  const std::vector<std::string> backends = compiled_backends();
  for (size_t i = 0; i < backends.size(); ++i) {
    text += (i == 0 ? " " : ", ") + backends[i];
    if (backends[i] != "cuda") continue;
    const int n = device_count(DeviceType::cuda);
    if (n == 0) text += " (no CUDA device: " + unavailable_reason(DeviceType::cuda) + ")";
    else text += detail::concat(" (", n, " device", n == 1 ? "" : "s", ")");
  }
  if (backends.size() == 1) text += " (" + unavailable_reason(DeviceType::cuda) + ")";
  if (device_count(DeviceType::cuda) > 0) {
    for (int i = 0; i < device_count(DeviceType::cuda); ++i) {
      const Device d{DeviceType::cuda, i};
      try {
        use_device(d);
        text += "\n" + describe_device(d);
      } catch (const Error& e) {
        text += detail::concat("\ncuda:", i, ": unusable: ", e.what());
      }
    }
  }
  return text;
}

}  // namespace remat::tools
