// The CUDA backend: devices, the backend object (stream, library handles, pinned staging), the
// device allocator and the host copies. The kernels are in the .cu files beside this one, one op
// family per file.
//
// Note: determinism on the GPU.
// The library's contract (gradients under every checkpoint policy bitwise equal to save-all's,
// and two runs of a program giving the same bits) holds on a CUDA device because no kernel of
// this backend lets the hardware choose an order of floating-point operations:
//   - One stream per device. Every kernel, library call and copy of a backend is issued to it, so
//     work runs in program order and a recomputation runs the same kernels on the same inputs.
//   - No floating-point atomics. Every sum is either one thread's loop in index order or a block
//     reduction of a fixed shape (device_common.cuh: warp shuffles in a fixed pattern, then the
//     warp results in warp order); the block size of each kernel is a constant, so the order
//     depends on the tensor's shape only, never on timing or on how many blocks run at once.
//   - Sums over many rows of a few columns (the parameter gradients of layer and RMS norm, a
//     reduction over the leading axes of a contiguous tensor) are computed in two passes: partial
//     sums over fixed chunks of 32 rows, one thread per chunk and column, written to scratch
//     memory, then one thread per column adds the chunks in order. Batch-norm statistics and
//     gradient sums are one block per channel (the block reduction above).
//   - Scatter-adds never race: the embedding backward sorts positions by id (a stable radix
//     sort, whose output is unique) and one block per id adds its positions' gradient rows in
//     position order; the average- and adaptive-pool backwards compute each input element from
//     the outputs whose windows hold it, in output order; the max-pool backward (which gets the
//     argmax indices, not the geometry) adds each plane's outputs in output order on one thread;
//     the attention backward computes dK and dV by walking the query rows for one key tile and dQ
//     by walking the keys for one query tile.
//   - cuBLAS runs on the backend's stream with a fixed workspace (cublasSetWorkspace), the
//     condition under which NVIDIA documents its results as bitwise reproducible on the same GPU
//     model and library version. cuDNN convolutions take algorithms cuDNN reports as
//     deterministic (forward IMPLICIT_PRECOMP_GEMM, backward data ALGO_1, backward filter ALGO_1
//     when supported, else the first deterministic one of cuDNN's heuristic list), chosen from
//     the problem alone, never by a timing search.
//   - Validation (embedding ids, cross-entropy targets) uses integer atomics only (the first bad
//     position by atomicMin, a count by atomicAdd), whose results do not depend on order.
//   - Random numbers (rand, randn, dropout, attention dropout) are the CPU's counter-based
//     Philox words (device_common.cuh repeats random.cpp's block function), so a mask is the
//     CPU's mask for the same RngState whatever the launch shape.
// Results are deterministic on one GPU model with one toolkit; they are not bitwise equal to the
// CPU's (different summation trees, fused multiply-adds), only close.
//
// Memory outside the counters: each backend holds a 32 MiB cuBLAS workspace on the device and two
// 8 MiB pinned host buffers for copies; cuDNN's workspaces and all scratch of the kernels come
// from the accounted allocator (tag `other`).
#include "tensor/cuda/cuda_backend.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>

#include "tensor/allocate.h"
#include "tensor/cuda/cuda_internal.h"

namespace remat::cuda {

void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();  // clears a sticky launch error so that later calls can report their own
  throw Error(
      detail::concat("cuda: ", what, " failed: ", cudaGetErrorString(status), " (", cudaGetErrorName(status), ")"));
}
void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(detail::concat("cuda: ", what, " failed: ", cublasGetStatusString(status)));
}
void check(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS)
    throw Error(detail::concat("cuda: ", what, " failed: ", cudnnGetErrorString(status)));
}
namespace {
constexpr int kMaxDevices = 64;
std::atomic<CudaBackend*> backends_by_device[kMaxDevices];
thread_local int guarded_device = -1;  // the innermost DeviceGuard's device on this thread
}  // namespace

void check_launch(const char* kernel) {
  check(cudaGetLastError(), kernel);
  note_launch(kernel);
}

void note_launch(const char* what) {
  if (CudaBackend* be = CudaBackend::current()) be->count_launch(what);
}

