// Candidate: the sum_squares and scale_each rows (gradient clipping's norm and scaling) in few
// launches for up to 256 contiguous tensors of one dtype, instead of the library's kernels per
// tensor (src/tensor/cuda/optim.cu).
//
// Note [the gradient norm in two launches]. The tensors are cut into chunks of kSquaresChunk
// elements, numbered tensor by tensor in list order. The first launch gives each chunk to one
// block, which adds the squares of its elements in float64 (thread i takes elements i, i + 256,
// ..., then the block adds its threads in block_sum's fixed tree) into partial[chunk]; the
// second launch, one block, adds the partials the same way. Which element goes into which sum
// depends on the tensors' sizes only, so the result has the same bits on every call and under
// every launch shape of the grid; it is the float64 sum of the squares (not each tensor's
// sum rounded to its dtype first, as the library and the CPU do). Up to kSquaresTensors
// tensors go in one first-stage launch (their pointers are a kernel argument); a longer list
// takes one more launch per kSquaresTensors. bf16 and f16 tensors are read as they are (a 16-bit
// value and its square are exact in float64), so a list of any length needs no float32 copies.
// scale_each: each element x * T(scale), the mul_scalar kernel's product (for bf16 and f16,
// float(x) * float(scale) rounded once, as that kernel computes it): the library's bits. The
// harness checks sum_squares with a tolerance (the float64 sum of every square is not the library's
// sum of per-tensor sums rounded to their dtype) and scale_each bitwise.
#include <algorithm>
#include <vector>

#include "candidates/cuda/candidates.h"
#include "tensor/cuda/device_common.cuh"
#include "tensor/cuda/half.cuh"

namespace remat::candidates::cuda {

using namespace remat::cuda;  // the device helpers (device_common.cuh, half.cuh)

namespace {

inline constexpr int64_t kSquaresChunk = 16384;
inline constexpr int kSquaresTensors = 256;

template <class T>
struct SquaresBatch {
  const T* data[kSquaresTensors];
  int64_t numel[kSquaresTensors];
  int64_t first_chunk[kSquaresTensors + 1];  // chunk numbers, relative to the batch's first
  int count = 0;
};

template <class T>
__global__ void squares_partials_kernel(SquaresBatch<T> batch, double* partial) {
  __shared__ double shared[32];
  const int64_t chunks = batch.first_chunk[batch.count];
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    int lo = 0, hi = batch.count - 1;  // the tensor holding the chunk: first_chunk[i] <= chunk
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (batch.first_chunk[mid] <= chunk) lo = mid;
      else hi = mid - 1;
    }
    const T* x = batch.data[lo];
    const int64_t begin = (chunk - batch.first_chunk[lo]) * kSquaresChunk;
    const int64_t end = begin + kSquaresChunk < batch.numel[lo] ? begin + kSquaresChunk : batch.numel[lo];
    double s = 0.0;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const double v = convert<double>(x[i]);
      s += v * v;
    }
    s = block_sum(s, shared);
    if (threadIdx.x == 0) partial[chunk] = s;
  }
}

__global__ void squares_total_kernel(const double* partial, int64_t n, double* out) {
  __shared__ double shared[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) *out = s;
}

template <class T>
struct ScaleBatch {
  T* data[kSquaresTensors];
  int64_t numel[kSquaresTensors];
  int64_t first_chunk[kSquaresTensors + 1];
  int count = 0;
};

// Chunk by chunk as squares_partials_kernel; every element is independent, so the launch shape
// does not change the bits.
template <class T>
__global__ void scale_each_kernel(ScaleBatch<T> batch, Compute<T> scale) {
  const int64_t chunks = batch.first_chunk[batch.count];
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    int lo = 0, hi = batch.count - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (batch.first_chunk[mid] <= chunk) lo = mid;
      else hi = mid - 1;
    }
    T* x = batch.data[lo];
    const int64_t begin = (chunk - batch.first_chunk[lo]) * kSquaresChunk;
    const int64_t end = begin + kSquaresChunk < batch.numel[lo] ? begin + kSquaresChunk : batch.numel[lo];
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) x[i] = convert<T>(convert<Compute<T>>(x[i]) * scale);
  }
}

}  // namespace

