// Candidate: the sgd_step and adamw_step rows for many parameters in few launches.
//
// Note [gathered optimizer updates]. An optimizer step is one sgd_step or adamw_step per
// parameter: about 150 launches for GPT-2 small. Here the updates of up to kUpdates parameters of
// one dtype go to the device in one launch, their pointers and constants a kernel argument; block
// b of the launch takes chunk b of the parameters' elements, numbered parameter by parameter. Each
// element gets the one-parameter kernels' expression (src/tensor/cuda/optim.cuh), so the harness
// asks for their bits. (Promoted, the library would gather the calls of one step and issue them
// before any other work of the backend starts, so that the stream still sees them in program
// order; here the caller hands the whole list at once.)
#include <algorithm>
#include <limits>
#include <vector>

#include "candidates/cuda/candidates.h"
#include "tensor/cuda/optim.cuh"

namespace remat::candidates::cuda {

using namespace remat::cuda;  // the device helpers (device_common.cuh)
using remat::cuda::optim::AdamConstants;
using remat::cuda::optim::SgdConstants;

namespace {

constexpr int kUpdates = 24;              // per launch: the arguments stay under 4 KiB in float64
constexpr int64_t kChunk = kThreads * 4;  // elements per block

template <class C>
struct Update {
  void* p;
  const void* g;
  void* a;  // momentum buffer (SGD, may be null) or exp_avg
  void* b;  // exp_avg_sq (AdamW)
  int64_t n;
};
template <class C>
struct UpdateBatch {
  Update<C> u[kUpdates];
  int64_t first_block[kUpdates + 1];
  int count = 0;
  C constants;
};

template <class T, bool Adam, class C>
__global__ void gathered_kernel(UpdateBatch<C> batch) {
  int k = 0;
  while (k + 1 < batch.count && batch.first_block[k + 1] <= static_cast<int64_t>(blockIdx.x)) ++k;
  const Update<C>& u = batch.u[k];
  const int64_t begin = (blockIdx.x - batch.first_block[k]) * kChunk, end = min(u.n, begin + kChunk);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    if constexpr (Adam)
      optim::adamw_element(static_cast<T*>(u.p), static_cast<const T*>(u.g), static_cast<T*>(u.a),
                           static_cast<T*>(u.b), i, batch.constants);
    else
      optim::sgd_element(static_cast<T*>(u.p), static_cast<const T*>(u.g), static_cast<T*>(u.a), i, batch.constants);
  }
}

// Launches the updates [from, from + count) of `all` as one batch.
template <class T, bool Adam, class C>
void launch_batch(CudaBackend& be, const std::vector<Update<C>>& all, size_t from, int count, const C& constants) {
  UpdateBatch<C> b;
  b.count = count;
  b.constants = constants;
  b.first_block[0] = 0;
  for (int k = 0; k < count; ++k) {
    b.u[k] = all[from + static_cast<size_t>(k)];
    b.first_block[k + 1] = b.first_block[k] + (b.u[k].n + kChunk - 1) / kChunk;
  }
  const int64_t blocks = b.first_block[count];
  if (blocks == 0) return;
  REMAT_CHECK(blocks <= std::numeric_limits<int>::max(), "optimizer step on cuda: ", blocks, " blocks");
  gathered_kernel<T, Adam, C><<<static_cast<unsigned>(blocks), kThreads, 0, be.stream()>>>(b);
  check_launch(Adam ? "adamw_step (gathered)" : "sgd_step (gathered)");
}

template <class T, bool Adam, class C>
void launch_all(CudaBackend& be, const std::vector<Update<C>>& all, const C& constants) {
  for (size_t at = 0; at < all.size(); at += kUpdates)
    launch_batch<T, Adam, C>(be, all, at, static_cast<int>(std::min<size_t>(kUpdates, all.size() - at)), constants);
}

void check_one_dtype(const std::vector<Tensor>& params) {
  for (const Tensor& p : params)
    REMAT_CHECK(p.dtype() == params.front().dtype() && (p.dtype() == DType::f32 || p.dtype() == DType::f64),
                "gathered optimizer updates: parameters of one float dtype, got ", dtype_name(p.dtype()));
}

}  // namespace

void sgd_steps(CudaBackend& be, const std::vector<SgdUpdate>& updates, const SgdStep& step) {
  if (updates.empty()) return;
  std::vector<Tensor> params;
  for (const SgdUpdate& u : updates) params.push_back(u.param);
  check_one_dtype(params);
  DeviceGuard guard(be.device());
  kernel::dispatch_float(params.front().dtype(), "sgd_step (gathered)", [&]<class T>() {
    std::vector<Update<SgdConstants<T>>> all;
    for (const SgdUpdate& u : updates)
      all.push_back({ptr<T>(u.param), ptr<T>(u.grad), ptr<T>(u.momentum), nullptr, u.param.numel()});
    launch_all<T, false>(be, all, optim::sgd_constants<T>(step));
  });
}

void adamw_steps(CudaBackend& be, const std::vector<AdamWUpdate>& updates, const AdamWStep& step) {
  if (updates.empty()) return;
  std::vector<Tensor> params;
  for (const AdamWUpdate& u : updates) params.push_back(u.param);
  check_one_dtype(params);
  DeviceGuard guard(be.device());
  kernel::dispatch_float(params.front().dtype(), "adamw_step (gathered)", [&]<class T>() {
    std::vector<Update<AdamConstants<T>>> all;
    for (const AdamWUpdate& u : updates)
      all.push_back({ptr<T>(u.param), ptr<T>(u.grad), ptr<T>(u.exp_avg), ptr<T>(u.exp_avg_sq), u.param.numel()});
    launch_all<T, true>(be, all, optim::adamw_constants<T>(step));
  });
}

}  // namespace remat::candidates::cuda
