// Internal: the elementwise formulas of the CUDA backend (unary ops, their derivatives, binary
// ops), the CPU's (src/tensor/cpu/elementwise.cpp), NaN propagation included: the kernels of
// elementwise.cu and the candidates of candidates/cuda/ compute each element with them.
#pragma once

#include "tensor/cuda/device_common.cuh"
#include "tensor/cuda/half.cuh"

namespace remat::cuda::elementwise {

using kernel::kGeluTanhCubic;
using kernel::kInvSqrt2;
using kernel::kInvSqrt2Pi;
using kernel::kSqrt2OverPi;

template <class T>
__device__ inline T sigmoid_of(T x) {
  return T(1) / (T(1) + exp(-x));
}

template <class T>
__device__ inline T unary_value(UnaryOp op, T x, T s) {
  switch (op) {
    case UnaryOp::neg: return -x;
    case UnaryOp::exp: return exp(x);
    case UnaryOp::log: return log(x);
    case UnaryOp::sqrt: return sqrt(x);
    case UnaryOp::abs: return fabs(x);
    case UnaryOp::tanh: return tanh(x);
    case UnaryOp::sigmoid: return sigmoid_of(x);
    case UnaryOp::relu: return x > T(0) || x != x ? x : T(0);  // NaN stays NaN
    case UnaryOp::gelu: return T(0.5) * x * (T(1) + erf(x * T(kInvSqrt2)));
    case UnaryOp::gelu_tanh: return T(0.5) * x * (T(1) + tanh(T(kSqrt2OverPi) * (x + T(kGeluTanhCubic) * x * x * x)));
    case UnaryOp::silu: return x * sigmoid_of(x);
    case UnaryOp::pow_scalar: return pow(x, s);
    case UnaryOp::square: return x * x;
    case UnaryOp::reciprocal: return T(1) / x;
    case UnaryOp::add_scalar: return x + s;
    case UnaryOp::mul_scalar: return x * s;
    case UnaryOp::sign: return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0));
  }
  return x;
}

// d op(x)/dx times gy, from x and/or y = op(x)
template <class T>
__device__ inline T unary_grad(UnaryOp op, T x, T y, T gy, T s) {
  switch (op) {
    case UnaryOp::neg: return -gy;
    case UnaryOp::exp: return gy * y;
    case UnaryOp::log: return gy / x;
    case UnaryOp::sqrt: return gy * T(0.5) / y;
    case UnaryOp::abs: return x > T(0) ? gy : (x < T(0) ? -gy : T(0));
    case UnaryOp::tanh: return gy * (T(1) - y * y);
    case UnaryOp::sigmoid: return gy * y * (T(1) - y);
    case UnaryOp::relu: return x > T(0) ? gy : T(0);
    case UnaryOp::gelu: {
      const T cdf = T(0.5) * (T(1) + erf(x * T(kInvSqrt2)));
      const T pdf = T(kInvSqrt2Pi) * exp(T(-0.5) * x * x);
      return gy * (cdf + x * pdf);
    }
    case UnaryOp::gelu_tanh: {
      const T inner = T(kSqrt2OverPi) * (x + T(kGeluTanhCubic) * x * x * x);
      const T t = tanh(inner);
      const T dinner = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluTanhCubic) * x * x);
      return gy * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * dinner);
    }
    case UnaryOp::silu: {
      const T sg = sigmoid_of(x);
      return gy * sg * (T(1) + x * (T(1) - sg));
    }
    case UnaryOp::pow_scalar: return gy * s * pow(x, s - T(1));
    case UnaryOp::square: return gy * T(2) * x;
    case UnaryOp::reciprocal: return -gy / (x * x);
    case UnaryOp::add_scalar: return gy;
    case UnaryOp::mul_scalar: return gy * s;
    case UnaryOp::sign: return T(0);
  }
  return gy;
}

template <class T>
__device__ inline T binary_value(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    // NaN propagates: a when a >= b (ties) or a is NaN; otherwise b (which may be NaN)
    case BinaryOp::maximum: return a >= b || a != a ? a : b;
    case BinaryOp::minimum: return a <= b || a != a ? a : b;
    case BinaryOp::maximum_picks_b: return a >= b || a != a ? T(0) : T(1);
    case BinaryOp::minimum_picks_b: return a <= b || a != a ? T(0) : T(1);
  }
  return a;
}

}  // namespace remat::cuda::elementwise