DeviceGuard::DeviceGuard(int device) : outer_(guarded_device) {
  check(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
  guarded_device = device;
  if (CudaBackend* be = CudaBackend::current()) be->kernel_call_started();
}
DeviceGuard::~DeviceGuard() {
  guarded_device = outer_;
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current != previous_) (void)cudaSetDevice(previous_);
}

CudaBackend* CudaBackend::of_device(int device) {
  return device >= 0 && device < kMaxDevices ? backends_by_device[device].load(std::memory_order_acquire) : nullptr;
}
CudaBackend* CudaBackend::current() { return of_device(guarded_device); }

// ---- devices

namespace {

struct Probe {
  int count = 0;
  std::string reason;
};
const Probe& probe() {
  static const Probe result = [] {
    Probe p;
    int n = 0;
    const cudaError_t status = cudaGetDeviceCount(&n);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      p.reason = detail::concat(cudaGetErrorString(status), " (", cudaGetErrorName(status), ")");
    } else if (n == 0) {
      p.reason = "the CUDA runtime found no device";
    } else {
      p.count = n;
    }
    return p;
  }();
  return result;
}

void check_index(int index, const char* what) {
  const int n = device_count();
  REMAT_CHECK(index >= 0 && index < n, what, ": no device cuda:", index,
              n == 0 ? detail::concat(" (no CUDA device: ", unavailable_reason(), ")")
                     : detail::concat(" (", n, " device", n == 1 ? "" : "s", ")"));
}

}  // namespace

int device_count() noexcept {
  try {
    return probe().count;
  } catch (...) {
    return 0;
  }
}

std::string unavailable_reason() { return probe().reason; }

std::unique_ptr<Backend> make_backend(int index, const BackendOptions& options) {
  check_index(index, "cuda backend");
  if (options.sixteen_bit) return std::make_unique<CudaDevice>(index, options);  // widen.cpp
  return std::make_unique<CudaBackend>(index, options);
}

Backend& backend_for(int index, const BackendOptions& options) {
  check_index(index, "cuda backend");
  static std::mutex mutex;
  static std::vector<Backend*>* backends = new std::vector<Backend*>();  // kept to exit
  std::lock_guard lock(mutex);
  if (backends->size() <= static_cast<size_t>(index)) backends->resize(static_cast<size_t>(index) + 1, nullptr);
  Backend*& slot = (*backends)[static_cast<size_t>(index)];
  if (slot == nullptr) slot = make_backend(index, options).release();
  REMAT_CHECK(slot->options() == options, "cuda:", index, " has a backend with options ",
              backend_options_text(slot->options()), ", not ", backend_options_text(options),
              " (options are chosen with the device, once per process)");
  return *slot;
}

std::string describe(int index) {
  check_index(index, "describe");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties");
  return detail::concat(prop.name, " (sm_", prop.major, prop.minor, ", ",
                        memory::format_bytes(static_cast<double>(prop.totalGlobalMem)), ")");
}

MemoryInfo device_memory(int index) {
  check_index(index, "device_memory");
  DeviceGuard guard(index);
  MemoryInfo info;
  check(cudaMemGetInfo(&info.free_bytes, &info.total_bytes), "cudaMemGetInfo");
  return info;
}

// ---- the allocator

CudaAllocator::CudaAllocator(int device, bool stream_ordered)
    : Allocator(remat::device_name(Device{DeviceType::cuda, device})), device_(device), stream_ordered_(stream_ordered) {
  // Every freed block is cached, without a limit: cudaFree waits for the whole device, and a
  // request that cannot be met empties the cache and tries once more (Allocator::allocate).
  set_smallest_cached_block(0);
  set_cache_limit(std::numeric_limits<size_t>::max());
}

CudaAllocator::~CudaAllocator() { empty_cache(); }

void CudaAllocator::set_stream(cudaStream_t stream) {
  stream_ = stream;
  if (!stream_ordered_) return;
  DeviceGuard guard(device_);
  cudaMemPool_t pool = nullptr;
  check(cudaDeviceGetDefaultMemPool(&pool, device_), "cudaDeviceGetDefaultMemPool");
  uint64_t keep = std::numeric_limits<uint64_t>::max();  // the pool keeps what it has
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");
}

