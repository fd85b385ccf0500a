// Internal: bf16 and f16 elements on the device (CUDA's __nv_bfloat16 and __half, the bits of
// remat::bfloat16 and remat::float16) and conversions between every element type, rounded as the
// CPU rounds (tensor.h): a 16-bit value widens exactly; a float or a double narrows to 16 bits
// once, to nearest, ties to even (a double is not rounded to float first); bf16 and f16 convert
// to each other through float, exactly as on the CPU. Kernels written for a storage type S
// compute in Compute<S> (float for the 16-bit types) and dispatch with dispatch_storage. Included
// only by src/tensor/cuda/.
//
//   convert<__nv_bfloat16>(1.0 / 3.0)    // bf16 nearest to the double
//   float x = convert<float>(h);          // exact
//   y[i] = convert<S>(f(convert<Compute<S>>(x[i])));   // one rounding per output
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "tensor/kernel_common.h"

namespace remat::cuda {

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

// The arithmetic type of elements stored as T: float for bf16 and f16, T itself otherwise.
template <class T>
using Compute = std::conditional_t<is_half_v<T>, float, T>;

// kernel::dispatch_float, and with them __nv_bfloat16 and __half for bf16 and f16 (kernels widen
// their elements to float, compute, and round each result once).
template <class F>
decltype(auto) dispatch_storage(DType dtype, const char* op, F&& f) {
  if (dtype == DType::bf16) return f.template operator()<__nv_bfloat16>();
  if (dtype == DType::f16) return f.template operator()<__half>();
  return kernel::dispatch_float(dtype, op, std::forward<F>(f));
}

// v as a To (float, double, int64_t, __nv_bfloat16 or __half).
template <class To, class From>
__device__ __forceinline__ To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, __nv_bfloat16>) {
    return convert<To>(__bfloat162float(v));
  } else if constexpr (std::is_same_v<From, __half>) {
    return convert<To>(__half2float(v));
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    if constexpr (std::is_same_v<From, float>) return __float2bfloat16_rn(v);
    else return __double2bfloat16(static_cast<double>(v));
  } else if constexpr (std::is_same_v<To, __half>) {
    if constexpr (std::is_same_v<From, float>) return __float2half_rn(v);
    else return __double2half(static_cast<double>(v));
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace remat::cuda
