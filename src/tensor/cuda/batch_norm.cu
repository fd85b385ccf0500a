// CUDA batch normalisation over x [N, C, S], mirroring src/tensor/cpu/batch_norm.cpp: the
// per-channel statistics and parameter-gradient sums are one block per channel (thread t takes
// elements t, t + kThreads, ... of the channel's N * S in order, the block folds them in a fixed
// tree; f32 accumulates in f64), so a checkpoint region that re-runs batch norm gets exactly the
// statistics of its first run. The statistics are taken on values shifted by the channel's first
// element, as on the CPU.
#include <cmath>
#include <utility>

#include "tensor/cuda/device_common.cuh"
#include "tensor/cuda/half.cuh"

namespace remat::cuda {

namespace {

using kernel::channel_element;
using kernel::ChannelLayout;
ChannelLayout layout_of(const Tensor& x) { return kernel::channel_layout(x); }

template <class S, class T = Compute<S>>
__global__ void statistics_kernel(const S* x, ChannelLayout l, T* mean, T* var) {
  __shared__ Acc<T> shared[32];
  const int64_t count = l.n * l.s;
  for (int64_t c = blockIdx.x; c < l.c; c += gridDim.x) {
    const Acc<T> shift = static_cast<Acc<T>>(convert<T>(x[c * l.s]));
    Acc<T> s1 = 0, s2 = 0;
    for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
      const Acc<T> d = static_cast<Acc<T>>(convert<T>(x[channel_element(l, c, k)])) - shift;
      s1 += d;
      s2 += d * d;
    }
    s1 = block_sum(s1, shared);
    s2 = block_sum(s2, shared);
    if (threadIdx.x == 0) {
      const Acc<T> m = s1 / static_cast<Acc<T>>(count);
      mean[c] = static_cast<T>(shift + m);
      const Acc<T> v = s2 / static_cast<Acc<T>>(count) - m * m;
      var[c] = static_cast<T>(v > 0 ? v : Acc<T>(0));
    }
  }
}

template <class S, class T = Compute<S>>
__global__ void apply_kernel(const S* x, const T* mean, const T* rstd, const S* w, const S* b, S* y, ChannelLayout l) {
  REMAT_GRID_LOOP(i, l.n * l.c * l.s) {
    const int64_t c = (i / l.s) % l.c;
    const T scale = w ? rstd[c] * convert<T>(w[c]) : rstd[c];
    const T shift = (b ? convert<T>(b[c]) : T(0)) - mean[c] * scale;
    y[i] = convert<S>(convert<T>(x[i]) * scale + shift);
  }
}

// sums[c] = sum(gy), sums[C + c] = sum(gy * xhat) per channel
template <class S, class T = Compute<S>>
__global__ void grad_sums_kernel(const S* x, const S* gy, const T* mean, const T* rstd, ChannelLayout l, T* sums) {
  __shared__ Acc<T> shared[32];
  const int64_t count = l.n * l.s;
  for (int64_t c = blockIdx.x; c < l.c; c += gridDim.x) {
    const Acc<T> m = static_cast<Acc<T>>(mean[c]), r = static_cast<Acc<T>>(rstd[c]);
    Acc<T> a = 0, b = 0;
    for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
      const int64_t i = channel_element(l, c, k);
      const Acc<T> g = static_cast<Acc<T>>(convert<T>(gy[i]));
      a += g;
      b += g * ((static_cast<Acc<T>>(convert<T>(x[i])) - m) * r);
    }
    a = block_sum(a, shared);
    b = block_sum(b, shared);
    if (threadIdx.x == 0) {
      sums[c] = static_cast<T>(a);
      sums[l.c + c] = static_cast<T>(b);
    }
  }
}

template <class S, class T = Compute<S>>
__global__ void input_grad_kernel(const S* x, const S* gy, const T* mean, const T* rstd, const S* w, const T* sums,
                                  bool batch_statistics, T inv_count, ChannelLayout l, S* gx) {
  REMAT_GRID_LOOP(i, l.n * l.c * l.s) {
    const int64_t c = (i / l.s) % l.c;
    const T scale = w ? rstd[c] * convert<T>(w[c]) : rstd[c];
    if (!batch_statistics) {  // mean and rstd are constants: y = x * scale + shift
      gx[i] = convert<S>(convert<T>(gy[i]) * scale);
      continue;
    }
    // gx = scale * (gy - mean(gy) - xhat * mean(gy * xhat))
    const T mean_gy = sums[c] * inv_count, mean_gy_xhat = sums[l.c + c] * inv_count;
    gx[i] = convert<S>(scale * (convert<T>(gy[i]) - mean_gy - (convert<T>(x[i]) - mean[c]) * rstd[c] * mean_gy_xhat));
  }
}

// dst[i] = src[i] rounded to 16 bits (the parameter gradients' float32 sums)
template <class S>
__global__ void narrow_kernel(const float* src, S* dst, int64_t n) {
  REMAT_GRID_LOOP(i, n) { dst[i] = convert<S>(src[i]); }
}

}  // namespace

