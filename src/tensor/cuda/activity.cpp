// What the CUDA backend records about its own work: the kernel profile (the backend option
// `profile`) and the index checks it defers to the next wait for the device (the option async).
//
// Note [the kernel profile]. Each launch is timed by a pair of events on the backend's one stream:
// the end of the launch before it within the same kernel call, or the call's start (DeviceGuard),
// and its own end. Within a call the host issues launches back to back, so an interval is the
// kernel's device time plus any wait for the host in between, which only a device starved of work
// shows; between calls nothing is counted. Events are reused from round to round; a round ends
// when the profile is taken, after a wait for the stream.
//
// Note [deferred index checks]. The default path checks ids and targets with a kernel and reads
// the verdict back at once: a wait per check, several per step. With the option async a check
// whose range the host does not know (kernel::indices_known_within) writes its first bad position
// (an integer atomicMin, order-free) into a slot of device memory; the kernels using the ids read
// nothing out of range (they write zero there), and the slots are copied back with the next wait
// the program makes anyway: a copy to the host, synchronize(), or the end of a backward pass
// (Backend::raise_deferred_errors, before gradients are committed). The first failure is raised
// with the CPU's message; its bad value is read from the ids then (an error path).
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/cuda_internal.h"

namespace remat::cuda {

std::vector<KernelTime> take_kernel_profile(int index) {
  std::vector<KernelTime> out;
  CudaBackend* be = CudaBackend::of_device(index);
  if (be == nullptr) return out;
  for (auto& [name, value] : be->take_profile()) out.push_back({name, value.first, value.second});
  return out;
}

// ---- the kernel profile

KernelProfiler::~KernelProfiler() {
  for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : free_) (void)cudaEventDestroy(e);
}

cudaEvent_t KernelProfiler::event() {
  cudaEvent_t e = nullptr;
  if (!free_.empty()) {
    e = free_.back();
    free_.pop_back();
  } else {
    check(cudaEventCreate(&e), "cudaEventCreate (profile)");
  }
  check(cudaEventRecord(e, stream_), "cudaEventRecord (profile)");
  events_.push_back(e);
  return e;
}

void KernelProfiler::start() {
  event();
  start_ = static_cast<long long>(events_.size()) - 1;
}

void KernelProfiler::launched(const char* name) {
  if (start_ < 0) start();
  event();
  const size_t end = events_.size() - 1;
  intervals_.push_back({name, static_cast<size_t>(start_), end});
  start_ = static_cast<long long>(end);
}

std::vector<std::pair<std::string, std::pair<uint64_t, double>>> KernelProfiler::take() {
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (profile)");
  std::map<std::string, std::pair<uint64_t, double>> by_name;
  for (const Interval& i : intervals_) {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, events_[i.from], events_[i.to]), "cudaEventElapsedTime (profile)");
    auto& slot = by_name[i.name];
    slot.first += 1;
    slot.second += static_cast<double>(ms) * 1e-3;
  }
  intervals_.clear();
  free_.insert(free_.end(), events_.begin(), events_.end());
  events_.clear();
  start_ = -1;
  std::vector<std::pair<std::string, std::pair<uint64_t, double>>> out(by_name.begin(), by_name.end());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  return out;
}

// ---- deferred index checks

unsigned long long* DeferredChecks::add(CudaBackend& be, Check c) {
  if (device_ == nullptr) {
    check(cudaMalloc(&device_, kSlots * sizeof(unsigned long long)), "cudaMalloc (deferred checks)");
    check(cudaHostAlloc(&host_, kSlots * sizeof(unsigned long long), cudaHostAllocDefault),
          "cudaHostAlloc (deferred checks)");
  }
  if (checks_.size() == static_cast<size_t>(kSlots)) be.synchronize();  // every slot taken: read them now
  const size_t slot = checks_.size();
  checks_.push_back(std::move(c));
  ++total_;
  check(cudaMemsetAsync(device_ + slot, 0xFF, sizeof(unsigned long long), be.stream()), "cudaMemsetAsync");
  note_launch("deferred check (reset)");
  return device_ + slot;
}

void DeferredChecks::fetch(cudaStream_t stream) {
  if (checks_.empty()) return;
  check(cudaMemcpyAsync(host_, device_, checks_.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync (deferred checks)");
  fetched_ = true;
}

void DeferredChecks::raise(CudaBackend& be) {
  if (!fetched_) return;
  std::vector<Check> checks = std::move(checks_);
  checks_.clear();
  fetched_ = false;
  for (size_t i = 0; i < checks.size(); ++i) {
    const unsigned long long bad = host_[i];
    if (bad == ~0ull) continue;
    const Check& c = checks[i];
    int64_t value = 0;
    const int64_t position = static_cast<int64_t>(bad);
    check(cudaMemcpy(&value, ptr<int64_t>(c.ids) + position, sizeof value, cudaMemcpyDeviceToHost),
          "cudaMemcpy (the bad id)");
    if (c.target)
      throw Error(detail::concat(c.op, ": target ", value, " at row ", position, " is out of range for ", c.bound,
                                 " classes (logits of shape [", c.rows, ", ", c.bound, "], ignore_index ",
                                 c.ignore_index, ")"));
    throw Error(detail::concat(c.op, ": id ", value, " at position ", position, " is out of range for a table of ",
                               c.bound, " rows"));
  }
}

void DeferredChecks::release() {
  if (device_) (void)cudaFree(device_);
  if (host_) (void)cudaFreeHost(host_);
  device_ = nullptr, host_ = nullptr;
  checks_.clear();
}

}  // namespace remat::cuda
