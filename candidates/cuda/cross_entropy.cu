// Candidate: the cross_entropy and cross_entropy_backward rows fused in the form the row keeps
// (lse [N]; Note [what cross entropy keeps] in src/autodiff/ops/loss.cpp). The library composes
// the row from kernels that passed a device check (Note [cross entropy from checked kernels] in
// src/tensor/cuda/indexing.cu): its forward reads each row three times and writes an [N, C]
// scratch log-softmax, then several passes for lse; its backward writes the log-softmax again
// before the gradient. Here the forward reads each row twice (the maximum and the sum of
// exponentials in one online pass, rescaled in a fixed order; a third read for the sum only with
// label smoothing) and writes nothing [N, C]; the backward runs a block per row with 32-bit column
// indices and computes the softmax as exp(logits - lse). The online sum adds in another order
// than the library's, so the harness checks the losses and lse with a tolerance, and the gradient
// against the library's given the same lse.
#include <algorithm>
#include <cmath>
#include <limits>

#include "candidates/cuda/candidates.h"
#include "tensor/cuda/device_common.cuh"
#include "tensor/cuda/half.cuh"

namespace remat::candidates::cuda {

using namespace remat::cuda;  // the device helpers (device_common.cuh, half.cuh)

namespace {

// The row's maximum m (0 for an all -inf row) and the sum of exp(x - m) in one read: each thread
// rescales its running sum when its maximum grows, the block then rescales the threads' sums to
// the row's maximum and adds them in its fixed order.
template <class S, class T = Compute<S>>
__device__ inline Acc<T> row_exp_sum(const S* xr, int64_t cols, T& m, T* shared_t, Acc<T>* shared) {
  T mine = -INFINITY;
  Acc<T> s = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const T v = convert<T>(xr[c]);
    if (v > mine) {
      s = (mine == -INFINITY ? Acc<T>(0) : s * exp(static_cast<Acc<T>>(mine) - static_cast<Acc<T>>(v))) + Acc<T>(1);
      mine = v;
    } else if (mine != -INFINITY || v != v) {  // -inf after -inf adds 0; a NaN spreads, as in two passes
      s += static_cast<Acc<T>>(exp(v - mine));
    }
  }
  m = block_max(mine, shared_t);
  if (m == -INFINITY) m = T(0);
  if (m == INFINITY) return static_cast<Acc<T>>(NAN);  // exp(inf - inf) in two passes (m is the block's)
  const Acc<T> scaled = mine == -INFINITY ? (s == s ? Acc<T>(0) : s)
                                          : s * exp(static_cast<Acc<T>>(mine) - static_cast<Acc<T>>(m));
  return block_sum(scaled, shared);
}

// The forward: row_exp_sum's maximum and sum, each row's shift written to lse[r] and no [N, C]
// tensor; with smoothing the row is read once more for the sum of x - shift, added in the order
// the library's kernel adds logp. Checked (as the library's, with the backend option async): a
// target outside [0, cols) that is not `ignore` reads nothing, gives loss 0, and its row goes to
// `flag`; `counted` (when not null) receives the rows not ignored.
template <class S, bool Checked = false>
__global__ void cross_entropy_lse_kernel(const S* x, const int64_t* targets, double eps, int64_t ignore,
                                         Compute<S>* losses, Compute<S>* lse, int64_t rows, int64_t cols,
                                         unsigned long long* flag = nullptr, unsigned long long* counted = nullptr) {
  using T = Compute<S>;
  __shared__ T shared_t[32];
  __shared__ Acc<T> shared[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const S* xr = x + r * cols;
    T m = -INFINITY;
    const Acc<T> sum = row_exp_sum(xr, cols, m, shared_t, shared);
    const T shift = static_cast<T>(static_cast<Acc<T>>(m) + log(sum));
    Acc<T> row_sum = 0;
    if (eps > 0.0) {
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) row_sum += static_cast<Acc<T>>(convert<T>(xr[c]) - shift);
      row_sum = block_sum(row_sum, shared);
    }
    if (threadIdx.x != 0) continue;
    lse[r] = shift;
    const int64_t t = targets[r];
    if constexpr (Checked) {
      if (t != ignore && counted) atomicAdd(counted, 1ull);
      if (t != ignore && (t < 0 || t >= cols)) {
        if (flag) atomicMin(flag, static_cast<unsigned long long>(r));
        losses[r] = T(0);
        continue;
      }
    }
    Acc<T> loss = 0;
    if (t != ignore && eps < 1.0)
      loss += static_cast<Acc<T>>(1.0 - eps) * -static_cast<Acc<T>>(convert<T>(xr[t]) - shift);
    if (t != ignore && eps > 0.0) loss += static_cast<Acc<T>>(eps) * -(row_sum / static_cast<Acc<T>>(cols));
    losses[r] = static_cast<T>(loss);
  }
}

