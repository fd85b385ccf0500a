// CUDA optimizer updates: SGD and AdamW in place, one thread per element, with the CPU's formulas
// and constants (src/tensor/cpu/optim.cpp): every element is independent, so the results do not
// depend on the launch shape, nor on whether a parameter's update is launched alone or gathered
// with others (Note [gathered optimizer updates]). sum_squares, the gradient norm's sum: the
// composition of square, sum and a float64 add per tensor by default, or two launches in a fixed
// order (Note [the gradient norm in two launches]). scale_each, the clipping's scaling: the
// mul_scalar and copy kernels per tensor by default, or one launch for up to kSquaresTensors
// tensors with the same switch (each element x * T(scale), the mul_scalar kernel's product; for
// bf16 and f16, float(x) * float(scale) rounded once, as that kernel computes it).
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <type_traits>

#include "tensor/cuda/device_common.cuh"
#include "tensor/cuda/half.cuh"

namespace remat::cuda {

namespace {

template <class T>
struct SgdConstants {
  T lr, wd, mu, keep;
  bool decay, momentum, first, nesterov;
};

template <class T>
__device__ inline void sgd_element(T* p, const T* g, T* buf, int64_t i, const SgdConstants<T>& s) {
  T d = s.decay ? g[i] + s.wd * p[i] : g[i];
  if (s.momentum) {
    const T m = s.first ? d : s.mu * buf[i] + s.keep * d;
    buf[i] = m;
    d = s.nesterov ? d + s.mu * m : m;
  }
  p[i] = p[i] - s.lr * d;
}

template <class T>
__global__ void sgd_kernel(T* p, const T* g, T* buf, int64_t n, SgdConstants<T> s) {
  REMAT_GRID_LOOP(i, n) { sgd_element(p, g, buf, i, s); }
}

template <class T>
struct AdamConstants {
  T decay, b1, c1, b2, c2, inv_sqrt_bc2, eps, step;
  bool decoupled;
};

template <class T>
__device__ inline void adamw_element(T* p, const T* g, T* m, T* v, int64_t i, const AdamConstants<T>& s) {
  const T gi = g[i];
  const T pi = s.decoupled ? p[i] * s.decay : p[i];
  const T mi = s.b1 * m[i] + s.c1 * gi;
  const T vi = s.b2 * v[i] + s.c2 * (gi * gi);
  m[i] = mi;
  v[i] = vi;
  p[i] = pi - s.step * (mi / (sqrt(vi) * s.inv_sqrt_bc2 + s.eps));
}

template <class T>
__global__ void adamw_kernel(T* p, const T* g, T* m, T* v, int64_t n, AdamConstants<T> s) {
  REMAT_GRID_LOOP(i, n) { adamw_element(p, g, m, v, i, s); }
}

// ---- gathered updates (REMAT_CUDA_FAST=optimizer)
//
// Note [gathered optimizer updates]. An optimizer step is one sgd_step or adamw_step per
// parameter: about 150 launches for GPT-2 small. With the switch on, each call only records its
// pointers and constants; the records go to the device kUpdates at a time in one launch, as a
// kernel argument, when the list is full or when any other work of the backend starts (every
// entry point opens a DeviceGuard, which flushes first), so the stream still sees the updates
// before anything that could read or reuse their memory. Each element gets the same expression
// as in the one-parameter kernels: the bits are theirs.
constexpr int kUpdates = 24;            // per launch: the arguments stay under 4 KiB in float64
constexpr int64_t kChunk = kThreads * 4;  // elements per block

template <class C>
struct Update {
  void* p;
  const void* g;
  void* a;  // momentum buffer (SGD, may be null) or exp_avg
  void* b;  // exp_avg_sq (AdamW)
  int64_t n;
  C constants;
};
template <class C>
struct UpdateBatch {
  Update<C> u[kUpdates];
  int64_t first_block[kUpdates + 1];
  int count = 0;
};

template <class T, bool Adam, class C>
__global__ void gathered_kernel(UpdateBatch<C> batch) {
  int k = 0;
  while (k + 1 < batch.count && batch.first_block[k + 1] <= static_cast<int64_t>(blockIdx.x)) ++k;
  const Update<C>& u = batch.u[k];
  const int64_t begin = (blockIdx.x - batch.first_block[k]) * kChunk, end = min(u.n, begin + kChunk);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    if constexpr (Adam)
      adamw_element(static_cast<T*>(u.p), static_cast<const T*>(u.g), static_cast<T*>(u.a), static_cast<T*>(u.b), i,
                    u.constants);
    else
      sgd_element(static_cast<T*>(u.p), static_cast<const T*>(u.g), static_cast<T*>(u.a), i, u.constants);
  }
}

}  // namespace

struct CudaBackend::OptimizerQueue {
  DType dtype = DType::f32;
  bool adam = false;
  int count = 0;
  UpdateBatch<SgdConstants<float>> sgd_f;
  UpdateBatch<SgdConstants<double>> sgd_d;
  UpdateBatch<AdamConstants<float>> adam_f;
  UpdateBatch<AdamConstants<double>> adam_d;

