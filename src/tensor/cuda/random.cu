// CUDA random fills and dropout from the counter-based Philox stream of remat/random.h: element i
// of rand uses word i, of randn words 2i and 2i + 1 (Box-Muller), of dropout word i, exactly as
// on the CPU (src/tensor/cpu/cpu_backend.cpp, indexing.cpp), so the values and the dropout mask
// are the CPU's for the same RngState. The uniform conversions are the CPU's bit for bit; randn's
// log and cos come from the device's math library and may differ from the host's in the last bit.
#include "tensor/cuda/device_common.cuh"

namespace remat::cuda {

namespace {

__device__ inline float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ inline double mul_rn(double a, double b) { return __dmul_rn(a, b); }

template <class T>
__global__ void uniform_kernel(T* dst, int64_t n, uint64_t seed, uint64_t offset, T low, T span) {
  REMAT_GRID_LOOP(i, n) {
    const uint32_t w = philox_word_at(seed, offset, static_cast<uint64_t>(i));
    const T u = std::is_same_v<T, float> ? static_cast<T>(uniform_f(w)) : static_cast<T>(uniform_d(w));
    dst[i] = low + mul_rn(span, u);  // a rounded product, as on the CPU: no fused multiply-add
  }
}

template <class T>
__global__ void normal_kernel(T* dst, int64_t n, uint64_t seed, uint64_t offset, double mean, double stddev) {
  REMAT_GRID_LOOP(i, n) {
    const uint32_t w0 = philox_word_at(seed, offset, 2 * static_cast<uint64_t>(i));
    const uint32_t w1 = philox_word_at(seed, offset, 2 * static_cast<uint64_t>(i) + 1);
    const double u1 = (static_cast<double>(w0) + 1.0) * (1.0 / 4294967297.0);  // (0, 1)
    const double u2 = uniform_d(w1);
    const double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    dst[i] = static_cast<T>(mean + __dmul_rn(stddev, z));
  }
}

// y[i] = keep(i) ? x[i] * scale : 0, keep(i) iff uniform_float(word i) >= p (compared in double,
// as on the CPU).
template <class T>
__global__ void dropout_kernel(const T* x, T* y, int64_t n, double p, T scale, uint64_t seed, uint64_t offset) {
  REMAT_GRID_LOOP(i, n) {
    const bool keep = static_cast<double>(uniform_f(philox_word_at(seed, offset, static_cast<uint64_t>(i)))) >= p;
    y[i] = keep ? x[i] * scale : T(0);
  }
}

}  // namespace

void CudaBackend::rand_uniform(const Tensor& dst, RngState state, double low, double high) {
  REMAT_ASSERT(dst.is_contiguous());
  const int64_t n = dst.numel();
  if (n == 0) return;
  DeviceGuard guard(device_);
  dispatch_float(dst.dtype(), "rand", [&]<class T>() {
    uniform_kernel<T><<<grid_for(n), kThreads, 0, stream_>>>(ptr<T>(dst), n, state.seed, state.offset,
                                                             static_cast<T>(low), static_cast<T>(high - low));
  });
  check_launch("rand");
}

void CudaBackend::rand_normal(const Tensor& dst, RngState state, double mean, double stddev) {
  REMAT_ASSERT(dst.is_contiguous());
  const int64_t n = dst.numel();
  if (n == 0) return;
  DeviceGuard guard(device_);
  dispatch_float(dst.dtype(), "randn", [&]<class T>() {
    normal_kernel<T><<<grid_for(n), kThreads, 0, stream_>>>(ptr<T>(dst), n, state.seed, state.offset, mean, stddev);
  });
  check_launch("randn");
}

void CudaBackend::dropout(const Tensor& x_in, double p, RngState state, const Tensor& y) {
  REMAT_ASSERT(y.is_contiguous(), "dropout: output of shape ", shape_str(y.shape()), " is not contiguous");
  REMAT_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability ", p, " is outside [0, 1]");
  const int64_t n = y.numel();
  if (n == 0) return;
  if (p == 0.0) return copy(x_in, y);
  if (p == 1.0) return fill(y, 0.0);
  DeviceGuard guard(device_);
  Tensor x = contiguous(x_in);
  dispatch_float(y.dtype(), "dropout", [&]<class T>() {
    dropout_kernel<T><<<grid_for(n), kThreads, 0, stream_>>>(ptr<T>(x), ptr<T>(y), n, p,
                                                             static_cast<T>(1.0 / (1.0 - p)), state.seed, state.offset);
  });
  check_launch("dropout");
}

}  // namespace remat::cuda
