// The tensor-core attention candidate's entry points (candidates.h): the attention rows'
// contracts on the backend's stream, through the kernels of attention_tc.cu.
#include <type_traits>

#include "candidates/cuda/attention_tc.cuh"

namespace remat::candidates::cuda {

namespace {

using remat::cuda::Compute;
using remat::cuda::convert;
using remat::cuda::ptr;
using remat::cuda::attention_detail::operand;
using remat::cuda::attention_detail::Problem;

template <class S>
Problem<S> make_problem(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params) {
  Problem<S> pb;
  pb.heads = q.size(1), pb.tq = q.size(2), pb.tk = k.size(2), pb.d = q.size(3), pb.dv = v.size(3);
  pb.q = operand<const S>(q), pb.k = operand<const S>(k), pb.v = operand<const S>(v);
  pb.scale = static_cast<Compute<S>>(params.scale);
  pb.causal = params.causal;
  pb.p = params.dropout_p;
  pb.keep_scale = static_cast<Compute<S>>(1.0 / (1.0 - params.dropout_p));
  pb.seed = params.dropout_state.seed, pb.offset = params.dropout_state.offset;
  return pb;
}

// delta[bh * tq + i] = sum over e of gout[i][e] * out[i][e] (the library's delta_kernel).
template <class S>
__global__ void delta_kernel(Problem<S> pb, int64_t rows) {
  using T = Compute<S>;
  const int lane = threadIdx.x & 31;
  for (int64_t x = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5; x < rows;
       x += (int64_t(gridDim.x) * blockDim.x) >> 5) {
    const int64_t bh = x / pb.tq, i = x % pb.tq;
    const S* g = pb.gout.row(bh, pb.heads, i);
    const S* o = pb.out.row(bh, pb.heads, i);
    remat::cuda::Acc<T> s = 0;
    for (int64_t e = lane; e < pb.dv; e += 32)
      s += static_cast<remat::cuda::Acc<T>>(convert<T>(g[e]) * convert<T>(o[e]));
    s = remat::cuda::warp_sum(s);
    if (lane == 0) pb.delta[x] = static_cast<T>(s);
  }
}

bool unit_last(const Tensor& t) { return t.numel() == 0 || t.strides().back() == 1; }

}  // namespace

bool attention_tc(CudaBackend& be, const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params,
                  const Tensor& out, const Tensor& lse) {
  if (q.dtype() == DType::f64 || out.numel() == 0 || !unit_last(q) || !unit_last(k) || !unit_last(v) || !unit_last(out))
    return false;
  remat::cuda::DeviceGuard guard(be.device());
  return remat::cuda::dispatch_storage(q.dtype(), "attention (tensor cores)", [&]<class S>() {
    if constexpr (std::is_same_v<S, double>) {
      return false;
    } else {
      Problem<S> pb = make_problem<S>(q, k, v, params);
      pb.o = operand<S>(out);
      pb.lse_out = ptr<Compute<S>>(lse);
      return remat::cuda::attention_detail::forward_tc(pb, q.size(0) * q.size(1), be.stream(), be.device());
    }
  });
}

bool attention_backward_tc(CudaBackend& be, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                           const Tensor& lse, const Tensor& gout, const AttentionParams& params, const Tensor& gq,
                           const Tensor& gk, const Tensor& gv) {
  for (const Tensor* t : {&q, &k, &v, &out, &gout, &gq, &gk, &gv})
    if (!unit_last(*t)) return false;
  if (q.dtype() == DType::f64 || gout.numel() == 0) return false;
  remat::cuda::DeviceGuard guard(be.device());
  return remat::cuda::dispatch_storage(q.dtype(), "attention_backward (tensor cores)", [&]<class S>() {
    if constexpr (std::is_same_v<S, double>) {
      return false;
    } else {
      Problem<S> pb = make_problem<S>(q, k, v, params);
      pb.out = operand<const S>(out), pb.gout = operand<const S>(gout);
      pb.gq = operand<S>(gq), pb.gk = operand<S>(gk), pb.gv = operand<S>(gv);
      pb.lse = ptr<Compute<S>>(lse);
      const int64_t bh = q.size(0) * q.size(1);
      Tensor delta = be.scratch(Shape{bh, pb.tq}, accumulate_dtype(q.dtype()));
      pb.delta = ptr<Compute<S>>(delta);
      if (!remat::cuda::attention_detail::takes_tc(pb.d, pb.dv, pb.tq, pb.tk, bh, be.device())) return false;
      delta_kernel<S><<<remat::cuda::grid_for(bh * pb.tq * 32), remat::cuda::kThreads, 0, be.stream()>>>(pb, bh * pb.tq);
      remat::cuda::check_launch("attention_backward (delta)");
      return remat::cuda::attention_detail::backward_tc(pb, bh, be.stream(), be.device());
    }
  });
}

}  // namespace remat::candidates::cuda