  template <class C>
  UpdateBatch<C>& batch() {
    if constexpr (std::is_same_v<C, SgdConstants<float>>) return sgd_f;
    else if constexpr (std::is_same_v<C, SgdConstants<double>>) return sgd_d;
    else if constexpr (std::is_same_v<C, AdamConstants<float>>) return adam_f;
    else return adam_d;
  }
};

namespace {

template <class T, bool Adam, class C>
void launch_batch(UpdateBatch<C>& b, int count, cudaStream_t stream) {
  b.count = count;
  b.first_block[0] = 0;
  for (int k = 0; k < count; ++k) b.first_block[k + 1] = b.first_block[k] + (b.u[k].n + kChunk - 1) / kChunk;
  const int64_t blocks = b.first_block[count];
  REMAT_CHECK(blocks <= std::numeric_limits<int>::max(), "optimizer step on cuda: ", blocks, " blocks");
  gathered_kernel<T, Adam, C><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(b);
  check_launch(Adam ? "adamw_step (gathered)" : "sgd_step (gathered)");
}

// Records one update; issues the list first when it holds another kind or dtype, or is full.
template <class T, bool Adam, class C>
void gather(CudaBackend& be, std::shared_ptr<CudaBackend::OptimizerQueue>& queue, DType dtype, const Update<C>& u) {
  if (!queue) queue = std::make_shared<CudaBackend::OptimizerQueue>();
  if (queue->count > 0 && (queue->dtype != dtype || queue->adam != Adam)) be.flush_optimizer();
  queue->dtype = dtype, queue->adam = Adam;
  queue->batch<C>().u[queue->count++] = u;
  if (queue->count == kUpdates) be.flush_optimizer();
}

}  // namespace

void CudaBackend::flush_optimizer() {
  if (!optimizer_queue_ || optimizer_queue_->count == 0 || flushing_) return;
  flushing_ = true;
  struct Done {
    bool& flag;
    ~Done() { flag = false; }
  } done{flushing_};
  DeviceGuard guard(device_);
  OptimizerQueue& q = *optimizer_queue_;
  const int count = q.count;
  q.count = 0;
  if (q.adam) {
    if (q.dtype == DType::f32) launch_batch<float, true>(q.adam_f, count, stream_);
    else launch_batch<double, true>(q.adam_d, count, stream_);
  } else {
    if (q.dtype == DType::f32) launch_batch<float, false>(q.sgd_f, count, stream_);
    else launch_batch<double, false>(q.sgd_d, count, stream_);
  }
}

void CudaBackend::sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum, const SgdStep& s) {
  kernel::check_optimizer_state(param, param, "sgd_step", "parameter");
  kernel::check_optimizer_state(grad, param, "sgd_step", "gradient");
  kernel::check_optimizer_state(momentum, param, "sgd_step", "momentum buffer");
  REMAT_ASSERT(s.momentum == 0.0 || momentum.defined(), "sgd_step: momentum without a buffer");
  const int64_t n = param.numel();
  if (n == 0) return;
  dispatch_float(param.dtype(), "sgd_step", [&]<class T>() {
    const SgdConstants<T> c{static_cast<T>(s.lr),
                            static_cast<T>(s.weight_decay),
                            static_cast<T>(s.momentum),
                            static_cast<T>(1.0 - s.dampening),
                            s.weight_decay != 0.0,
                            s.momentum != 0.0,
                            s.first,
                            s.nesterov};
    if (fast(Fast::optimizer))
      return gather<T, false>(*this, optimizer_queue_, param.dtype(),
                              Update<SgdConstants<T>>{ptr<T>(param), ptr<T>(grad), ptr<T>(momentum), nullptr, n, c});
    DeviceGuard guard(device_);
    sgd_kernel<T><<<grid_for(n), kThreads, 0, stream_>>>(ptr<T>(param), ptr<T>(grad), ptr<T>(momentum), n, c);
    check_launch("sgd_step");
  });
}

void CudaBackend::adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                             const AdamWStep& s) {
  kernel::check_optimizer_state(param, param, "adamw_step", "parameter");
  kernel::check_optimizer_state(grad, param, "adamw_step", "gradient");
  kernel::check_optimizer_state(exp_avg, param, "adamw_step", "exp_avg");
  kernel::check_optimizer_state(exp_avg_sq, param, "adamw_step", "exp_avg_sq");
  REMAT_ASSERT(exp_avg.defined() && exp_avg_sq.defined(), "adamw_step: state is undefined");
  const int64_t n = param.numel();
  if (n == 0) return;
  dispatch_float(param.dtype(), "adamw_step", [&]<class T>() {
    const AdamConstants<T> c{static_cast<T>(1.0 - s.lr * s.weight_decay),
                             static_cast<T>(s.beta1),
                             static_cast<T>(1.0 - s.beta1),
                             static_cast<T>(s.beta2),
                             static_cast<T>(1.0 - s.beta2),
                             static_cast<T>(1.0 / std::sqrt(s.bias_correction2)),
                             static_cast<T>(s.eps),
                             static_cast<T>(s.lr / s.bias_correction1),
                             s.weight_decay != 0.0};
    if (fast(Fast::optimizer))
      return gather<T, true>(*this, optimizer_queue_, param.dtype(),
                             Update<AdamConstants<T>>{ptr<T>(param), ptr<T>(grad), ptr<T>(exp_avg), ptr<T>(exp_avg_sq),
                                                      n, c});
    DeviceGuard guard(device_);
    adamw_kernel<T>
        <<<grid_for(n), kThreads, 0, stream_>>>(ptr<T>(param), ptr<T>(grad), ptr<T>(exp_avg), ptr<T>(exp_avg_sq), n, c);
    check_launch("adamw_step");
  });
}