void CudaBackend::batch_norm_statistics(const Tensor& x_in, const Tensor& mean, const Tensor& var) {
  DeviceGuard guard(device_);
  Tensor x = contiguous(x_in);
  const ChannelLayout l = layout_of(x);
  if (l.c == 0) return;
  if (l.n * l.s == 0) {  // no elements per channel: 0 / 0, as on the CPU, without reading x
    fill(mean, std::nan(""));
    fill(var, std::nan(""));
    return;
  }
  REMAT_ASSERT(mean.dtype() == accumulate_dtype(x.dtype()) && var.dtype() == mean.dtype(), "batch_norm: ",
               dtype_name(x.dtype()), " statistics into ", dtype_name(mean.dtype()));
  dispatch_storage(x.dtype(), "batch_norm", [&]<class S>() {
    using T = Compute<S>;
    statistics_kernel<S><<<grid_for(l.c, 1), kThreads, 0, stream_>>>(ptr<S>(x), l, ptr<T>(mean), ptr<T>(var));
  });
  check_launch("batch_norm");
}

void CudaBackend::batch_norm_apply(const Tensor& x_in, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                                   const Tensor& bias, const Tensor& y) {
  DeviceGuard guard(device_);
  Tensor x = contiguous(x_in), m = contiguous(mean), r = contiguous(rstd), w = contiguous(weight), b = contiguous(bias);
  const ChannelLayout l = layout_of(x);
  const int64_t n = l.n * l.c * l.s;
  if (n == 0) return;
  REMAT_ASSERT(m.dtype() == accumulate_dtype(x.dtype()) && r.dtype() == m.dtype() &&
                   (!w.defined() || w.dtype() == x.dtype()) && (!b.defined() || b.dtype() == x.dtype()),
               "batch_norm: ", dtype_name(x.dtype()), " with statistics ", dtype_name(m.dtype()));
  dispatch_storage(x.dtype(), "batch_norm", [&]<class S>() {
    using T = Compute<S>;
    apply_kernel<S>
        <<<grid_for(n), kThreads, 0, stream_>>>(ptr<S>(x), ptr<T>(m), ptr<T>(r), ptr<S>(w), ptr<S>(b), ptr<S>(y), l);
  });
  check_launch("batch_norm");
}

void CudaBackend::batch_norm_backward(const Tensor& x_in, const Tensor& mean_in, const Tensor& rstd_in,
                                      const Tensor& weight, const Tensor& gy_in, bool batch_statistics,
                                      const Tensor& gx, const Tensor& gweight, const Tensor& gbias) {
  DeviceGuard guard(device_);
  Tensor x = contiguous(x_in), gy = contiguous(gy_in), m = contiguous(mean_in), r = contiguous(rstd_in),
         w = contiguous(weight);
  const ChannelLayout l = layout_of(x);
  if (l.c == 0) return;
  const bool need_sums = batch_statistics || gweight.defined() || gbias.defined();
  REMAT_ASSERT(m.dtype() == accumulate_dtype(x.dtype()) && r.dtype() == m.dtype() && gy.dtype() == x.dtype(),
               "batch_norm_backward: ", dtype_name(x.dtype()), " with statistics ", dtype_name(m.dtype()));
  dispatch_storage(x.dtype(), "batch_norm_backward", [&]<class S>() {
    using T = Compute<S>;
    Tensor sums = scratch(Shape{2, l.c}, accumulate_dtype(x.dtype()));
    if (need_sums) {
      grad_sums_kernel<S>
          <<<grid_for(l.c, 1), kThreads, 0, stream_>>>(ptr<S>(x), ptr<S>(gy), ptr<T>(m), ptr<T>(r), l, ptr<T>(sums));
      check_launch("batch_norm_backward (sums)");
      for (const auto& [grad, at] : {std::pair{&gbias, int64_t{0}}, std::pair{&gweight, l.c}}) {
        if (!grad->defined()) continue;
        if constexpr (is_half_v<S>) {
          narrow_kernel<S><<<grid_for(l.c), kThreads, 0, stream_>>>(ptr<T>(sums) + at, ptr<S>(*grad), l.c);
          check_launch("batch_norm_backward (parameter gradients)");
        } else {
          check(cudaMemcpyAsync(ptr<T>(*grad), ptr<T>(sums) + at, static_cast<size_t>(l.c) * sizeof(T),
                                cudaMemcpyDeviceToDevice, stream_),
                "cudaMemcpyAsync");
        }
      }
    }
    const int64_t n = l.n * l.c * l.s;
    if (!gx.defined() || n == 0) return;
    const T inv_count = static_cast<T>(1.0 / static_cast<double>(l.n * l.s));
    input_grad_kernel<S><<<grid_for(n), kThreads, 0, stream_>>>(ptr<S>(x), ptr<S>(gy), ptr<T>(m), ptr<T>(r), ptr<S>(w),
                                                                ptr<T>(sums), batch_statistics, inv_count, l,
                                                                ptr<S>(gx));
    check_launch("batch_norm_backward");
  });
}

}  // namespace remat::cuda
