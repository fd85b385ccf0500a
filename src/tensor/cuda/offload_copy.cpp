// The CUDA backend's asynchronous copies between host and device (Backend::copy_to_host_async,
// copy_from_host_async and their tickets), used by offload for saved device values.
//
// Note [the copy stream]. With the backend option copy_stream a backend copies offloaded values
// on a second stream of its own, so that a copy runs beside the kernels issued after it. A copy
// first records an event on the compute stream and makes the copy stream wait for it: the copy
// reads (or, into a block the allocator handed out again, writes) memory only after every kernel
// issued before it is done with that memory. The copy's end is an event on the copy stream (the
// ticket). The copy holds its device tensor and its host tensor until that event has fired, so a
// device block is never returned to the allocator (whose blocks the compute stream reuses in its
// own order) while the copy still reads it, nor a pinned block to the pool while the copy still
// writes it. Finished copies are let go, oldest first, whenever a copy is started or a ticket is
// asked about: cudaEventQuery, never a wait for the device. A consumer of a value copied to the
// device makes the compute stream wait for the copy's event (wait_on_device): the host does not
// wait. Host memory is pinned (host_buffer: cudaHostAlloc'd blocks kept in a pool by size and
// reused, freed when the backend goes), so a copy to or from it needs no staging; a copy from
// pageable memory goes through a pinned block of the pool first (a host memcpy at the call).
// Without the option every verb is the synchronous default (Backend::copy_to_host_async...): the
// backend's one stream and its staging buffers, as before.
#include <algorithm>
#include <cstring>
#include <deque>
#include <map>

#include "tensor/allocate.h"
#include "tensor/cuda/cuda_internal.h"

namespace remat::cuda {

namespace {

// A ticket's event (CopyTicket::event); destroyed with the last ticket or flight that names it.
struct CopyEvent {
  cudaEvent_t done = nullptr;
  ~CopyEvent() {
    if (done) (void)cudaEventDestroy(done);
  }
};

cudaEvent_t new_event() {
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  return e;
}

}  // namespace

struct CudaBackend::CopyStream : std::enable_shared_from_this<CudaBackend::CopyStream> {
  struct Flight {
    std::shared_ptr<CopyEvent> event;
    Tensor device, host;  // kept until the copy is done
  };
  cudaStream_t stream = nullptr;
  std::mutex mutex;
  std::deque<Flight> flights;              // in issue order
  std::multimap<size_t, void*> free_pinned;  // pinned blocks by size, for host_buffer
  std::vector<void*> all_pinned;
  std::atomic<uint64_t> copies{0}, device_waits{0};

  ~CopyStream() {
    if (stream) (void)cudaStreamSynchronize(stream);
    flights.clear();
    for (void* p : all_pinned) (void)cudaFreeHost(p);
    if (stream) (void)cudaStreamDestroy(stream);
  }

  // Lets go of the copies that are over, oldest first; stops at the first still running.
  void reap() {
    std::lock_guard lock(mutex);
    while (!flights.empty()) {
      const cudaError_t status = cudaEventQuery(flights.front().event->done);
      if (status == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return;
      }
      flights.pop_front();  // a failed copy's error is raised by its ticket's query
    }
  }

  // A pinned block of at least `bytes` and its size (a kept one up to twice as large, else a new one).
  std::pair<void*, size_t> take_pinned(size_t bytes) {
    {
      std::lock_guard lock(mutex);
      auto it = free_pinned.lower_bound(bytes);
      if (it != free_pinned.end() && it->first <= 2 * bytes) {
        const std::pair<void*, size_t> block{it->second, it->first};
        free_pinned.erase(it);
        return block;
      }
    }
    void* p = nullptr;
    check(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), "cudaHostAlloc (an offload copy's pinned host buffer)");
    std::lock_guard lock(mutex);
    all_pinned.push_back(p);
    return {p, bytes};
  }

  CopyTicket issue(cudaStream_t compute, void* to, const void* from, size_t bytes, cudaMemcpyKind kind,
                   const Tensor& device, const Tensor& host);

  // A host tensor over a pinned block, which goes back to the pool when the tensor's storage ends.
  Tensor pinned_tensor(DType dtype, int64_t numel) {
    const auto [p, size] = take_pinned(std::max<size_t>(static_cast<size_t>(numel) * dtype_size(dtype), 1));
    std::weak_ptr<CopyStream> weak = weak_from_this();
    return detail::external_tensor(p, {numel}, dtype, memory::Tag::other, kCpu, [weak, p = p, size = size] {
      if (auto self = weak.lock()) {
        std::lock_guard lock(self->mutex);
        self->free_pinned.emplace(size, p);
      }  // else the pool is gone and has freed every block
    });
  }
};

