// CPU elementwise kernels: unary ops and their derivatives, broadcasting binary ops, where.
#include <cmath>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/cpu_level.h"
#include "tensor/cpu/vmath.h"

namespace remat {

const char* unary_op_name(UnaryOp op) {
  static const char* names[] = {"neg",  "exp",     "log",  "sqrt",       "abs",        "tanh",
                                "sigmoid", "relu", "gelu", "gelu_tanh", "silu",       "pow",
                                "square", "reciprocal", "add_scalar", "mul_scalar", "sign"};
  return names[static_cast<int>(op)];
}

const char* binary_op_name(BinaryOp op) {
  static const char* names[] = {"add", "sub", "mul", "div", "maximum", "minimum", "maximum_picks_b", "minimum_picks_b"};
  return names[static_cast<int>(op)];
}

}  // namespace remat

namespace remat::cpu {

namespace {

using kernel::kGeluTanhCubic;
using kernel::kInvSqrt2;
using kernel::kInvSqrt2Pi;
using kernel::kSqrt2OverPi;

// float32 uses the vectorisable functions of vmath.h; float64 the C library.
template <class T>
__attribute__((always_inline)) inline T exp_of(T x) {
  if constexpr (std::is_same_v<T, float>) return vmath::exp_f(x);
  else return std::exp(x);
}
template <class T>
__attribute__((always_inline)) inline T tanh_of(T x) {
  if constexpr (std::is_same_v<T, float>) return vmath::tanh_f(x);
  else return std::tanh(x);
}
template <class T>
__attribute__((always_inline)) inline T erf_of(T x) {
  if constexpr (std::is_same_v<T, float>) return vmath::erf_f(x);
  else return std::erf(x);
}
template <class T>
__attribute__((always_inline)) inline T sigmoid_of(T x) {
  return T(1) / (T(1) + exp_of(-x));
}

template <UnaryOp Op, class T>
__attribute__((always_inline)) inline T unary_value(T x, T s) {
  if constexpr (Op == UnaryOp::neg) return -x;
  else if constexpr (Op == UnaryOp::exp) return exp_of(x);
  else if constexpr (Op == UnaryOp::log) return std::log(x);
  else if constexpr (Op == UnaryOp::sqrt) return std::sqrt(x);
  else if constexpr (Op == UnaryOp::abs) return std::abs(x);
  else if constexpr (Op == UnaryOp::tanh) return tanh_of(x);
  else if constexpr (Op == UnaryOp::sigmoid) return sigmoid_of(x);
  else if constexpr (Op == UnaryOp::relu) return x > T(0) || x != x ? x : T(0);  // NaN stays NaN
  else if constexpr (Op == UnaryOp::gelu) return T(0.5) * x * (T(1) + erf_of(x * T(kInvSqrt2)));
  else if constexpr (Op == UnaryOp::gelu_tanh)
    return T(0.5) * x * (T(1) + tanh_of(T(kSqrt2OverPi) * (x + T(kGeluTanhCubic) * x * x * x)));
  else if constexpr (Op == UnaryOp::silu) return x * sigmoid_of(x);
  else if constexpr (Op == UnaryOp::pow_scalar) return std::pow(x, s);
  else if constexpr (Op == UnaryOp::square) return x * x;
  else if constexpr (Op == UnaryOp::reciprocal) return T(1) / x;
  else if constexpr (Op == UnaryOp::add_scalar) return x + s;
  else if constexpr (Op == UnaryOp::mul_scalar) return x * s;
  else if constexpr (Op == UnaryOp::sign) return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0));
}

