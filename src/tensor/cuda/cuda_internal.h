// Internal: the CUDA backend class and what its source files share (error checks, the device
// allocator, strided layouts for the elementwise kernels). Included only by src/tensor/cuda/.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <mutex>
#include <unordered_map>
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

// Device memory: cudaMalloc / cudaFree with a cache of freed blocks by exact size (training
// steps allocate the same shapes every step). The base class counts live, peak and per-tag
// bytes. A request that cannot be met frees the cache and tries once more; then it is a
// remat::OutOfMemory naming the bytes asked and the device's free and total memory. Blocks are
// reused in the order of the backend's single stream, so a block freed by the host while a kernel
// still reads it is only handed to later kernels of the same stream.
class CudaAllocator : public memory::Allocator {
 public:
  explicit CudaAllocator(int device);
  // Returns every cached block to the device (the base class's empty_cache() does not see them).
  void release_cache();

 protected:
  void* raw_allocate(size_t bytes) override;
  void raw_deallocate(void* pointer, size_t bytes) override;

 private:
  int device_;
  std::mutex cache_mutex_;
  std::unordered_map<size_t, std::vector<void*>> cache_;
  size_t cached_ = 0;
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

  void copy(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& dst, double value) override;
  void arange(const Tensor& dst, double start, double step) override;
  void rand_uniform(const Tensor& dst, RngState state, double low, double high) override;
  void rand_normal(const Tensor& dst, RngState state, double mean, double stddev) override;

  void unary(UnaryOp op, const Tensor& x, const Tensor& y, double scalar) override;
  void unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& gy, const Tensor& gx,
                      double scalar) override;
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out) override;
  void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, double alpha,
            double beta) override;

  void softmax(const Tensor& x, const Tensor& y, bool log) override;
  void softmax_backward(const Tensor& y, const Tensor& gy, const Tensor& gx, bool log) override;
  void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                  const Tensor& mean, const Tensor& rstd) override;
  void layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                           const Tensor& gy, const Tensor& gx, const Tensor& gweight, const Tensor& gbias) override;
  void rms_norm(const Tensor& x, const Tensor& weight, double eps, const Tensor& y, const Tensor& rstd) override;
  void rms_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& gy, const Tensor& gx,
                         const Tensor& gweight) override;
  void embedding(const Tensor& table, const Tensor& ids, const Tensor& out) override;
  void embedding_backward(const Tensor& ids, const Tensor& gout, const Tensor& gtable) override;
  void cross_entropy(const Tensor& logits, const Tensor& targets, double label_smoothing, int64_t ignore_index,
                     const Tensor& losses, const Tensor& logp, const Tensor& scale) override;
  void cross_entropy_backward(const Tensor& logp, const Tensor& targets, const Tensor& gloss, double label_smoothing,
                              int64_t ignore_index, const Tensor& glogits) override;
  void dropout(const Tensor& x, double p, RngState state, const Tensor& y) override;

  void conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g, const Tensor& y) override;
  void conv2d_backward_input(const Tensor& gy, const Tensor& w, const Conv2dGeometry& g, const Tensor& gx) override;
  void conv2d_backward_weight(const Tensor& x, const Tensor& gy, const Conv2dGeometry& g, const Tensor& gw,
                              const Tensor& gbias) override;
  void max_pool2d(const Tensor& x, const Pool2dGeometry& g, const Tensor& y, const Tensor& indices) override;
  void max_pool2d_backward(const Tensor& gy, const Tensor& indices, const Tensor& gx) override;
  void avg_pool2d(const Tensor& x, const Pool2dGeometry& g, const Tensor& y) override;
  void avg_pool2d_backward(const Tensor& gy, const Pool2dGeometry& g, const Tensor& gx) override;
  void adaptive_avg_pool2d(const Tensor& x, const Tensor& y) override;
  void adaptive_avg_pool2d_backward(const Tensor& gy, const Tensor& gx) override;
  void batch_norm_statistics(const Tensor& x, const Tensor& mean, const Tensor& var) override;
  void batch_norm_apply(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                        const Tensor& bias, const Tensor& y) override;
  void batch_norm_backward(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                           const Tensor& gy, bool batch_statistics, const Tensor& gx, const Tensor& gweight,
                           const Tensor& gbias) override;

  void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum, const SgdStep& step) override;
  void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                  const AdamWStep& step) override;
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params, const Tensor& out,
                 const Tensor& lse) override;
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                          const Tensor& gout, const AttentionParams& params, const Tensor& gq, const Tensor& gk,
                          const Tensor& gv) override;

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