// ---- the gradient norm's sum of squares (REMAT_CUDA_FAST=grad_norm)
//
// Note [the gradient norm in two launches]. The tensors are cut into chunks of kSquaresChunk
// elements, numbered tensor by tensor in list order. The first launch gives each chunk to one
// block, which adds the squares of its elements in float64 (thread i takes elements i, i + 256,
// ..., then the block adds its threads in block_sum's fixed tree) into partial[chunk]; the
// second launch, one block, adds the partials the same way. Which element goes into which sum
// depends on the tensors' sizes only, so the result has the same bits on every call and under
// every launch shape of the grid; it is the float64 sum of the squares (not each tensor's
// sum rounded to its dtype first, as the default path and the CPU do). Up to kSquaresTensors
// tensors go in one first-stage launch (their pointers are a kernel argument); a longer list
// takes one more launch per kSquaresTensors. bf16 and f16 tensors are read as they are (a 16-bit
// value and its square are exact in float64), so a list of any length needs no float32 copies.

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

// Each tensor alone: square, sum in its dtype, widen, add in order (the ops' kernels, their bits).
void sum_squares_composed(CudaBackend& be, const TensorList& tensors, const Tensor& out) {
  bool first = true;
  for (const Tensor& t : tensors) {
    Tensor squares = be.scratch(t.shape(), t.dtype());
    be.unary(UnaryOp::square, t, squares, 0.0);
    std::vector<int64_t> axes(static_cast<size_t>(t.dim()));
    std::iota(axes.begin(), axes.end(), int64_t{0});
    Tensor one = be.scratch({}, t.dtype());
    be.reduce(ReduceOp::sum, squares, axes, one);
    if (first) {
      be.copy(one, out);
    } else {
      Tensor wide = be.scratch({}, DType::f64);
      be.copy(one, wide);
      be.binary(BinaryOp::add, out, wide, out);
    }
    first = false;
  }
  if (first) be.fill(out, 0.0);
}

}  // namespace

void CudaBackend::sum_squares(const TensorList& tensors, const Tensor& out) {
  REMAT_ASSERT(out.dtype() == DType::f64 && out.numel() == 1 && out.is_contiguous(),
               "sum_squares: out must be one contiguous f64 value");
  const DType dtype = tensors.empty() ? DType::f64 : tensors.front().dtype();
  bool gathered = fast(Fast::grad_norm) && is_floating(dtype);
  for (const Tensor& t : tensors) gathered = gathered && t.dtype() == dtype && t.is_contiguous();
  if (!gathered) return sum_squares_composed(*this, tensors, out);
  DeviceGuard guard(device_);
  dispatch_storage(dtype, "sum_squares", [&]<class T>() {
    std::vector<int64_t> first_chunk(tensors.size() + 1, 0);
    for (size_t i = 0; i < tensors.size(); ++i)
      first_chunk[i + 1] = first_chunk[i] + (tensors[i].numel() + kSquaresChunk - 1) / kSquaresChunk;
    const int64_t chunks = first_chunk.back();
    Tensor partial = scratch({std::max<int64_t>(chunks, 1)}, DType::f64);
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
      squares_partials_kernel<T><<<grid_for(b.first_chunk[b.count], 1), kThreads, 0, stream_>>>(
          b, ptr<double>(partial) + first_chunk[at]);
      check_launch("sum_squares (chunks)");
    }
    squares_total_kernel<<<1, kThreads, 0, stream_>>>(ptr<double>(partial), chunks, ptr<double>(out));
    check_launch("sum_squares (total)");
  });
}

namespace {

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

void CudaBackend::scale_each(const TensorList& tensors, double scale) {
  const DType dtype = tensors.at(0).dtype();
  bool gathered = fast(Fast::grad_norm) && is_floating(dtype);
  for (const Tensor& t : tensors) gathered = gathered && t.dtype() == dtype && t.is_contiguous();
  if (!gathered) {
    for (const Tensor& t : tensors) {  // the kernels of t.copy_(mul_scalar(t, scale))
      Tensor scaled = scratch(t.shape(), t.dtype());
      unary(UnaryOp::mul_scalar, t, scaled, scale);
      copy(scaled, t);
    }
    return;
  }
  DeviceGuard guard(device_);
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
          <<<grid_for(b.first_chunk[b.count], 1), kThreads, 0, stream_>>>(b, static_cast<Compute<T>>(scale));
      check_launch("scale_each");
    }
  });
}

}  // namespace remat::cuda
