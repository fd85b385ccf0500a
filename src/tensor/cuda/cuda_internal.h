// Internal: the CUDA backend class and what its source files share (error checks, the device
// allocator, strided layouts for the elementwise kernels). Included only by src/tensor/cuda/.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "remat/backend.h"
#include "tensor/kernel_common.h"

namespace remat::cuda {

// Throws remat::Error naming `what` and the library's message unless the call succeeded.
void check(cudaError_t status, const char* what);
void check(cublasStatus_t status, const char* what);
void check(cudnnStatus_t status, const char* what);
// Checks the launch of the kernel just issued (configuration errors; not its execution) and
// counts it on the backend of the calling thread's innermost DeviceGuard (the kernel profile, with
// the backend option `profile`, times it under the name `kernel`).
void check_launch(const char* kernel);
// Counts (and profiles) a launch that checks itself: a cuBLAS, cuDNN or CUB call, a memset, a copy.
void note_launch(const char* what);

// Makes `device` current for the calling thread while it lives; the launches made meanwhile are
// counted on its backend (and, while profiling, timed from here or from the previous launch).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  int outer_ = -1;  // the enclosing guard's device on this thread
};

// The workspace cuBLAS and cuBLASLt share on the backend's one stream.
inline constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// Device memory: cudaMalloc / cudaFree under the base class's accounting and cache (every freed
// block is cached by size, without a limit: training steps allocate the same shapes every step).
// A request that cannot be met empties the cache and tries once more; then it is a
// remat::OutOfMemory naming the bytes asked and the device's free and total memory. Blocks are
// reused in the order of the backend's single stream, so a block freed by the host while a kernel
// still reads it is only handed to later kernels of the same stream.
// With the backend option stream_ordered_allocator the blocks come from cudaMallocAsync's pool on
// the backend's stream (kept, not released to the driver) and are freed with cudaFreeAsync:
// neither waits for the device; the counters and the cache above are the same.
class CudaAllocator : public memory::Allocator {
 public:
  CudaAllocator(int device, bool stream_ordered);
  ~CudaAllocator() override;
  void set_stream(cudaStream_t stream);

 protected:
  void* raw_allocate(size_t bytes) override;
  void raw_deallocate(void* pointer, size_t bytes) override;
  std::string out_of_memory_detail() const override;

 private:
  int device_;
  bool stream_ordered_;
  cudaStream_t stream_ = nullptr;  // set once the backend has made its stream
};

// Strided view of up to kOperands tensors broadcast to one output shape, with adjacent axes
// merged where every operand allows it (the same merging as the CPU's make_layout).
inline constexpr int kMaxDims = kMaxRank;
template <int N>
struct Layout {
  int rank = 1;
  int64_t shape[kMaxDims] = {1};
  int64_t strides[N][kMaxDims] = {};
  int64_t offsets[N] = {};
  int64_t numel = 1;
};
// Strides of t broadcast to `shape` (0 on broadcast axes), right-aligned.
using kernel::broadcast_strides;
template <int N>
Layout<N> make_layout(const Shape& shape, const std::array<const Tensor*, N>& operands) {
  Layout<N> l;
  l.rank = 0;
  std::array<std::vector<int64_t>, N> st;
  for (int k = 0; k < N; ++k) {
    st[k] = broadcast_strides(*operands[k], shape);
    l.offsets[k] = operands[k]->offset();
  }
  l.numel = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    l.numel *= shape[i];
    if (shape[i] == 1) continue;
    bool merge = l.rank > 0;
    for (int k = 0; merge && k < N; ++k)
      if (l.strides[k][l.rank - 1] != st[k][i] * shape[i]) merge = false;
    if (merge) {
      l.shape[l.rank - 1] *= shape[i];
      for (int k = 0; k < N; ++k) l.strides[k][l.rank - 1] = st[k][i];
    } else {
      l.shape[l.rank] = shape[i];
      for (int k = 0; k < N; ++k) l.strides[k][l.rank] = st[k][i];
      ++l.rank;
    }
  }
  if (l.rank == 0) {
    l.rank = 1;
    l.shape[0] = 1;
    for (int k = 0; k < N; ++k) l.strides[k][0] = 0;
  }
  return l;
}

// A typed device pointer to a tensor's first element (null for an undefined tensor).
template <class T>
T* ptr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.storage()->data()) + t.offset() : nullptr;
}

// The kernel profile of one backend (the option `profile`): each launch's end is marked with an
// event and timed from its start (the previous launch's end within one kernel call, else the
// kernel call's start); times are read and added by name when the profile is taken.
class KernelProfiler {
 public:
  explicit KernelProfiler(cudaStream_t stream) : stream_(stream) {}
  ~KernelProfiler();
  void start();                 // a kernel call starts: the next launch is timed from here
  void launched(const char* name);
  // Waits for the stream, then the seconds and launches per name since the last take.
  std::vector<std::pair<std::string, std::pair<uint64_t, double>>> take();

 private:
  cudaEvent_t event();
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;  // recorded this round, in order
  std::vector<cudaEvent_t> free_;
  struct Interval {
    const char* name;
    size_t from, to;  // indices into events_
  };
  std::vector<Interval> intervals_;
  long long start_ = -1;  // index of the current start mark in events_
};