// d op(x)/dx times gy, using x and/or y = op(x)
template <UnaryOp Op, class T>
__attribute__((always_inline)) inline T unary_grad(T x, T y, T gy, T s) {
  if constexpr (Op == UnaryOp::neg) return -gy;
  else if constexpr (Op == UnaryOp::exp) return gy * y;
  else if constexpr (Op == UnaryOp::log) return gy / x;
  else if constexpr (Op == UnaryOp::sqrt) return gy * T(0.5) / y;
  else if constexpr (Op == UnaryOp::abs) return x > T(0) ? gy : (x < T(0) ? -gy : T(0));
  else if constexpr (Op == UnaryOp::tanh) return gy * (T(1) - y * y);
  else if constexpr (Op == UnaryOp::sigmoid) return gy * y * (T(1) - y);
  else if constexpr (Op == UnaryOp::relu) return x > T(0) ? gy : T(0);
  else if constexpr (Op == UnaryOp::gelu) {
    T cdf = T(0.5) * (T(1) + erf_of(x * T(kInvSqrt2)));
    T pdf = T(kInvSqrt2Pi) * exp_of(T(-0.5) * x * x);
    return gy * (cdf + x * pdf);
  } else if constexpr (Op == UnaryOp::gelu_tanh) {
    T inner = T(kSqrt2OverPi) * (x + T(kGeluTanhCubic) * x * x * x);
    T t = tanh_of(inner);
    T dinner = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluTanhCubic) * x * x);
    return gy * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * dinner);
  } else if constexpr (Op == UnaryOp::silu) {
    T sg = sigmoid_of(x);
    return gy * sg * (T(1) + x * (T(1) - sg));
  } else if constexpr (Op == UnaryOp::pow_scalar) return gy * s * std::pow(x, s - T(1));
  else if constexpr (Op == UnaryOp::square) return gy * T(2) * x;
  else if constexpr (Op == UnaryOp::reciprocal) return -gy / (x * x);
  else if constexpr (Op == UnaryOp::add_scalar) return gy;
  else if constexpr (Op == UnaryOp::mul_scalar) return gy * s;
  else if constexpr (Op == UnaryOp::sign) return T(0);
}

// Contiguous float32 loops, compiled for AVX-512, AVX2 and baseline x86-64, the process's level
// picked once (cpu_level.h), so the library runs on any x86-64.
#define REMAT_UNARY_OPS(X)                                                                        \
  X(neg) X(exp) X(log) X(sqrt) X(abs) X(tanh) X(sigmoid) X(relu) X(gelu) X(gelu_tanh) X(silu)   \
  X(pow_scalar) X(square) X(reciprocal) X(add_scalar) X(mul_scalar) X(sign)

REMAT_CPU_LEVELS(void, unary_f32_contiguous, (UnaryOp op, const float* __restrict x, float* __restrict y, int64_t n,
                                              float s),
                 (op, x, y, n, s)) {
  if (op == UnaryOp::gelu) return gelu_f32_contiguous(x, y, n);  // hand-vectorised (gelu.cpp)
  switch (op) {
#define REMAT_CASE(name)                                                              \
  case UnaryOp::name:                                                                 \
    _Pragma("omp simd") for (int64_t i = 0; i < n; ++i) y[i] = unary_value<UnaryOp::name, float>(x[i], s); \
    break;
    REMAT_UNARY_OPS(REMAT_CASE)
#undef REMAT_CASE
  }
}

REMAT_CPU_LEVELS(void, unary_backward_f32_contiguous,
                 (UnaryOp op, const float* __restrict x, const float* __restrict y, const float* __restrict gy,
                  float* __restrict gx, int64_t n, float s),
                 (op, x, y, gy, gx, n, s)) {
  if (op == UnaryOp::gelu) return gelu_backward_f32_contiguous(x, gy, gx, n);  // gelu.cpp
  switch (op) {
#define REMAT_CASE(name)                                                                                  \
  case UnaryOp::name:                                                                                     \
    _Pragma("omp simd") for (int64_t i = 0; i < n; ++i) gx[i] = unary_grad<UnaryOp::name, float>(x[i], y[i], gy[i], s); \
    break;
    REMAT_UNARY_OPS(REMAT_CASE)
#undef REMAT_CASE
  }
}