// Its backward, a block per row (the row's target and gradient read once): exp(x - lse[row]), the
// bits of exp(logp) for the logp the forward would have written. I: the column index (int where
// the row allows).
template <class S, class I, class T = Compute<S>>
__global__ void cross_entropy_backward_lse(const S* x, const T* lse, const int64_t* targets, const T* gloss, double eps,
                                           int64_t ignore, S* glogits, int64_t rows, I cols) {
  const T uniform = static_cast<T>(eps / static_cast<double>(cols)), on_target = static_cast<T>(1.0 - eps);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t t = targets[r];
    const S* xr = x + r * cols;
    S* gr = glogits + r * cols;
    if (t == ignore) {
      for (I c = threadIdx.x; c < cols; c += blockDim.x) gr[c] = convert<S>(T(0));
      continue;
    }
    const T g = gloss[r], shift = lse[r];
    for (I c = threadIdx.x; c < cols; c += blockDim.x) {
      T v = g * (exp(convert<T>(xr[c]) - shift) - uniform);
      if (c == t) v -= g * on_target;
      gr[c] = convert<S>(v);
    }
  }
}

// The first target outside [0, cols) that is not `ignore` into flag[0], the rows not ignored into
// flag[1] (the library's check, read back at once).
__global__ void check_targets_kernel(const int64_t* ids, int64_t n, int64_t cols, int64_t ignore,
                                     unsigned long long* flag) {
  REMAT_GRID_LOOP(i, n) {
    const int64_t v = ids[i];
    if (v == ignore) continue;
    if (v < 0 || v >= cols) atomicMin(&flag[0], static_cast<unsigned long long>(i));
    atomicAdd(&flag[1], 1ull);
  }
}

// The rows that count; a remat::Error naming the first bad target.
int64_t check_targets(CudaBackend& be, const Tensor& targets, int64_t rows, int64_t cols, int64_t ignore) {
  const int64_t n = targets.numel();
  if (n == 0) return 0;
  Tensor flag = be.scratch({2}, DType::i64);
  unsigned long long host[2] = {~0ull, 0};
  check(cudaMemcpyAsync(ptr<int64_t>(flag), host, sizeof host, cudaMemcpyHostToDevice, be.stream()), "cudaMemcpyAsync");
  check_targets_kernel<<<grid_for(n), kThreads, 0, be.stream()>>>(
      ptr<int64_t>(targets), n, cols, ignore, reinterpret_cast<unsigned long long*>(ptr<int64_t>(flag)));
  check_launch("cross_entropy (target check)");
  check(cudaMemcpyAsync(host, ptr<int64_t>(flag), sizeof host, cudaMemcpyDeviceToHost, be.stream()), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(be.stream()), "cudaStreamSynchronize");
  REMAT_CHECK(host[0] == ~0ull, "cross_entropy: target at row ", host[0], " is out of range for ", cols,
              " classes (logits of shape [", rows, ", ", cols, "], ignore_index ", ignore, ")");
  return static_cast<int64_t>(host[1]);
}

}  // namespace

void cross_entropy_online(CudaBackend& be, const Tensor& logits_in, const Tensor& targets_in, double label_smoothing,
                          int64_t ignore_index, const Tensor& losses, const Tensor& lse, const Tensor& scale) {
  DeviceGuard guard(be.device());
  Tensor logits = be.contiguous(logits_in), targets = be.contiguous(targets_in);
  const int64_t rows = logits.size(0), cols = logits.size(1);
  const int64_t counted = check_targets(be, targets, rows, cols, ignore_index);
  be.fill(scale, counted > 0 ? 1.0 / static_cast<double>(counted) : 0.0);
  if (rows == 0) return;
  dispatch_storage(logits.dtype(), "cross_entropy (online)", [&]<class S>() {
    using T = Compute<S>;
    cross_entropy_lse_kernel<S><<<grid_for(rows, 1), kThreads, 0, be.stream()>>>(
        ptr<S>(logits), ptr<int64_t>(targets), label_smoothing, ignore_index, ptr<T>(losses), ptr<T>(lse), rows, cols,
        nullptr, nullptr);
  });
  check_launch("cross_entropy (online)");
}

void cross_entropy_backward_rows(CudaBackend& be, const Tensor& logits_in, const Tensor& lse_in,
                                 const Tensor& targets_in, const Tensor& gloss_in, double label_smoothing,
                                 int64_t ignore_index, const Tensor& glogits) {
  DeviceGuard guard(be.device());
  Tensor logits = be.contiguous(logits_in), lse = be.contiguous(lse_in), targets = be.contiguous(targets_in),
         gloss = be.contiguous(gloss_in);
  const int64_t rows = logits.size(0), cols = logits.size(1);
  (void)check_targets(be, targets, rows, cols, ignore_index);
  if (rows == 0 || cols == 0) return;
  dispatch_storage(glogits.dtype(), "cross_entropy_backward (rows)", [&]<class S>() {
    using T = Compute<S>;
    const unsigned grid = grid_for(rows, 1);
    if (cols <= std::numeric_limits<int>::max())
      cross_entropy_backward_lse<S, int><<<grid, kThreads, 0, be.stream()>>>(
          ptr<S>(logits), ptr<T>(lse), ptr<int64_t>(targets), ptr<T>(gloss), label_smoothing, ignore_index,
          ptr<S>(glogits), rows, static_cast<int>(cols));
    else
      cross_entropy_backward_lse<S, int64_t><<<grid, kThreads, 0, be.stream()>>>(
          ptr<S>(logits), ptr<T>(lse), ptr<int64_t>(targets), ptr<T>(gloss), label_smoothing, ignore_index,
          ptr<S>(glogits), rows, cols);
  });
  check_launch("cross_entropy_backward (rows)");
}

}  // namespace remat::candidates::cuda