// Index checks put off to the next wait for the device (the option async; Backend::raise_deferred_errors):
// each has a slot of device memory that its kernel writes the first bad position into
// (atomicMin; ~0 when none), read back with the next wait.
class DeferredChecks {
 public:
  static constexpr int kSlots = 256;
  struct Check {
    Tensor ids;         // kept to read the bad value
    std::string op;     // "embedding", "cross_entropy", ...
    int64_t bound = 0;  // rows of the table or classes
    int64_t rows = 0;   // cross entropy: the logits' rows (for the message)
    bool target = false;
    int64_t ignore_index = 0;
  };
  // A slot for `check`, set to "no failure" on the stream; its device word for the kernel.
  unsigned long long* add(class CudaBackend& be, Check check);
  bool pending() const { return !checks_.empty(); }
  uint64_t total() const { return total_; }  // checks deferred since the start
  // Enqueues the copy of the verdicts to the host (before the caller's wait).
  void fetch(cudaStream_t stream);
  // After that wait: raises the first failure (as the CPU's remat::Error) and forgets them all.
  void raise(class CudaBackend& be);
  void release();

 private:
  unsigned long long* device_ = nullptr;
  unsigned long long* host_ = nullptr;
  std::vector<Check> checks_;
  bool fetched_ = false;
  uint64_t total_ = 0;
};

// The kernels of one device with its options (BackendOptions, chosen with the device);
// backend_for makes one of these, or with the option sixteen_bit a CudaDevice (below).
class CudaBackend : public Backend {
 public:
  CudaBackend(int device, const BackendOptions& options);
  ~CudaBackend() override;

  DeviceType device_type() const override { return DeviceType::cuda; }
  memory::Allocator& allocator() override { return allocator_; }
  void set_num_threads(int threads) override {}
  int num_threads() const override { return 1; }
  void copy_from_host(const void* host, const Tensor& dst) override;
  void copy_to_host(const Tensor& src, void* host) override;
  void synchronize() override;
  TimeMark mark_time() override;
  bool time_ready(const TimeMark& mark) override;
  double seconds_between(const TimeMark& from, const TimeMark& to) override;
  void raise_deferred_errors() override;
  DeviceActivity activity() const override;
  bool supports(Kernel kernel, DType dtype) const override;
  // bf16 and f16 tensors only with the option sixteen_bit (widen.cpp)
  bool holds(DType dtype) const override { return !is_16bit_float(dtype) || options_.sixteen_bit; }
  std::string why_not_held(DType dtype) const override;
  const BackendOptions& options() const override { return options_; }
  // asynchronous copies on the copy stream (the option copy_stream; offload_copy.cpp)
  Tensor host_buffer(DType dtype, int64_t numel) override;
  CopyTicket copy_to_host_async(const Tensor& src, const Tensor& host) override;
  CopyTicket copy_from_host_async(const Tensor& host, const Tensor& dst) override;
  bool copy_done(const CopyTicket& ticket) override;
  void wait_copy(const CopyTicket& ticket) override;
  void wait_on_device(const CopyTicket& ticket) override;

  // every kernel of REMAT_KERNELS (include/remat/backend.h)
  REMAT_OVERRIDE_KERNELS()

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  cudnnHandle_t cudnn() const { return cudnn_; }
  void* cublas_workspace() const { return cublas_workspace_; }
  // A contiguous copy of t on this device (t itself when already contiguous).
  Tensor contiguous(const Tensor& t);
  // Scratch device memory, accounted under `other`, freed when the tensor goes.
  Tensor scratch(const Shape& shape, DType dtype);

  // ---- counting and profiling (check_launch, note_launch, DeviceGuard)
  void count_launch(const char* name);
  void count_wait() { ++waits_; }
  void kernel_call_started();
  // The kernel profile since the last call, by name: (launches, seconds). Empty unless profiling.
  std::vector<std::pair<std::string, std::pair<uint64_t, double>>> take_profile();
  // ---- deferred index checks (the option async)
  DeferredChecks& deferred() { return deferred_; }
  // The calling thread's innermost guarded backend, or null; the device's latest backend alive
  // (backend_for's, or one of make_backend while it lives), or null.
  static CudaBackend* current();
  static CudaBackend* of_device(int device);
  // the copy stream, its pinned buffers and its copies in flight (offload_copy.cpp)
  struct CopyStream;
  CopyStream& copy_stream();
  uint64_t async_copies() const;
  uint64_t device_waits() const;

 private:
  void wait_for_stream();  // enqueues the deferred verdicts' copy, waits, raises a failure
  int device_;
  BackendOptions options_;
  CudaBackend* displaced_ = nullptr;  // the device's backend before this one (of_device), restored at its end
  CudaAllocator allocator_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  void* cublas_workspace_ = nullptr;
  // pinned host staging for copy_from_host / copy_to_host
  std::mutex staging_mutex_;
  void* staging_[2] = {nullptr, nullptr};
  cudaEvent_t staged_[2] = {nullptr, nullptr};
  // activity
  std::atomic<uint64_t> launches_{0}, waits_{0}, to_host_{0}, from_host_{0};
  std::unique_ptr<KernelProfiler> profiler_;  // null without the option profile
  DeferredChecks deferred_;
  std::shared_ptr<CopyStream> copy_stream_;  // made on first use
  // timing events (the option async), reused
  std::mutex events_mutex_;
  std::vector<cudaEvent_t> free_events_;
};

// The backend of one device with the option sixteen_bit: CudaBackend's kernels, each optional
// kernel without a 16-bit kernel of its own run on float32 stand-ins of its bf16 and f16 operands,
// on the device (widen.cpp, Note [16-bit floats on the GPU]).
class CudaDevice final : public CudaBackend {
 public:
  using CudaBackend::CudaBackend;
  REMAT_OPTIONAL_KERNELS(REMAT_KERNEL_OVERRIDE)
};
// Whether `kernel` has a 16-bit kernel of its own on CUDA (else CudaDevice widens its operands).
bool native_16bit(Kernel kernel);

// dtype dispatch over float and double (tensor/kernel_common.h; i64 is named in the error).
using kernel::dispatch_float;

}  // namespace remat::cuda