void* CudaAllocator::raw_allocate(size_t bytes) {
  DeviceGuard guard(device_);
  void* p = nullptr;
  const bool pooled = stream_ != nullptr && stream_ordered_;
  cudaError_t status = pooled ? cudaMallocAsync(&p, bytes, stream_) : cudaMalloc(&p, bytes);
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // clears the error: the allocator reports it as OutOfMemory
    return nullptr;
  }
  check(status, "cudaMalloc");
  return p;
}

// Never throws (it runs from the destructor): errors of the device switch and of cudaFree, which
// waits for the device's work first, come back at the next checked call.
void CudaAllocator::raw_deallocate(void* pointer, size_t bytes) {
  int previous = -1;
  const bool known = cudaGetDevice(&previous) == cudaSuccess;
  if (!known || previous != device_) (void)cudaSetDevice(device_);
  if (stream_ != nullptr && stream_ordered_) {
    // only empty_cache() and a failed allocation's retry free blocks: hand the memory back to the
    // driver as cudaFree would (the stream reaches the free first)
    (void)cudaFreeAsync(pointer, stream_);
    (void)cudaStreamSynchronize(stream_);
    cudaMemPool_t pool = nullptr;
    if (cudaDeviceGetDefaultMemPool(&pool, device_) == cudaSuccess) (void)cudaMemPoolTrimTo(pool, 0);
  } else {
    (void)cudaFree(pointer);
  }
  if (known && previous != device_) (void)cudaSetDevice(previous);
}

std::string CudaAllocator::out_of_memory_detail() const {
  DeviceGuard guard(device_);
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return "; the device's free memory is unknown";
  }
  return detail::concat("; the device has ", memory::format_bytes(static_cast<double>(free_bytes)), " (", free_bytes,
                        " bytes) free of ", memory::format_bytes(static_cast<double>(total_bytes)));
}

// ---- the backend object

namespace {
constexpr size_t kStagingBytes = size_t{8} << 20;  // per pinned buffer (two of them)
}  // namespace

CudaBackend::CudaBackend(int device, const BackendOptions& options)
    : device_(device), options_(options), allocator_(device, options.stream_ordered_allocator) {
  REMAT_CHECK(device < kMaxDevices, "cuda backend: device index ", device, " above ", kMaxDevices - 1);
  DeviceGuard guard(device);
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  allocator_.set_stream(stream_);
  check(cublasCreate(&cublas_), "cublasCreate");
  check(cublasSetStream(cublas_, stream_), "cublasSetStream");
  check(cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes), "cudaMalloc (cuBLAS workspace)");
  check(cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes), "cublasSetWorkspace");
  check(cudnnCreate(&cudnn_), "cudnnCreate");
  check(cudnnSetStream(cudnn_, stream_), "cudnnSetStream");
  for (int i = 0; i < 2; ++i) {
    check(cudaHostAlloc(&staging_[i], kStagingBytes, cudaHostAllocDefault), "cudaHostAlloc (staging)");
    check(cudaEventCreateWithFlags(&staged_[i], cudaEventDisableTiming), "cudaEventCreate");
  }
  if (options_.profile) profiler_ = std::make_unique<KernelProfiler>(stream_);
  displaced_ = backends_by_device[device].exchange(this, std::memory_order_acq_rel);
}

// Backends of backend_for live to the end of the process; this runs for one of make_backend.
CudaBackend::~CudaBackend() {
  CudaBackend* self = this;
  backends_by_device[device_].compare_exchange_strong(self, displaced_);  // a test's own backend gives way
  (void)cudaStreamSynchronize(stream_);
  copy_stream_.reset();  // waits for its copies and lets their tensors go
  profiler_.reset();
  deferred_.release();
  for (cudaEvent_t e : free_events_) (void)cudaEventDestroy(e);
  allocator_.empty_cache();
  for (int i = 0; i < 2; ++i) {
    if (staging_[i]) (void)cudaFreeHost(staging_[i]);
    if (staged_[i]) (void)cudaEventDestroy(staged_[i]);
  }
  if (cudnn_) (void)cudnnDestroy(cudnn_);
  if (cublas_) (void)cublasDestroy(cublas_);
  if (cublas_workspace_) (void)cudaFree(cublas_workspace_);
  if (stream_) (void)cudaStreamDestroy(stream_);
}

