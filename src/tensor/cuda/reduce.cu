// CUDA reductions (sum, mean, max, argmax) over sorted axes. An output of at most 32 elements is
// reduced by one thread in order; a longer one by one block of kThreads threads: thread t takes the
// reduced elements t, t + kThreads, ... in order, then the block folds the threads' results in a
// fixed tree. When the reduced axes lead a contiguous tensor (a sum over the batch of [batch,
// features], the bias gradient), the columns are summed in two fixed-order passes instead
// (device_common.cuh, column_partials). Sums of f32 accumulate in f64; max and argmax follow the
// CPU: the first NaN wins, else the first maximum.
#include <cmath>

#include "tensor/cuda/device_common.cuh"
#include "tensor/cuda/half.cuh"

namespace remat::cuda {

namespace {

// Offsets of the elements of a (sub)shape with given strides, row-major order, no merging.
struct Walk {
  int rank = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  int64_t numel = 1;
};
__device__ inline int64_t walk_offset(const Walk& w, int64_t index) {
  int64_t off = 0;
  for (int d = w.rank - 1; d >= 0; --d) {
    off += (index % w.shape[d]) * w.strides[d];
    index /= w.shape[d];
  }
  return off;
}

template <class S>
__global__ void sum_kernel(Walk kept, Walk red, const S* x, S* out, bool mean) {
  using T = Compute<S>;
  __shared__ Acc<T> shared[32];
  for (int64_t o = blockIdx.x; o < kept.numel; o += gridDim.x) {
    const S* base = x + walk_offset(kept, o);
    Acc<T> acc = 0;
    for (int64_t r = threadIdx.x; r < red.numel; r += blockDim.x)
      acc += static_cast<Acc<T>>(convert<T>(base[walk_offset(red, r)]));
    acc = block_sum(acc, shared);
    if (threadIdx.x == 0) out[o] = convert<S>(static_cast<T>(mean ? acc / static_cast<Acc<T>>(red.numel) : acc));
  }
}

// (value, index) of the first NaN, else of the first maximum; index -1 when nothing beat -inf.
template <class T>
__device__ inline void better(T& best, int64_t& arg, T v, int64_t i) {
  const bool v_nan = is_nan(v), best_nan = is_nan(best);
  bool take;
  if (v_nan || best_nan)
    take = v_nan && (!best_nan || (i < arg));
  else
    take = v > best || (v == best && arg >= 0 && i < arg);
  if (take) best = v, arg = i;
}

template <class S>
__global__ void max_kernel(Walk kept, Walk red, const S* x, S* out, int64_t* out_arg) {
  using T = Compute<S>;
  __shared__ T best_s[kThreads];
  __shared__ int64_t arg_s[kThreads];
  for (int64_t o = blockIdx.x; o < kept.numel; o += gridDim.x) {
    const S* base = x + walk_offset(kept, o);
    T best = -INFINITY;
    int64_t arg = -1;
    for (int64_t r = threadIdx.x; r < red.numel; r += blockDim.x) {
      const T v = convert<T>(base[walk_offset(red, r)]);
      if (v > best || (is_nan(v) && !is_nan(best))) best = v, arg = r;  // the CPU's rule, in order
    }
    best_s[threadIdx.x] = best;
    arg_s[threadIdx.x] = arg;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half >>= 1) {
      if (threadIdx.x < half) {
        T b = best_s[threadIdx.x];
        int64_t a = arg_s[threadIdx.x];
        const int64_t other = arg_s[threadIdx.x + half];
        if (other >= 0) {
          if (a < 0)
            b = best_s[threadIdx.x + half], a = other;
          else
            better(b, a, best_s[threadIdx.x + half], other);
        }
        best_s[threadIdx.x] = b;
        arg_s[threadIdx.x] = a;
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      if (out) out[o] = convert<S>(best_s[0]);
      if (out_arg) out_arg[o] = arg_s[0] < 0 ? 0 : arg_s[0];
    }
    __syncthreads();
  }
}

// Short reductions (at most kShort elements per output): one thread per output, in order, with
// the CPU's loop (sum in Acc<T>; the first NaN, else the first maximum).
constexpr int64_t kShort = 32;

template <class S>
__global__ void short_kernel(ReduceOp op, Walk kept, Walk red, const S* x, void* out) {
  using T = Compute<S>;
  REMAT_GRID_LOOP(o, kept.numel) {
    const S* base = x + walk_offset(kept, o);
    if (op == ReduceOp::sum || op == ReduceOp::mean) {
      Acc<T> acc = 0;
      for (int64_t r = 0; r < red.numel; ++r) acc += static_cast<Acc<T>>(convert<T>(base[walk_offset(red, r)]));
      static_cast<S*>(out)[o] =
          convert<S>(static_cast<T>(op == ReduceOp::mean ? acc / static_cast<Acc<T>>(red.numel) : acc));
      continue;
    }
    T best = -INFINITY;
    int64_t arg = 0;
    for (int64_t r = 0; r < red.numel; ++r) {
      const T v = convert<T>(base[walk_offset(red, r)]);
      if (v > best || (is_nan(v) && !is_nan(best))) best = v, arg = r;
    }
    if (op == ReduceOp::max)
      static_cast<S*>(out)[o] = convert<S>(best);
    else
      static_cast<int64_t*>(out)[o] = arg;
  }
}

template <class S, class T = Compute<S>>
struct ColumnValue {
  const S* x;
  int64_t cols;
  __device__ Acc<T> operator()(int64_t r, int64_t c) const { return static_cast<Acc<T>>(convert<T>(x[r * cols + c])); }
};

}  // namespace

void CudaBackend::reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out) {
  REMAT_ASSERT(out.is_contiguous() && out.dtype() == (op == ReduceOp::argmax ? DType::i64 : x.dtype()), "reduce: ",
               dtype_name(x.dtype()), " into ", dtype_name(out.dtype()));
  if (x.numel() == 0) {
    REMAT_CHECK(op == ReduceOp::sum || op == ReduceOp::mean || out.numel() == 0, "max/argmax of an empty tensor");
    fill(out, op == ReduceOp::mean ? std::nan("") : 0.0);
    return;
  }
  DeviceGuard guard(device_);
  const int64_t rank = x.dim();
  std::vector<bool> reduced(static_cast<size_t>(rank), false);
  for (auto a : axes) reduced[static_cast<size_t>(a)] = true;
  Walk kept, red;
  bool leading = true, seen_kept = false;
  for (int64_t i = 0; i < rank; ++i) {
    Walk& w = reduced[i] ? red : kept;
    w.shape[w.rank] = x.shape()[i];
    w.strides[w.rank] = x.strides()[i];
    w.numel *= x.shape()[i];
    ++w.rank;
    if (!reduced[i])
      seen_kept = true;
    else if (seen_kept)
      leading = false;
  }
  const bool columns =
      x.is_contiguous() && leading && kept.numel >= 32 && (op == ReduceOp::sum || op == ReduceOp::mean);
  dispatch_storage(x.dtype(), "reduce", [&]<class S>() {
    using T = Compute<S>;
    const S* xd = static_cast<const S*>(x.storage()->data()) + x.offset();
    const int64_t outputs = kept.numel;
    if (columns) {
      const int64_t rows = red.numel, cols = kept.numel, chunks = chunk_count(rows);
      Tensor partial = scratch({chunks, cols}, DType::f64);  // Acc<T> is double for both
      column_partials<Acc<T>><<<grid_for(chunks * cols), kThreads, 0, stream_>>>(ColumnValue<S>{xd, cols}, rows, cols,
                                                                                 ptr<Acc<T>>(partial));
      check_launch("reduce (column partials)");
      combine_partials<Acc<T>, S, T><<<grid_for(cols), kThreads, 0, stream_>>>(
          ptr<Acc<T>>(partial), chunks, cols, op == ReduceOp::mean ? static_cast<Acc<T>>(rows) : Acc<T>(1),
          ptr<S>(out));
      check_launch("reduce (column sums)");
      return;
    } else if (red.numel <= kShort) {
      void* out_data = op == ReduceOp::argmax ? static_cast<void*>(ptr<int64_t>(out)) : static_cast<void*>(ptr<S>(out));
      short_kernel<S><<<grid_for(outputs), kThreads, 0, stream_>>>(op, kept, red, xd, out_data);
    } else if (op == ReduceOp::sum || op == ReduceOp::mean) {
      sum_kernel<S><<<grid_for(outputs, 1), kThreads, 0, stream_>>>(kept, red, xd, ptr<S>(out), op == ReduceOp::mean);
    } else {
      max_kernel<S>
          <<<grid_for(outputs, 1), kThreads, 0, stream_>>>(kept, red, xd, op == ReduceOp::max ? ptr<S>(out) : nullptr,
                                                           op == ReduceOp::argmax ? ptr<int64_t>(out) : nullptr);
    }
    check_launch("reduce");
  });
}

}  // namespace remat::cuda