bool sum_squares_gathered(CudaBackend& be, const TensorList& tensors, const Tensor& out) {
  REMAT_ASSERT(out.dtype() == DType::f64 && out.numel() == 1 && out.is_contiguous(),
               "sum_squares: out must be one contiguous f64 value");
  if (tensors.empty()) return false;
  const DType dtype = tensors.front().dtype();
  bool gathered = is_floating(dtype);
  for (const Tensor& t : tensors) gathered = gathered && t.dtype() == dtype && t.is_contiguous();
  if (!gathered) return false;
  DeviceGuard guard(be.device());
  const cudaStream_t stream = be.stream();
  dispatch_storage(dtype, "sum_squares", [&]<class T>() {
    std::vector<int64_t> first_chunk(tensors.size() + 1, 0);
    for (size_t i = 0; i < tensors.size(); ++i)
      first_chunk[i + 1] = first_chunk[i] + (tensors[i].numel() + kSquaresChunk - 1) / kSquaresChunk;
    const int64_t chunks = first_chunk.back();
    Tensor partial = be.scratch({std::max<int64_t>(chunks, 1)}, DType::f64);
    for (size_t at = 0; at < tensors.size(); at += kSquaresTensors) {
      SquaresBatch<T> b;
      b.count = static_cast<int>(std::min<size_t>(kSquaresTensors, tensors.size() - at));
      for (int i = 0; i < b.count; ++i) {
        b.data[i] = ptr<T>(tensors[at + i]);
        b.numel[i] = tensors[at + i].numel();
        b.first_chunk[i] = first_chunk[at + i] - first_chunk[at];
      }
      b.first_chunk[b.count] = first_chunk[at + b.count] - first_chunk[at];
      if (b.first_chunk[b.count] == 0) continue;
      squares_partials_kernel<T><<<grid_for(b.first_chunk[b.count], 1), kThreads, 0, stream>>>(
          b, ptr<double>(partial) + first_chunk[at]);
      check_launch("sum_squares (chunks)");
    }
    squares_total_kernel<<<1, kThreads, 0, stream>>>(ptr<double>(partial), chunks, ptr<double>(out));
    check_launch("sum_squares (total)");
  });
  return true;
}

bool scale_each_gathered(CudaBackend& be, const TensorList& tensors, double scale) {
  const DType dtype = tensors.at(0).dtype();
  bool gathered = is_floating(dtype);
  for (const Tensor& t : tensors) gathered = gathered && t.dtype() == dtype && t.is_contiguous();
  if (!gathered) return false;
  DeviceGuard guard(be.device());
  const cudaStream_t stream = be.stream();
  dispatch_storage(dtype, "scale_each", [&]<class T>() {
    for (size_t at = 0; at < tensors.size(); at += kSquaresTensors) {
      ScaleBatch<T> b;
      b.count = static_cast<int>(std::min<size_t>(kSquaresTensors, tensors.size() - at));
      b.first_chunk[0] = 0;
      for (int i = 0; i < b.count; ++i) {
        b.data[i] = ptr<T>(tensors[at + i]);
        b.numel[i] = tensors[at + i].numel();
        b.first_chunk[i + 1] = b.first_chunk[i] + (b.numel[i] + kSquaresChunk - 1) / kSquaresChunk;
      }
      if (b.first_chunk[b.count] == 0) continue;
      scale_each_kernel<T>
          <<<grid_for(b.first_chunk[b.count], 1), kThreads, 0, stream>>>(b, static_cast<Compute<T>>(scale));
      check_launch("scale_each");
    }
  });
  return true;
}

}  // namespace remat::candidates::cuda
