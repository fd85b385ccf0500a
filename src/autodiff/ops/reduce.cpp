// Reductions over chosen axes: sum, mean, max (differentiable) and argmax (index result).
#include <algorithm>

#include "autodiff/kernels.h"
#include "autodiff/op.h"

namespace remat {

using autodiff::BackwardContext;
using autodiff::OpSpec;

namespace {

std::vector<int64_t> normalize_axes(const Tensor& x, const std::vector<int64_t>& axes, const char* op) {
  std::vector<int64_t> out;
  int64_t rank = x.dim();
  if (axes.empty()) {
    for (int64_t i = 0; i < rank; ++i) out.push_back(i);
    return out;
  }
  for (auto a : axes) {
    int64_t n = a < 0 ? a + rank : a;
    REMAT_CHECK(n >= 0 && n < rank, op, ": axis ", a, " out of range for shape ", shape_str(x.shape()));
    REMAT_CHECK(std::find(out.begin(), out.end(), n) == out.end(), op, ": axis ", a, " given twice");
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Shape keepdim_shape(const Shape& shape, const std::vector<int64_t>& axes) {
  Shape s = shape;
  for (auto a : axes) s[a] = 1;
  return s;
}

const OpSpec kSum{autodiff::OpKind::sum, autodiff::save_nothing};
const OpSpec kMean{autodiff::OpKind::mean, autodiff::save_nothing};
const OpSpec kMax{autodiff::OpKind::max, autodiff::save_inputs_and_outputs};

Tensor reduce_op(const OpSpec& spec, ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes_in, bool keepdim) {
  REMAT_CHECK(x.defined(), spec.name, ": input is undefined");
  REMAT_CHECK(is_floating(x.dtype()), spec.name, ": expects a floating tensor, got ", dtype_name(x.dtype()));
  auto axes = normalize_axes(x, axes_in, spec.name.c_str());
  if (op == ReduceOp::max)
    for (auto a : axes)
      REMAT_CHECK(x.shape()[a] > 0, "max: cannot reduce the empty axis ", a, " of shape ", shape_str(x.shape()));
  Shape kshape = keepdim_shape(x.shape(), axes);
  int64_t count = 1;
  for (auto a : axes) count *= x.shape()[a];
  return autodiff::apply1(
      spec, {x},
      [op, axes, keepdim](const TensorList& in) {
        return TensorList{kernels::reduce(op, in[0], axes, keepdim, in[0].dtype())};
      },
      [op, kshape, count](BackwardContext& ctx) {
        const Shape& xshape = ctx.input_meta(0).shape;
        Tensor g = ctx.grad_output(0).reshape(kshape);
        if (op == ReduceOp::sum) {
          ctx.set_input_grad(0, g.expand(xshape));
        } else if (op == ReduceOp::mean) {
          ctx.set_input_grad(0, kernels::unary(UnaryOp::mul_scalar, g, 1.0 / static_cast<double>(count)).expand(xshape));
        } else {
          // split the gradient evenly among the elements equal to the maximum
          Tensor x = ctx.input(0);
          Tensor y = ctx.output(0).reshape(kshape);
          Tensor diff = kernels::binary(BinaryOp::sub, x, y);
          Tensor mask = kernels::empty(xshape, x.dtype(), x.device());
          kernels::backend_of(x).where(diff, zeros({}, x.dtype(), memory::Tag::other, x.device()),
                                       ones({}, x.dtype(), memory::Tag::other, x.device()), mask);
          std::vector<int64_t> axes;
          for (size_t i = 0; i < kshape.size(); ++i)
            if (kshape[i] == 1 && xshape[i] != 1) axes.push_back(static_cast<int64_t>(i));
          Tensor ties = axes.empty() ? mask : kernels::reduce(ReduceOp::sum, mask, axes, true, x.dtype());
          ctx.set_input_grad(0, kernels::binary(BinaryOp::mul, mask, kernels::binary(BinaryOp::div, g, ties)));
        }
      },
      op == ReduceOp::max ? static_cast<double>(x.numel()) : static_cast<double>(x.numel()));
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  return reduce_op(kSum, ReduceOp::sum, x, axes, keepdim);
}
Tensor mean(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  return reduce_op(kMean, ReduceOp::mean, x, axes, keepdim);
}
Tensor max(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  return reduce_op(kMax, ReduceOp::max, x, axes, keepdim);
}

Tensor argmax(const Tensor& x, int64_t axis, bool keepdim) {
  REMAT_CHECK(x.defined(), "argmax: input is undefined");
  REMAT_CHECK(is_floating(x.dtype()), "argmax: expects a floating tensor, got ", dtype_name(x.dtype()));
  auto axes = normalize_axes(x, {axis}, "argmax");
  REMAT_CHECK(x.shape()[axes[0]] > 0, "argmax: cannot reduce the empty axis ", axis, " of shape ", shape_str(x.shape()));
  return kernels::reduce(ReduceOp::argmax, x, axes, keepdim, DType::i64);
}

Tensor Tensor::sum() const { return remat::sum(*this); }
Tensor Tensor::mean() const { return remat::mean(*this); }

}  // namespace remat
