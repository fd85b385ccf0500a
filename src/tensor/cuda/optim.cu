// CUDA optimizer updates: SGD and AdamW in place, one thread per element, with the CPU's formulas
// and constants (src/tensor/cpu/optim.cpp): every element is independent, so the results do not
// depend on the launch shape, nor on whether a parameter's update is launched alone or gathered
// with others (Note [gathered optimizer updates]).
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>

#include "tensor/cuda/device_common.cuh"

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

}  // namespace remat::cuda