template <UnaryOp Op, class T>
void unary_kernel(const Tensor& x, const Tensor& y, double scalar) {
  auto layout = make_layout<2>(y.shape(), {broadcast_strides(y, y.shape()), broadcast_strides(x, y.shape())},
                               {y.offset(), x.offset()});
  T* yd = static_cast<T*>(y.storage()->data());
  const T* xd = static_cast<const T*>(x.storage()->data());
  const T s = static_cast<T>(scalar);
  for_each_run<2>(layout, [&](int64_t n, std::array<int64_t, 2> off, std::array<int64_t, 2> st) {
    T* __restrict yp = yd + off[0];
    const T* __restrict xp = xd + off[1];
    if (st[0] == 1 && st[1] == 1) {
      if constexpr (std::is_same_v<T, float>) {
        unary_f32_contiguous(Op, xp, yp, n, s);
      } else {
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) yp[i] = unary_value<Op, T>(xp[i], s);
      }
    } else {
      for (int64_t i = 0; i < n; ++i) yp[i * st[0]] = unary_value<Op, T>(xp[i * st[1]], s);
    }
  });
}

template <UnaryOp Op, class T>
void unary_backward_kernel(const Tensor& x, const Tensor& y, const Tensor& gy, const Tensor& gx, double scalar) {
  // x or y may be undefined when the derivative does not need it; use gy as a stand-in.
  const Tensor& xs = x.defined() ? x : gy;
  const Tensor& ys = y.defined() ? y : gy;
  const Shape& shape = gx.shape();
  auto layout = make_layout<4>(shape,
                               {broadcast_strides(gx, shape), broadcast_strides(xs, shape), broadcast_strides(ys, shape),
                                broadcast_strides(gy, shape)},
                               {gx.offset(), xs.offset(), ys.offset(), gy.offset()});
  T* gxd = static_cast<T*>(gx.storage()->data());
  const T* xd = static_cast<const T*>(xs.storage()->data());
  const T* yd = static_cast<const T*>(ys.storage()->data());
  const T* gyd = static_cast<const T*>(gy.storage()->data());
  const T s = static_cast<T>(scalar);
  for_each_run<4>(layout, [&](int64_t n, std::array<int64_t, 4> off, std::array<int64_t, 4> st) {
    T* gxp = gxd + off[0];
    const T* xp = xd + off[1];
    const T* yp = yd + off[2];
    const T* gyp = gyd + off[3];
    if (st[0] == 1 && st[1] == 1 && st[2] == 1 && st[3] == 1) {
      if constexpr (std::is_same_v<T, float>) {
        unary_backward_f32_contiguous(Op, xp, yp, gyp, gxp, n, s);
      } else {
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) gxp[i] = unary_grad<Op, T>(xp[i], yp[i], gyp[i], s);
      }
    } else {
      for (int64_t i = 0; i < n; ++i)
        gxp[i * st[0]] = unary_grad<Op, T>(xp[i * st[1]], yp[i * st[2]], gyp[i * st[3]], s);
    }
  });
}

template <class T, class F>
void dispatch_unary(UnaryOp op, F&& f) {
#define REMAT_UNARY_CASE(name) \
  case UnaryOp::name: return f.template operator()<UnaryOp::name, T>();
  switch (op) {
    REMAT_UNARY_CASE(neg) REMAT_UNARY_CASE(exp) REMAT_UNARY_CASE(log) REMAT_UNARY_CASE(sqrt)
    REMAT_UNARY_CASE(abs) REMAT_UNARY_CASE(tanh) REMAT_UNARY_CASE(sigmoid) REMAT_UNARY_CASE(relu)
    REMAT_UNARY_CASE(gelu) REMAT_UNARY_CASE(gelu_tanh) REMAT_UNARY_CASE(silu) REMAT_UNARY_CASE(pow_scalar)
    REMAT_UNARY_CASE(square) REMAT_UNARY_CASE(reciprocal) REMAT_UNARY_CASE(add_scalar)
    REMAT_UNARY_CASE(mul_scalar) REMAT_UNARY_CASE(sign)
  }
#undef REMAT_UNARY_CASE
}

