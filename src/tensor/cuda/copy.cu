// CUDA data movement: copy (broadcasting a strided source to the destination's shape, converting
// dtypes), fill and arange. Conversions round as the CPU's (half.cuh): bf16 and f16 are copied and
// converted here, never widened (cuda/widen.cpp).
#include "tensor/cuda/device_common.cuh"
#include "tensor/cuda/half.cuh"

namespace remat::cuda {

namespace {

template <class Dst, class Src>
__global__ void copy_kernel(Layout<2> l, Dst* dst, const Src* src) {
  REMAT_GRID_LOOP(i, l.numel) {
    int64_t off[2];
    offsets_of(l, i, off);
    dst[off[0]] = convert<Dst>(src[off[1]]);
  }
}

template <class T>
__global__ void fill_kernel(Layout<1> l, T* dst, T value) {
  REMAT_GRID_LOOP(i, l.numel) {
    int64_t off[1];
    offsets_of(l, i, off);
    dst[off[0]] = value;
  }
}

template <class T>
__global__ void arange_kernel(T* dst, int64_t n, double start, double step) {
  // a rounded product, as on the CPU: a fused multiply-add would change the last bit
  REMAT_GRID_LOOP(i, n) { dst[i] = convert<T>(start + __dmul_rn(step, static_cast<double>(i))); }
}

// Calls f.template operator()<T>() for T the device type of `dtype` (any of the five).
template <class F>
void dispatch_any(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::i64: return f.template operator()<int64_t>();
    case DType::bf16: return f.template operator()<__nv_bfloat16>();
    case DType::f16: return f.template operator()<__half>();
  }
  throw Error(detail::concat("cuda: no kernel for dtype ", static_cast<int>(dtype)));
}

// The value a 16-bit tensor is filled with, as its bits (rounded once on the host, as the CPU does).
uint16_t bits_16(DType dtype, double value) {
  return dtype == DType::bf16 ? bfloat16(value).bits : float16(value).bits;
}

}  // namespace

void CudaBackend::copy(const Tensor& src, const Tensor& dst) {
  if (dst.numel() == 0) return;
  DeviceGuard guard(device_);
  const Layout<2> l = make_layout<2>(dst.shape(), {&dst, &src});
  // one contiguous run of the same dtype: a device memcpy
  if (src.dtype() == dst.dtype() && l.rank == 1 && l.strides[0][0] == 1 && l.strides[1][0] == 1) {
    const size_t size = dtype_size(dst.dtype());
    check(cudaMemcpyAsync(static_cast<char*>(dst.storage()->data()) + l.offsets[0] * size,
                          static_cast<const char*>(src.storage()->data()) + l.offsets[1] * size,
                          static_cast<size_t>(l.numel) * size, cudaMemcpyDeviceToDevice, stream_),
          "cudaMemcpyAsync (copy)");
    note_launch("copy (memcpy)");
    return;
  }
  dispatch_any(dst.dtype(), [&]<class Dst>() {
    dispatch_any(src.dtype(), [&]<class Src>() {
      copy_kernel<Dst, Src><<<grid_for(l.numel), kThreads, 0, stream_>>>(
          l, static_cast<Dst*>(dst.storage()->data()), static_cast<const Src*>(src.storage()->data()));
    });
  });
  check_launch("copy");
}

void CudaBackend::fill(const Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  DeviceGuard guard(device_);
  const Layout<1> l = make_layout<1>(dst.shape(), {&dst});
  if (is_16bit_float(dst.dtype())) {
    fill_kernel<uint16_t><<<grid_for(l.numel), kThreads, 0, stream_>>>(
        l, static_cast<uint16_t*>(dst.storage()->data()), bits_16(dst.dtype(), value));
    return check_launch("fill");
  }
  dispatch_any(dst.dtype(), [&]<class T>() {
    if constexpr (!is_half_v<T>)
      fill_kernel<T><<<grid_for(l.numel), kThreads, 0, stream_>>>(l, static_cast<T*>(dst.storage()->data()),
                                                                  static_cast<T>(value));
  });
  check_launch("fill");
}

void CudaBackend::arange(const Tensor& dst, double start, double step) {
  REMAT_ASSERT(dst.is_contiguous());
  const int64_t n = dst.numel();
  if (n == 0) return;
  DeviceGuard guard(device_);
  dispatch_any(dst.dtype(), [&]<class T>() {
    arange_kernel<T><<<grid_for(n), kThreads, 0, stream_>>>(ptr<T>(dst), n, start, step);
  });
  check_launch("arange");
}

}  // namespace remat::cuda
