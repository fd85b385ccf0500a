// Internal: allocating wrappers around the device backend, used by op definitions. They do no
// autodiff and no validation beyond what the kernels need; ops validate before calling them.
#pragma once

#include "remat/backend.h"
#include "remat/tensor.h"

namespace remat::kernels {

inline Backend& backend_of(const Tensor& t) { return backend(t.device()); }
Tensor empty(const Shape& shape, DType dtype, Device device);
Tensor unary(UnaryOp op, const Tensor& x, double scalar = 0.0);
Tensor unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& gy, double scalar = 0.0);
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
Tensor copy(const Tensor& x);  // contiguous copy
// x itself if contiguous, else a contiguous copy (for kernels that need contiguous inputs).
inline Tensor contiguous(const Tensor& x) { return x.is_contiguous() ? x : copy(x); }
Tensor convert(const Tensor& x, DType dtype);
// Reduces over sorted unique axes; result shape drops those axes (keepdim keeps them as 1).
Tensor reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, bool keepdim, DType out_dtype);

}  // namespace remat::kernels
