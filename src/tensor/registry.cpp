// The backend registry: which backend serves which device, and the per-device counters.
//
// The CPU backend is built in. Any other device gets a backend by register_backend(); backend()
// then hands out the dispatcher wrapped around it (dispatch.h), never the raw backend, so every
// kernel call on a device passes the supports() check and opens the device-access scope.
#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "remat/backend.h"
#include "tensor/dispatch.h"

namespace remat {

namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::pair<int, int>, std::unique_ptr<detail::DeviceDispatch>> dispatchers;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: storages may be freed during exit
  return *r;
}

std::pair<int, int> key(Device d) { return {static_cast<int>(d.type), d.index}; }

}  // namespace

void register_backend(Device device, Backend* b) {
  REMAT_CHECK(device.type != DeviceType::cpu, "register_backend: the CPU backend is built in and cannot be replaced");
  REMAT_CHECK(device.index >= 0, "register_backend: negative device index ", device.index);
  REMAT_CHECK(b == nullptr || b->device_type() == device.type, "register_backend: a backend for ",
              b ? device_name(Device{b->device_type(), device.index}) : "", " cannot serve ", device_name(device));
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (b == nullptr) {
    r.dispatchers.erase(key(device));
    return;
  }
  r.dispatchers[key(device)] = std::make_unique<detail::DeviceDispatch>(device, *b);
}

bool has_backend(Device device) {
  if (device.type == DeviceType::cpu) return true;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.dispatchers.count(key(device)) != 0;
}

Backend& backend(Device device) {
  if (device.type == DeviceType::cpu) return cpu_backend();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.dispatchers.find(key(device));
  REMAT_CHECK(it != r.dispatchers.end(), "no backend registered for device ", device_name(device));
  return *it->second;
}

memory::Stats memory_stats(Device device) { return backend(device).allocator().stats(); }
void reset_peaks(Device device) { backend(device).allocator().reset_peaks(); }

uint64_t fallback_calls(Device device) {
  if (device.type == DeviceType::cpu) return 0;
  return static_cast<detail::DeviceDispatch&>(backend(device)).fallback_calls();
}

DeviceActivity device_activity(Device device) {
  if (device.type == DeviceType::cpu) return {};
  return backend(device).activity();
}

void raise_deferred_errors() {
  std::vector<detail::DeviceDispatch*> devices;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    for (auto& [k, d] : r.dispatchers) devices.push_back(d.get());
  }
  for (detail::DeviceDispatch* d : devices) d->raise_deferred_errors();
}

TimeMark Backend::mark_time() {
  return {std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(), nullptr};
}

std::string Backend::why_not_held(DType dtype) const {
  if (holds(dtype)) return "";
  return detail::concat("its backend has no ", dtype_name(dtype), " kernels (docs/precision.md): compute on the CPU, or in f32");
}

const BackendOptions& Backend::options() const {
  static const BackendOptions none;
  return none;
}

Tensor Backend::host_buffer(DType dtype, int64_t numel) { return Tensor::empty({numel}, dtype); }
CopyTicket Backend::copy_to_host_async(const Tensor& src, const Tensor& host) {
  copy_to_host(src, host.raw_data());
  return {};
}
CopyTicket Backend::copy_from_host_async(const Tensor& host, const Tensor& dst) {
  copy_from_host(host.raw_data(), dst);
  return {};
}

}  // namespace remat

namespace remat {

const char* kernel_name(Kernel kernel) {
#define REMAT_KERNEL_NAME(name, ...) #name,
  static const char* const names[kKernelCount] = {REMAT_KERNELS(REMAT_KERNEL_NAME)};
#undef REMAT_KERNEL_NAME
  const int i = static_cast<int>(kernel);
  return i >= 0 && i < kKernelCount ? names[i] : "?";
}

}  // namespace remat