template <BinaryOp Op, class T>
inline T binary_value(T a, T b) {
  if constexpr (Op == BinaryOp::add) return a + b;
  else if constexpr (Op == BinaryOp::sub) return a - b;
  else if constexpr (Op == BinaryOp::mul) return a * b;
  else if constexpr (Op == BinaryOp::div) return a / b;
  // NaN propagates: a when a >= b (ties) or a is NaN; otherwise b (which may be NaN)
  else if constexpr (Op == BinaryOp::maximum) return a >= b || a != a ? a : b;
  else if constexpr (Op == BinaryOp::minimum) return a <= b || a != a ? a : b;
  else if constexpr (Op == BinaryOp::maximum_picks_b) return a >= b || a != a ? T(0) : T(1);
  else if constexpr (Op == BinaryOp::minimum_picks_b) return a <= b || a != a ? T(0) : T(1);
}

// Contiguous float32 runs (a_step, b_step: 1 for a vector, 0 for a broadcast scalar), per level.
template <BinaryOp Op>
__attribute__((always_inline)) inline void binary_f32_run(const float* __restrict a, int64_t a_step, const float* __restrict b,
                                      int64_t b_step, float* __restrict out, int64_t n) {
  if (a_step == 1 && b_step == 1) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = binary_value<Op, float>(a[i], b[i]);
  } else if (a_step == 1) {
    const float bv = b[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = binary_value<Op, float>(a[i], bv);
  } else {
    const float av = a[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = binary_value<Op, float>(av, b[i]);
  }
}

REMAT_CPU_LEVELS(void, binary_f32_contiguous,
                 (BinaryOp op, const float* a, int64_t a_step, const float* b, int64_t b_step, float* out, int64_t n),
                 (op, a, a_step, b, b_step, out, n)) {
  switch (op) {
#define REMAT_CASE(name) \
  case BinaryOp::name: return binary_f32_run<BinaryOp::name>(a, a_step, b, b_step, out, n);
    REMAT_CASE(add) REMAT_CASE(sub) REMAT_CASE(mul) REMAT_CASE(div) REMAT_CASE(maximum) REMAT_CASE(minimum)
    REMAT_CASE(maximum_picks_b) REMAT_CASE(minimum_picks_b)
#undef REMAT_CASE
  }
}

template <BinaryOp Op, class T>
void binary_kernel(const Tensor& a, const Tensor& b, const Tensor& out) {
  const Shape& shape = out.shape();
  auto layout = make_layout<3>(shape, {broadcast_strides(out, shape), broadcast_strides(a, shape), broadcast_strides(b, shape)},
                               {out.offset(), a.offset(), b.offset()});
  T* od = static_cast<T*>(out.storage()->data());
  const T* ad = static_cast<const T*>(a.storage()->data());
  const T* bd = static_cast<const T*>(b.storage()->data());
  for_each_run<3>(layout, [&](int64_t n, std::array<int64_t, 3> off, std::array<int64_t, 3> st) {
    T* op = od + off[0];
    const T* ap = ad + off[1];
    const T* bp = bd + off[2];
    const bool unit_out = st[0] == 1, a_run = st[1] == 1 || st[1] == 0, b_run = st[2] == 1 || st[2] == 0;
    if (std::is_same_v<T, float> && unit_out && a_run && b_run && st[1] + st[2] >= 1) {
      binary_f32_contiguous(Op, reinterpret_cast<const float*>(ap), st[1], reinterpret_cast<const float*>(bp), st[2],
                            reinterpret_cast<float*>(op), n);
    } else if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) op[i] = binary_value<Op, T>(ap[i], bp[i]);
    } else if (st[0] == 1 && st[1] == 1 && st[2] == 0) {
      const T bv = bp[0];
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) op[i] = binary_value<Op, T>(ap[i], bv);
    } else if (st[0] == 1 && st[1] == 0 && st[2] == 1) {
      const T av = ap[0];
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) op[i] = binary_value<Op, T>(av, bp[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) op[i * st[0]] = binary_value<Op, T>(ap[i * st[1]], bp[i * st[2]]);
    }
  });
}

}  // namespace