void CudaBackend::synchronize() {
  DeviceGuard guard(device_);
  wait_for_stream();
}

void CudaBackend::wait_for_stream() {
  const bool verdicts = deferred_.pending();
  if (verdicts) deferred_.fetch(stream_);
  ++waits_;
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  if (verdicts) deferred_.raise(*this);
}

void CudaBackend::raise_deferred_errors() {
  if (!deferred_.pending()) return;
  DeviceGuard guard(device_);
  wait_for_stream();
}

DeviceActivity CudaBackend::activity() const {
  DeviceActivity a;
  a.launches = launches_.load();
  a.host_synchronizations = waits_.load();
  a.copies_to_host = to_host_.load();
  a.copies_from_host = from_host_.load();
  a.deferred_checks = deferred_.total();
  a.async_copies = async_copies();
  a.device_waits = device_waits();
  return a;
}

void CudaBackend::count_launch(const char* name) {
  launches_.fetch_add(1, std::memory_order_relaxed);
  if (profiler_) profiler_->launched(name);
}

void CudaBackend::kernel_call_started() {
  if (profiler_) profiler_->start();
}

std::vector<std::pair<std::string, std::pair<uint64_t, double>>> CudaBackend::take_profile() {
  if (!profiler_) return {};
  DeviceGuard guard(device_);
  ++waits_;
  return profiler_->take();
}

// ---- time marks: with the option async an event on the stream, read later; otherwise the stream
// is waited for and the host clock read (the behaviour the device checks on record measured)

TimeMark CudaBackend::mark_time() {
  DeviceGuard guard(device_);
  if (!options_.async) {
    wait_for_stream();
    return Backend::mark_time();
  }
  cudaEvent_t e = nullptr;
  {
    std::lock_guard lock(events_mutex_);
    if (!free_events_.empty()) e = free_events_.back(), free_events_.pop_back();
  }
  if (e == nullptr) check(cudaEventCreate(&e), "cudaEventCreate");
  check(cudaEventRecord(e, stream_), "cudaEventRecord");
  TimeMark m = Backend::mark_time();
  m.event = std::shared_ptr<void>(e, [this](void* p) {
    std::lock_guard lock(events_mutex_);
    free_events_.push_back(static_cast<cudaEvent_t>(p));
  });
  return m;
}

bool CudaBackend::time_ready(const TimeMark& mark) {
  if (!mark.event) return true;
  const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(mark.event.get()));
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  check(status, "cudaEventQuery");
  return true;
}

double CudaBackend::seconds_between(const TimeMark& from, const TimeMark& to) {
  if (!from.event || !to.event) return to.host_seconds - from.host_seconds;
  DeviceGuard guard(device_);
  if (!time_ready(to)) ++waits_;
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(to.event.get())), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from.event.get()), static_cast<cudaEvent_t>(to.event.get())),
        "cudaEventElapsedTime");
  return static_cast<double>(ms) * 1e-3;
}

// Every kernel for f32 and f64 (and bf16, f16 with the option sixteen_bit: holds); copy, fill and
// arange also for i64 (the index kernels take their i64 operands alongside a floating one, whose
// dtype is the one asked about). No digest: its kernel is a candidate that has not passed a device
// check (candidates/cuda/digest.cu), so values on the GPU are not digested (src/autodiff/digest.cpp
// skips a device without the kernel).
bool CudaBackend::supports(Kernel kernel, DType dtype) const {
  if (kernel == Kernel::copy || kernel == Kernel::fill || kernel == Kernel::arange) return true;
  if (kernel == Kernel::digest) return false;
  return is_floating(dtype);
}

void CudaBackend::digest(const Tensor& x, const Tensor& out) {
  REMAT_ASSERT(false, "digest on cuda: not supported (supports() says so), so never called");
}

