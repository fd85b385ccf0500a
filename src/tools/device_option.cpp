#include "device_option.h"

#include "usage.h"
#include "remat/backend.h"

namespace remat::tools {

Device select_device(const std::string& what, const std::string& text, const std::string& options) {
  Device device;
  try {
    device = parse_device(text);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(detail::concat(what, ": ", e.what()));
  }
  BackendOptions chosen;
  try {
    chosen = parse_backend_options(options, device.type == DeviceType::cpu ? BackendOptions{} : default_backend_options());
  } catch (const Error& e) {
    throw UsageError(detail::concat(what, " ", text, " --backend-options: ", e.what()));
  }
  if (device.type == DeviceType::cpu && !(chosen == BackendOptions{}))
    throw UsageError(detail::concat(what, " ", text, " --backend-options ", options,
                                    ": the CPU backend has no options (they are the CUDA backend's)"));
  try {
    use_device(device, chosen);
  } catch (const Error& e) {
    throw Error(detail::concat(what, " ", text, ": ", e.what()));
  }
  return device;
}

void check_device_dtype(const std::string& what, Device device, DType dtype) {
  const Backend& b = backend(device);
  REMAT_CHECK(b.holds(dtype), what, " ", dtype_name(dtype), ": ", device_name(device), " holds no ", dtype_name(dtype),
              " tensors: ", b.why_not_held(dtype));
}

std::string device_summary(Device device) {
  if (device.type == DeviceType::cpu) return describe_device(device);
  const DeviceMemory m = device_memory(device);
  const std::string options = describe_backend_options(device).text;
  return detail::concat(describe_device(device), ", ", memory::format_bytes(static_cast<double>(m.free_bytes)),
                        " free of ", memory::format_bytes(static_cast<double>(m.total_bytes)), "; ",
                        options.substr(options.find("backend options")));
}

nlohmann::json backend_options_json(Device device) {
  const BackendOptionsReport r = describe_backend_options(device);
  nlohmann::json options = nlohmann::json::array();
  for (const BackendOptionState& o : r.options)
    options.push_back({{"name", o.name}, {"on", o.on}, {"device_checked", o.device_checked}});
  return {{"text", r.text}, {"options", options}};
}

nlohmann::json device_json(Device device) {
  nlohmann::json j = {{"name", device_name(device)}, {"description", describe_device(device)}};
  if (device.type == DeviceType::cpu) return j;  // the host's free memory would make runs differ
  const DeviceMemory m = device_memory(device);
  j["free_bytes"] = m.free_bytes;
  j["total_bytes"] = m.total_bytes;
  j["backend_options"] = backend_options_json(device);
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
