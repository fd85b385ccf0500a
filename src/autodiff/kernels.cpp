#include "autodiff/kernels.h"

#include <algorithm>

#include "tensor/allocate.h"

namespace remat::kernels {

Tensor empty(const Shape& shape, DType dtype, Device device) {
  // no op name here: autodiff::apply prefixes the op's name to a failed allocation's message
  return detail::allocate_tensor(nullptr, shape, dtype, memory::Tag::other, device);
}

Tensor unary(UnaryOp op, const Tensor& x, double scalar) {
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  backend_of(x).unary(op, x, y, scalar);
  return y;
}

Tensor unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& gy, double scalar) {
  Tensor gx = empty(gy.shape(), gy.dtype(), gy.device());
  backend_of(gy).unary_backward(op, x, y, gy, gx, scalar);
  return gx;
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  Tensor out = empty(broadcast_shapes(a.shape(), b.shape(), binary_op_name(op)), a.dtype(), a.device());
  backend_of(a).binary(op, a, b, out);
  return out;
}

Tensor copy(const Tensor& x) {
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  backend_of(x).copy(x, out);
  return out;
}

Tensor convert(const Tensor& x, DType dtype) {
  Tensor out = empty(x.shape(), dtype, x.device());
  backend_of(x).copy(x, out);
  return out;
}

Tensor reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, bool keepdim, DType out_dtype) {
  Shape shape;
  for (int64_t i = 0; i < x.dim(); ++i) {
    bool r = std::find(axes.begin(), axes.end(), i) != axes.end();
    if (!r) shape.push_back(x.shape()[i]);
    else if (keepdim) shape.push_back(1);
  }
  Tensor out = empty(shape, out_dtype, x.device());
  backend_of(x).reduce(op, x, axes, out);
  return out;
}

}  // namespace remat::kernels
