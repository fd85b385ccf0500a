// Internal: shared validation for the sliding-window ops (conv.cpp, pool.cpp): checked sizes
// and the output length of a window sliding along one axis.
#pragma once

#include <cstdint>
#include <limits>

#include "remat/error.h"
#include "remat/tensor.h"

namespace remat::window {

// Bounds on window parameters: far beyond any real image, small enough that no product of two
// of them overflows int64.
inline constexpr int64_t kMaxParameter = int64_t{1} << 30;

// a * b, or an error naming `op` when it overflows the element count a tensor may have.
inline int64_t checked_mul(int64_t a, int64_t b, const char* op, const char* what) {
  int64_t r = 0;
  REMAT_CHECK(!__builtin_mul_overflow(a, b, &r) && r <= (int64_t{1} << 53), op, ": ", what, " (", a, " x ", b,
              ") is too large");
  return r;
}

inline int64_t checked_numel(const Shape& shape, const char* op) {
  int64_t n = 1;
  for (auto d : shape) n = checked_mul(n, d, op, "the output size");
  return n;
}

// Output length along one axis of length `len`; throws when the window does not fit.
// ceil_mode: rounds up, then drops a last window that would start in the right padding.
inline int64_t output_length(const char* op, const char* axis, int64_t len, int64_t kernel, int64_t stride,
                             int64_t padding, int64_t dilation, bool ceil_mode, const Tensor& x) {
  REMAT_CHECK(kernel >= 1 && kernel <= kMaxParameter, op, ": the kernel's ", axis, " must be in [1, ", kMaxParameter,
              "], got ", kernel);
  const int64_t extent = dilation * (kernel - 1) + 1;  // the dilated kernel
  const int64_t span = len + 2 * padding - extent;
  REMAT_CHECK(span >= 0, op, ": the ", axis, " of the input of shape ", shape_str(x.shape()), " (", len,
              " plus padding 2 x ", padding, ") is smaller than the dilated kernel (", extent, ")");
  int64_t out = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
  if (ceil_mode && (out - 1) * stride >= len + padding) --out;
  return out;
}

inline void check_parameter(const char* op, const char* what, int64_t value, int64_t minimum) {
  REMAT_CHECK(value >= minimum && value <= kMaxParameter, op, ": ", what, " must be in [", minimum, ", ",
              kMaxParameter, "], got ", value);
}

}  // namespace remat::window
