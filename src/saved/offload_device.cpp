// The copies of an offloaded device value between its device and host memory (offload_entry.h).
//
// Note [offload of device values]. A saved value on a device other than the CPU (an
// accelerator's memory) of at least the threshold is copied to host memory behind the device's
// work: pack starts an asynchronous copy (Backend::copy_to_host_async) into host memory the
// backend can copy into directly (host_buffer: pinned on CUDA) and returns; the entry holds the
// device storage, counted as saved on the device, until the copy is over. collect(), run at every
// pack, unpack and prefetch, asks whether it is (copy_done: no wait), then lets the device storage
// go (its bytes are freed once the program's own tensors over it are gone too) and hands the host
// copy to the worker, as any host value: written to the file, its host copy dropped once
// written. A value unpacked while its copy still runs is read where it is, on its device. Read
// back, the host bytes are copied into a fresh device tensor (counted as saved on the device
// until the backward pass is done with the value) by copy_from_host_async, started by prefetch()
// a few nodes ahead of need (once a read job has brought the bytes in, or at once from mapped
// pages or a host copy still held), else at unpack; unpack makes the device's later work wait for
// the copy (wait_on_device: a stream wait, not a host wait) and drops the host copy. The bytes are
// the ones saved, so gradients equal save-all's bit for bit. A copy that fails raises at a
// defined point with nothing lost: one to host memory at the next pack or unpack (the pending
// error, as a failed write), the value kept on its device; one back to the device at the unpack
// that needed it, the host copy kept. On CUDA with the backend option copy_stream the copies run
// on a second stream (Note [the copy stream] in src/tensor/cuda/offload_copy.cpp), so the
// device<->host copies overlap the kernels around them as the disk's writes and read-ahead do;
// without it (and on the CPU) every copy is complete when its call returns, on CUDA through the
// backend's staging buffers on its one stream, and the copies do not overlap its kernels.
#include "offload_entry.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>

#include "remat/offload.h"
#include "tensor/allocate.h"

namespace remat::detail {

void start_copy_out(OffloadEntry& entry, const Tensor& whole) {
  Backend& device = backend(entry.home);
  Tensor source = whole.is_contiguous() ? whole : whole.contiguous();
  Tensor host = device.host_buffer(entry.dtype, entry.numel);
  entry.copy = device.copy_to_host_async(source, host);
  entry.ram.hold(host);
  entry.on_device.hold(source);
  entry.state = OffloadEntry::State::copying;
}

bool poll_copy_out(OffloadEntry& entry, bool wait, std::string& error) {
  Backend& device = backend(entry.home);
  try {
    if (wait) device.wait_copy(entry.copy);
    else if (!device.copy_done(entry.copy)) return false;
  } catch (const Error& e) {
    error = concat("policy offload: copying a saved value of ", memory::format_bytes(static_cast<double>(entry.bytes)),
                   " from ", device_name(entry.home), " to host memory failed: ", e.what(),
                   " (the value stays on its device; nothing was lost)");
    entry.ram.hold(entry.on_device.value);  // kept where it is
    entry.state = OffloadEntry::State::memory;
  }
  entry.copy = {};
  entry.on_device.drop();
  return true;
}

void start_copy_home(OffloadEntry& entry) {
  Tensor value = Tensor::empty({entry.numel}, entry.dtype, memory::Tag::other, entry.home);
  Tensor host = entry.ram.value.is_contiguous() ? entry.ram.value : entry.ram.value.contiguous();
  entry.copy = backend(entry.home).copy_from_host_async(host, value);
  // ids keep the range the host knows of them (as any upload), so no check of them is deferred
  if (entry.dtype == DType::i64) note_index_range(value, static_cast<const int64_t*>(host.raw_data()));
  entry.on_home.hold(value);
}

void finish_copy_home(OffloadEntry& entry) {
  try {
    backend(entry.home).wait_on_device(entry.copy);
  } catch (const Error& e) {
    entry.copy = {};
    entry.on_home.drop();
    throw Error(concat("policy offload: copying a saved value of ",
                               memory::format_bytes(static_cast<double>(entry.bytes)), " back to ",
                               device_name(entry.home), " failed: ", e.what(),
                               " (the value stays in host memory; nothing was lost)"));
  }
  entry.copy = {};
  entry.ram.drop();
}

}  // namespace remat::detail

namespace remat {

namespace {

// One copy's seconds, from its start to the end of wait_copy.
template <class Start>
double timed_copy(Backend& device, Start start) {
  const auto begin = std::chrono::steady_clock::now();
  device.wait_copy(start());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
}

}  // namespace

HostCopyBandwidth host_copy_bandwidth(Device device) {
  if (device.type == DeviceType::cpu) return {};
  static std::mutex mutex;
  static std::map<std::string, HostCopyBandwidth> measured;
  std::lock_guard<std::mutex> lock(mutex);
  const std::string name = device_name(device);
  if (auto it = measured.find(name); it != measured.end()) return it->second;
  constexpr int64_t kNumel = int64_t{2} << 20;  // 8 MiB of f32
  Backend& backend_of_device = backend(device);
  backend_of_device.synchronize();  // time the copies, not the work before them
  Tensor on_device = Tensor::empty({kNumel}, DType::f32, memory::Tag::other, device);
  Tensor host = backend_of_device.host_buffer(DType::f32, kNumel);
  double to_host = 0, from_host = 0;
  for (int round = 0; round < 4; ++round) {  // the first warms up
    const double out = timed_copy(backend_of_device, [&] { return backend_of_device.copy_to_host_async(on_device, host); });
    const double back = timed_copy(backend_of_device, [&] { return backend_of_device.copy_from_host_async(host, on_device); });
    if (round == 0) continue;
    to_host = round == 1 ? out : std::min(to_host, out);
    from_host = round == 1 ? back : std::min(from_host, back);
  }
  const double bytes = static_cast<double>(kNumel) * 4;
  const HostCopyBandwidth result{bytes / std::max(to_host, 1e-9), bytes / std::max(from_host, 1e-9)};
  measured.emplace(name, result);
  return result;
}

}  // namespace remat
