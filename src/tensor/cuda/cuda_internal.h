// Internal: the CUDA backend class and what its source files share (error checks, the device
// allocator, strided layouts for the elementwise kernels). Included only by src/tensor/cuda/.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "remat/backend.h"

namespace remat::cuda {

// Throws remat::Error naming `what` and the library's message unless the call succeeded.
void check(cudaError_t status, const char* what);
void check(cublasStatus_t status, const char* what);
void check(cudnnStatus_t status, const char* what);
// Checks the launch of the kernel just issued (configuration errors; not its execution).
void check_launch(const char* kernel);

// Makes `device` current for the calling thread while it lives.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// Device memory: cudaMalloc / cudaFree under the base class's accounting and cache (every freed
// block is cached by size, without a limit: training steps allocate the same shapes every step).
// A request that cannot be met empties the cache and tries once more; then it is a
// remat::OutOfMemory naming the bytes asked and the device's free and total memory. Blocks are
// reused in the order of the backend's single stream, so a block freed by the host while a kernel
// still reads it is only handed to later kernels of the same stream.
class CudaAllocator : public memory::Allocator {
 public:
  explicit CudaAllocator(int device);
  ~CudaAllocator() override;

 protected:
  void* raw_allocate(size_t bytes) override;
  void raw_deallocate(void* pointer, size_t bytes) override;
  std::string out_of_memory_detail() const override;

 private:
  int device_;
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
std::vector<int64_t> broadcast_strides(const Tensor& t, const Shape& shape);
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

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;

  DeviceType device_type() const override { return DeviceType::cuda; }
  memory::Allocator& allocator() override { return allocator_; }
  void set_num_threads(int threads) override {}
  int num_threads() const override { return 1; }
  void copy_from_host(const void* host, const Tensor& dst) override;
  void copy_to_host(const Tensor& src, void* host) override;
  void synchronize() override;
  bool supports(Kernel kernel, DType dtype) const override;

  // every kernel of REMAT_KERNELS (include/remat/backend.h)
  REMAT_OVERRIDE_KERNELS()

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  cudnnHandle_t cudnn() const { return cudnn_; }
  // A contiguous copy of t on this device (t itself when already contiguous).
  Tensor contiguous(const Tensor& t);
  // Scratch device memory, accounted under `other`, freed when the tensor goes.
  Tensor scratch(const Shape& shape, DType dtype);

 private:
  int device_;
  CudaAllocator allocator_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  void* cublas_workspace_ = nullptr;
  // pinned host staging for copy_from_host / copy_to_host
  std::mutex staging_mutex_;
  void* staging_[2] = {nullptr, nullptr};
  cudaEvent_t staged_[2] = {nullptr, nullptr};
};

// dtype dispatch over float and double (i64 is named in the error).
template <class F>
decltype(auto) dispatch_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    default: throw Error(detail::concat(op, " on cuda: unsupported dtype ", dtype_name(dtype)));
  }
}

}  // namespace remat::cuda