std::string CudaBackend::why_not_held(DType dtype) const {
  if (holds(dtype)) return "";
  return detail::concat(dtype_name(dtype), " on CUDA has not passed a device check in this build: its 16-bit kernels ",
                        "run only with the backend option sixteen_bit (--backend-options sixteen_bit; ",
                        "docs/backends.md), or compute in f32");
}

// Host memory is pageable: it goes through two pinned buffers, chunk by chunk, so the copy of one
// chunk to the device overlaps the host's memcpy of the next.
void CudaBackend::copy_from_host(const void* host, const Tensor& dst) {
  REMAT_ASSERT(dst.is_contiguous(), "copy_from_host: the destination must be contiguous");
  const size_t total = dst.nbytes();
  if (total == 0) return;
  DeviceGuard guard(device_);
  std::lock_guard lock(staging_mutex_);
  char* device = static_cast<char*>(dst.storage()->data()) + dst.offset() * dtype_size(dst.dtype());
  const char* src = static_cast<const char*>(host);
  ++from_host_;
  int buffer = 0;
  for (size_t done = 0; done < total; done += kStagingBytes, buffer ^= 1) {
    const size_t n = std::min(kStagingBytes, total - done);
    if (cudaEventQuery(staged_[buffer]) != cudaSuccess) {
      (void)cudaGetLastError();
      ++waits_;
    }
    check(cudaEventSynchronize(staged_[buffer]), "cudaEventSynchronize");  // the buffer's last copy is done
    std::memcpy(staging_[buffer], src + done, n);
    check(cudaMemcpyAsync(device + done, staging_[buffer], n, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
    note_launch("copy from host");
    check(cudaEventRecord(staged_[buffer], stream_), "cudaEventRecord");
  }
  // The host's bytes are in the staging buffers, whose reuse waits on their events: with the
  // option async the copy returns without waiting for the device.
  if (options_.async) return;
  ++waits_;
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void CudaBackend::copy_to_host(const Tensor& src, void* host) {
  REMAT_ASSERT(src.is_contiguous(), "copy_to_host: the source must be contiguous");
  const size_t total = src.nbytes();
  if (total == 0) return;
  DeviceGuard guard(device_);
  std::lock_guard lock(staging_mutex_);
  const char* device = static_cast<const char*>(src.storage()->data()) + src.offset() * dtype_size(src.dtype());
  char* dst = static_cast<char*>(host);
  ++to_host_;
  ++waits_;
  const bool verdicts = deferred_.pending();
  if (verdicts) deferred_.fetch(stream_);  // read with this wait (Backend::raise_deferred_errors)
  // chunk i goes to buffer i % 2; while it is copied, the host drains chunk i - 1
  size_t pending_at = 0, pending_n = 0;
  int buffer = 0;
  for (size_t done = 0; done < total; done += kStagingBytes, buffer ^= 1) {
    const size_t n = std::min(kStagingBytes, total - done);
    check(cudaMemcpyAsync(staging_[buffer], device + done, n, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    note_launch("copy to host");
    check(cudaEventRecord(staged_[buffer], stream_), "cudaEventRecord");
    if (pending_n > 0) {
      check(cudaEventSynchronize(staged_[buffer ^ 1]), "cudaEventSynchronize");
      std::memcpy(dst + pending_at, staging_[buffer ^ 1], pending_n);
    }
    pending_at = done, pending_n = n;
  }
  check(cudaEventSynchronize(staged_[buffer ^ 1]), "cudaEventSynchronize");
  std::memcpy(dst + pending_at, staging_[buffer ^ 1], pending_n);
  if (verdicts) deferred_.raise(*this);
}

Tensor CudaBackend::scratch(const Shape& shape, DType dtype) {
  return detail::allocate_tensor("cuda scratch", shape, dtype, memory::Tag::other, Device{DeviceType::cuda, device_});
}

Tensor CudaBackend::contiguous(const Tensor& t) {
  if (!t.defined() || t.is_contiguous()) return t;
  Tensor c = scratch(t.shape(), t.dtype());
  copy(t, c);
  return c;
}

}  // namespace remat::cuda
