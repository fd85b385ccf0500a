// CPU batch normalisation kernels over x [N, C, S] (S = the product of the axes after the
// channel axis; 1 for BatchNorm1d on [N, C]). Per-channel statistics and parameter gradients are
// sums over N * S elements, each computed by one thread in a fixed order (image by image, then
// along the plane; f32 accumulates in f64), so they are bitwise the same for any thread count —
// and a checkpoint region that re-runs batch norm gets exactly the batch statistics of its first
// run. The statistics take one pass over values shifted by a sample of their channel, which
// avoids the cancellation of E[x^2] - E[x]^2 (see statistics()).
#include <algorithm>
#include <cmath>
#include <utility>

#include "tensor/cpu/cpu_backend.h"

namespace remat::cpu {

namespace {

using kernel::ChannelLayout;
ChannelLayout layout_of(const Tensor& x) { return kernel::channel_layout(x); }

// The sums over n and s of f(i) and g(i) for one channel (i the flat index of x[n, c, s]), in
// the fixed order, in one pass.
template <class T, class F, class G>
std::pair<Acc<T>, Acc<T>> channel_sums(const ChannelLayout& l, int64_t c, F&& f, G&& g) {
  Acc<T> total_f = 0, total_g = 0;
  for (int64_t n = 0; n < l.n; ++n) {
    const int64_t base = (n * l.c + c) * l.s;
    Acc<T> part_f = 0, part_g = 0;
#pragma omp simd reduction(+ : part_f, part_g)
    for (int64_t i = 0; i < l.s; ++i) {
      part_f += f(base + i);
      part_g += g(base + i);
    }
    total_f += part_f;
    total_g += part_g;
  }
  return {total_f, total_g};
}

// One pass over the channel, shifted by its first value s (so that the sums of x - s and
// (x - s)^2 stay small and var = E[(x - s)^2] - E[x - s]^2 does not cancel; s is a sample,
// within a few standard deviations of the mean).
template <class T>
void statistics(const Tensor& x, const Tensor& mean, const Tensor& var) {
  const ChannelLayout l = layout_of(x);
  const T* xp = x.data<T>();
  T* mp = mean.data<T>();
  T* vp = var.data<T>();
  const Acc<T> count = static_cast<Acc<T>>(l.n * l.s);
  for_rows(l.c, l.n * l.s, [&](int64_t c) {
    const Acc<T> shift = static_cast<Acc<T>>(xp[c * l.s]);
    auto [s1, s2] = channel_sums<T>(
        l, c, [&](int64_t i) { return static_cast<Acc<T>>(xp[i]) - shift; },
        [&](int64_t i) {
          const Acc<T> d = static_cast<Acc<T>>(xp[i]) - shift;
          return d * d;
        });
    const Acc<T> m = s1 / count;
    mp[c] = static_cast<T>(shift + m);
    vp[c] = static_cast<T>(std::max<Acc<T>>(s2 / count - m * m, 0));
  });
}

template <class T>
void apply(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight, const Tensor& bias,
           const Tensor& y) {
  const ChannelLayout l = layout_of(x);
  const T* xp = x.data<T>();
  const T* mp = mean.data<T>();
  const T* rp = rstd.data<T>();
  const T* wp = weight.defined() ? weight.data<T>() : nullptr;
  const T* bp = bias.defined() ? bias.data<T>() : nullptr;
  T* yp = y.data<T>();
  for_rows(l.n * l.c, l.s, [&](int64_t row) {
    const int64_t c = row % l.c;
    const T scale = wp ? rp[c] * wp[c] : rp[c];
    const T shift = (bp ? bp[c] : T(0)) - mp[c] * scale;
    const T* in = xp + row * l.s;
    T* out = yp + row * l.s;
#pragma omp simd
    for (int64_t i = 0; i < l.s; ++i) out[i] = in[i] * scale + shift;
  });
}

template <class T>
void backward(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight, const Tensor& gy,
              bool batch_statistics, const Tensor& gx, const Tensor& gweight, const Tensor& gbias) {
  const ChannelLayout l = layout_of(x);
  const T* xp = x.data<T>();
  const T* gyp = gy.data<T>();
  const T* mp = mean.data<T>();
  const T* rp = rstd.data<T>();
  const T* wp = weight.defined() ? weight.data<T>() : nullptr;
  const bool need_sums = batch_statistics || gweight.defined() || gbias.defined();
  // per channel: sum(gy) and sum(gy * xhat), xhat = (x - mean) * rstd
  Tensor sums = Tensor::empty({2, l.c}, std::is_same_v<T, float> ? DType::f32 : DType::f64);
  T* sum_gy = sums.data<T>();
  T* sum_gy_xhat = sum_gy + l.c;
  if (need_sums) {
    for_rows(l.c, l.n * l.s, [&](int64_t c) {
      const Acc<T> m = static_cast<Acc<T>>(mp[c]), r = static_cast<Acc<T>>(rp[c]);
      auto [a, b] = channel_sums<T>(
          l, c, [&](int64_t i) { return static_cast<Acc<T>>(gyp[i]); },
          [&](int64_t i) { return static_cast<Acc<T>>(gyp[i]) * ((static_cast<Acc<T>>(xp[i]) - m) * r); });
      sum_gy[c] = static_cast<T>(a);
      sum_gy_xhat[c] = static_cast<T>(b);
    });
  }
  if (gbias.defined())
    for (int64_t c = 0; c < l.c; ++c) gbias.data<T>()[c] = sum_gy[c];
  if (gweight.defined())
    for (int64_t c = 0; c < l.c; ++c) gweight.data<T>()[c] = sum_gy_xhat[c];
  if (!gx.defined()) return;
  T* gxp = gx.data<T>();
  const T inv_count = static_cast<T>(1.0 / static_cast<double>(l.n * l.s));
  for_rows(l.n * l.c, l.s, [&](int64_t row) {
    const int64_t c = row % l.c;
    const T scale = wp ? rp[c] * wp[c] : rp[c];
    const T* g = gyp + row * l.s;
    T* out = gxp + row * l.s;
    if (!batch_statistics) {
      // mean and rstd are constants: y = x * scale + shift
#pragma omp simd
      for (int64_t i = 0; i < l.s; ++i) out[i] = g[i] * scale;
      return;
    }
    // gx = scale * (gy - mean(gy) - xhat * mean(gy * xhat))
    const T* in = xp + row * l.s;
    const T m = mp[c], r = rp[c];
    const T mean_gy = sum_gy[c] * inv_count, mean_gy_xhat = sum_gy_xhat[c] * inv_count;
#pragma omp simd
    for (int64_t i = 0; i < l.s; ++i) out[i] = scale * (g[i] - mean_gy - (in[i] - m) * r * mean_gy_xhat);
  });
}

}  // namespace

void CpuKernels::batch_norm_statistics(const Tensor& x, const Tensor& mean, const Tensor& var) {
  Tensor xc = contiguous_input(x);
  dispatch_float(x.dtype(), "batch_norm", [&]<class T>() { statistics<T>(xc, mean, var); });
}

void CpuKernels::batch_norm_apply(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                                  const Tensor& bias, const Tensor& y) {
  Tensor xc = contiguous_input(x);
  dispatch_float(x.dtype(), "batch_norm", [&]<class T>() {
    apply<T>(xc, contiguous_input(mean), contiguous_input(rstd), contiguous_input(weight), contiguous_input(bias), y);
  });
}

void CpuKernels::batch_norm_backward(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                                     const Tensor& gy, bool batch_statistics, const Tensor& gx, const Tensor& gweight,
                                     const Tensor& gbias) {
  Tensor xc = contiguous_input(x), gyc = contiguous_input(gy);
  dispatch_float(x.dtype(), "batch_norm_backward", [&]<class T>() {
    backward<T>(xc, contiguous_input(mean), contiguous_input(rstd), contiguous_input(weight), gyc, batch_statistics,
                gx, gweight, gbias);
  });
}

}  // namespace remat::cpu
