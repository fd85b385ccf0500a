// Candidate: a reduce row's sums over the leading axes of a contiguous tensor (a linear layer's
// bias gradient: [rows, cols] summed over rows) in row slices of 512 with 16-byte loads, instead of
// the library's partial sums over chunks of 32 rows (src/tensor/cuda/reduce.cu, column_partials).
// Each column's sum is added in another order than the library's, so the harness checks it with a
// tolerance and asks it to repeat its own bits.
#include "candidates/cuda/candidates.h"
#include "tensor/cuda/device_common.cuh"
#include "tensor/cuda/half.cuh"

namespace remat::candidates::cuda {

using namespace remat::cuda;  // the device helpers (device_common.cuh, half.cuh)

namespace {

// A block of kSliceWarps warps owns
// 32 * V columns (V per thread, one vector load) and a slice of kSliceRows rows; warp w adds the
// rows w, w + kSliceWarps, ... of the slice in order, the block adds its warps in order into
// partial[slice][c], and combine_partials adds the slices in order. Each column's order depends on
// the shape only (not on V, which the alignment picks); indices are 32-bit (the caller checks the
// element count).
constexpr int kSliceWarps = 8;
constexpr int kSliceRows = 512;

template <class T, int V>
struct Vec;
template <>
struct Vec<float, 4> {
  using type = float4;
};
template <>
struct Vec<double, 2> {
  using type = double2;
};

// V elements from p (aligned to 16 bytes when V > 1), widened to their arithmetic type.
template <class S, int V, class T = Compute<S>>
__device__ inline void load_columns(const S* p, T (&v)[V]) {
  if constexpr (V == 1) {
    v[0] = convert<T>(*p);
  } else if constexpr (is_half_v<S>) {
    const uint4 w = *reinterpret_cast<const uint4*>(p);
    const S* h = reinterpret_cast<const S*>(&w);
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = convert<T>(h[j]);
  } else {
    const typename Vec<T, V>::type w = *reinterpret_cast<const typename Vec<T, V>::type*>(p);
    v[0] = w.x, v[1] = w.y;
    if constexpr (V == 4) v[2] = w.z, v[3] = w.w;
  }
}

template <class S, int V, class T = Compute<S>>
__global__ void __launch_bounds__(32 * kSliceWarps) column_slices(const S* x, int rows, int cols, Acc<T>* partial) {
  __shared__ Acc<T> warp_sums[kSliceWarps][32][V];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int c0 = (blockIdx.x * 32 + lane) * V;
  const int r0 = blockIdx.y * kSliceRows, r1 = min(rows, r0 + kSliceRows);
  Acc<T> acc[V] = {};
  if (c0 < cols) {
    for (int r = r0 + warp; r < r1; r += kSliceWarps) {
      T v[V];
      load_columns<S, V>(x + r * cols + c0, v);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += static_cast<Acc<T>>(v[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) warp_sums[warp][lane][j] = acc[j];
  __syncthreads();
  if (warp == 0 && c0 < cols) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      Acc<T> sum = 0;
      for (int w = 0; w < kSliceWarps; ++w) sum += warp_sums[w][lane][j];
      partial[static_cast<int64_t>(blockIdx.y) * cols + c0 + j] = sum;
    }
  }
}

// out[c] = the sum (or mean) of column c of the contiguous [rows, cols] x (16-bit: in float64,
// rounded to float32, then to 16 bits, as the float32 kernel's output is).
template <class S>
void launch_sliced(CudaBackend& be, const S* x, int64_t rows, int64_t cols, bool mean, S* out) {
  using T = Compute<S>;
  constexpr int kVector = 16 / sizeof(S);
  const bool vector = cols % kVector == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const int per_thread = vector ? kVector : 1;
  const int64_t slices = (rows + kSliceRows - 1) / kSliceRows;
  Tensor partial = be.scratch({slices, cols}, DType::f64);  // Acc<T> is double for both
  const dim3 grid(static_cast<unsigned>((cols + 32 * per_thread - 1) / (32 * per_thread)), static_cast<unsigned>(slices));
  const int r = static_cast<int>(rows), c = static_cast<int>(cols);
  if (vector)
    column_slices<S, kVector><<<grid, 32 * kSliceWarps, 0, be.stream()>>>(x, r, c, ptr<Acc<T>>(partial));
  else
    column_slices<S, 1><<<grid, 32 * kSliceWarps, 0, be.stream()>>>(x, r, c, ptr<Acc<T>>(partial));
  check_launch("bias gradient (column slices)");
  combine_partials<Acc<T>, S, T><<<grid_for(cols), kThreads, 0, be.stream()>>>(
      ptr<Acc<T>>(partial), slices, cols, mean ? static_cast<Acc<T>>(rows) : Acc<T>(1), out);
  check_launch("bias gradient (slice sums)");
}

}  // namespace

bool column_sums_sliced(CudaBackend& be, const Tensor& x, bool mean, const Tensor& out) {
  if (!x.is_contiguous() || x.dim() < 2 || !out.is_contiguous() || x.numel() == 0) return false;
  const int64_t cols = x.shape().back(), rows = x.numel() / cols;
  if (out.numel() != cols || x.numel() >= (int64_t{1} << 31) || (rows + kSliceRows - 1) / kSliceRows > 65535)
    return false;
  DeviceGuard guard(be.device());
  dispatch_storage(x.dtype(), "bias gradient", [&]<class S>() {
    launch_sliced<S>(be, ptr<S>(x), rows, cols, mean, ptr<S>(out));
  });
  return true;
}

}  // namespace remat::candidates::cuda