CudaBackend::CopyStream& CudaBackend::copy_stream() {
  if (!copy_stream_) {
    DeviceGuard guard(device_);
    auto cs = std::make_shared<CopyStream>();
    check(cudaStreamCreateWithFlags(&cs->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags (copy stream)");
    copy_stream_ = std::move(cs);
  }
  return *copy_stream_;
}

namespace {

bool pinned(const void* host) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, host) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeHost;
}

const CopyEvent* event_of(const CopyTicket& ticket) { return static_cast<const CopyEvent*>(ticket.event.get()); }

char* bytes_of(const Tensor& t) {
  return static_cast<char*>(t.storage()->data()) + t.offset() * static_cast<int64_t>(dtype_size(t.dtype()));
}

}  // namespace

Tensor CudaBackend::host_buffer(DType dtype, int64_t numel) {
  if (!options_.copy_stream) return Backend::host_buffer(dtype, numel);
  return copy_stream().pinned_tensor(dtype, numel);
}

// Copies `bytes` from `from` to `to` on the copy stream once the compute stream's work issued so
// far is done (it may still read `device`'s block, or use it as another tensor's), holding both
// tensors until the copy's event has fired.
CopyTicket CudaBackend::CopyStream::issue(cudaStream_t compute, void* to, const void* from, size_t bytes,
                                          cudaMemcpyKind kind, const Tensor& device, const Tensor& host) {
  const cudaEvent_t ready = new_event();
  check(cudaEventRecord(ready, compute), "cudaEventRecord");
  check(cudaStreamWaitEvent(stream, ready, 0), "cudaStreamWaitEvent");
  (void)cudaEventDestroy(ready);  // the wait holds on to it
  check(cudaMemcpyAsync(to, from, bytes, kind, stream), "cudaMemcpyAsync");
  note_launch(kind == cudaMemcpyDeviceToHost ? "copy to host (copy stream)" : "copy from host (copy stream)");
  auto event = std::make_shared<CopyEvent>();
  event->done = new_event();
  check(cudaEventRecord(event->done, stream), "cudaEventRecord");
  {
    std::lock_guard lock(mutex);
    flights.push_back({event, device, host});
  }
  ++copies;
  return {event};
}

CopyTicket CudaBackend::copy_to_host_async(const Tensor& src, const Tensor& host) {
  REMAT_ASSERT(src.is_contiguous() && host.is_contiguous() && host.nbytes() == src.nbytes(),
               "copy_to_host_async: contiguous tensors of the same size expected");
  if (!options_.copy_stream || src.nbytes() == 0 || !pinned(host.raw_data()))
    return Backend::copy_to_host_async(src, host);
  DeviceGuard guard(device_);  // issues gathered work first
  CopyStream& cs = copy_stream();
  cs.reap();
  ++to_host_;
  return cs.issue(stream_, host.raw_data(), bytes_of(src), src.nbytes(), cudaMemcpyDeviceToHost, src, host);
}

CopyTicket CudaBackend::copy_from_host_async(const Tensor& host, const Tensor& dst) {
  REMAT_ASSERT(dst.is_contiguous() && host.is_contiguous() && host.nbytes() == dst.nbytes(),
               "copy_from_host_async: contiguous tensors of the same size expected");
  if (!options_.copy_stream || dst.nbytes() == 0) return Backend::copy_from_host_async(host, dst);
  DeviceGuard guard(device_);
  CopyStream& cs = copy_stream();
  cs.reap();
  Tensor source = host;
  if (!pinned(host.raw_data())) {  // pageable: through a pinned block, copied now
    source = cs.pinned_tensor(host.dtype(), host.numel());
    std::memcpy(source.raw_data(), host.raw_data(), host.nbytes());
  }
  ++from_host_;
  return cs.issue(stream_, bytes_of(dst), source.raw_data(), dst.nbytes(), cudaMemcpyHostToDevice, dst, source);
}

bool CudaBackend::copy_done(const CopyTicket& ticket) {
  if (!ticket.pending()) return true;
  if (copy_stream_) copy_stream_->reap();
  const cudaError_t status = cudaEventQuery(event_of(ticket)->done);
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  check(status, "an asynchronous copy (cudaEventQuery)");
  return true;
}

void CudaBackend::wait_copy(const CopyTicket& ticket) {
  if (copy_done(ticket)) return;
  ++waits_;
  check(cudaEventSynchronize(event_of(ticket)->done), "an asynchronous copy (cudaEventSynchronize)");
  if (copy_stream_) copy_stream_->reap();
}

void CudaBackend::wait_on_device(const CopyTicket& ticket) {
  if (!ticket.pending()) return;
  DeviceGuard guard(device_);
  check(cudaStreamWaitEvent(stream_, event_of(ticket)->done, 0), "cudaStreamWaitEvent");
  ++copy_stream().device_waits;
}

uint64_t CudaBackend::async_copies() const { return copy_stream_ ? copy_stream_->copies.load() : 0; }
uint64_t CudaBackend::device_waits() const { return copy_stream_ ? copy_stream_->device_waits.load() : 0; }

}  // namespace remat::cuda