void CpuKernels::unary(UnaryOp op, const Tensor& x, const Tensor& y, double scalar) {
  if (y.numel() == 0) return;
  dispatch_float(y.dtype(), unary_op_name(op), [&]<class scalar_t>() {
    dispatch_unary<scalar_t>(op, [&]<UnaryOp O, class T>() { unary_kernel<O, T>(x, y, scalar); });
  });
}

void CpuKernels::unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& gy, const Tensor& gx,
                                double scalar) {
  if (gx.numel() == 0) return;
  dispatch_float(gx.dtype(), unary_op_name(op), [&]<class scalar_t>() {
    dispatch_unary<scalar_t>(op, [&]<UnaryOp O, class T>() { unary_backward_kernel<O, T>(x, y, gy, gx, scalar); });
  });
}

void CpuKernels::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.numel() == 0) return;
  dispatch_float(out.dtype(), binary_op_name(op), [&]<class scalar_t>() {
    switch (op) {
      case BinaryOp::add: return binary_kernel<BinaryOp::add, scalar_t>(a, b, out);
      case BinaryOp::sub: return binary_kernel<BinaryOp::sub, scalar_t>(a, b, out);
      case BinaryOp::mul: return binary_kernel<BinaryOp::mul, scalar_t>(a, b, out);
      case BinaryOp::div: return binary_kernel<BinaryOp::div, scalar_t>(a, b, out);
      case BinaryOp::maximum: return binary_kernel<BinaryOp::maximum, scalar_t>(a, b, out);
      case BinaryOp::minimum: return binary_kernel<BinaryOp::minimum, scalar_t>(a, b, out);
      case BinaryOp::maximum_picks_b: return binary_kernel<BinaryOp::maximum_picks_b, scalar_t>(a, b, out);
      case BinaryOp::minimum_picks_b: return binary_kernel<BinaryOp::minimum_picks_b, scalar_t>(a, b, out);
    }
  });
}

template <class C, class T>
static void where_kernel(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  const Shape& shape = out.shape();
  auto layout = make_layout<4>(shape,
                               {broadcast_strides(out, shape), broadcast_strides(cond, shape), broadcast_strides(a, shape),
                                broadcast_strides(b, shape)},
                               {out.offset(), cond.offset(), a.offset(), b.offset()});
  T* od = static_cast<T*>(out.storage()->data());
  const C* cd = static_cast<const C*>(cond.storage()->data());
  const T* ad = static_cast<const T*>(a.storage()->data());
  const T* bd = static_cast<const T*>(b.storage()->data());
  for_each_run<4>(layout, [&](int64_t n, std::array<int64_t, 4> off, std::array<int64_t, 4> st) {
    for (int64_t i = 0; i < n; ++i)
      od[off[0] + i * st[0]] = cd[off[1] + i * st[1]] != C(0) ? ad[off[2] + i * st[2]] : bd[off[3] + i * st[3]];
  });
}

void CpuKernels::where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.numel() == 0) return;
  dispatch_float(out.dtype(), "where", [&]<class scalar_t>() {
    switch (cond.dtype()) {
      case DType::f32: return where_kernel<float, scalar_t>(cond, a, b, out);
      case DType::f64: return where_kernel<double, scalar_t>(cond, a, b, out);
      case DType::i64: return where_kernel<int64_t, scalar_t>(cond, a, b, out);
      case DType::bf16:
      case DType::f16: REMAT_ASSERT(false, "where: a 16-bit condition is widened first (widen.cpp)");
    }
  });
}

}  // namespace remat::cpu
