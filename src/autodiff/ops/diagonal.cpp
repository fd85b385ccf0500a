// diagonal: the strided view along the diagonal of two axes (einsum's repeated indices: "ii->i",
// "bii->b" after a sum). Forward is a view (no copy); the backward writes the gradient into the
// diagonal of a zero tensor of the input's shape.
#include "autodiff/kernels.h"
#include "autodiff/op.h"

namespace remat {

using autodiff::BackwardContext;
using autodiff::OpSpec;

namespace {
const OpSpec kDiagonal{autodiff::OpKind::diagonal, autodiff::save_nothing};
}

Tensor diagonal(const Tensor& x, int64_t axis1, int64_t axis2) {
  REMAT_CHECK(x.defined(), "diagonal: input is undefined");
  const int64_t rank = x.dim();
  const int64_t a = axis1 < 0 ? axis1 + rank : axis1, b = axis2 < 0 ? axis2 + rank : axis2;
  REMAT_CHECK(a >= 0 && a < rank && b >= 0 && b < rank, "diagonal: axes ", axis1, " and ", axis2,
              " out of range for shape ", shape_str(x.shape()));
  REMAT_CHECK(a != b, "diagonal: the two axes must differ, got ", axis1, " and ", axis2, " for shape ",
              shape_str(x.shape()));
  return autodiff::apply1(
      kDiagonal, {x},
      [a, b](const TensorList& in) {
        const Tensor& t = in[0];
        Shape shape;
        Strides strides;
        for (int64_t i = 0; i < t.dim(); ++i) {
          if (i == a || i == b) continue;
          shape.push_back(t.shape()[i]);
          strides.push_back(t.strides()[i]);
        }
        shape.push_back(std::min(t.shape()[a], t.shape()[b]));
        strides.push_back(t.strides()[a] + t.strides()[b]);
        auto impl = std::make_shared<TensorImpl>();
        impl->storage = t.storage();
        impl->offset = t.offset();
        impl->shape = std::move(shape);
        impl->strides = std::move(strides);
        impl->dtype = t.dtype();
        return TensorList{Tensor(std::move(impl))};
      },
      [a, b](BackwardContext& ctx) {
        const auto& meta = ctx.input_meta(0);
        Tensor gx = zeros(meta.shape, meta.dtype, memory::Tag::other, meta.device);
        diagonal(gx, a, b).copy_(ctx.grad_output(0));
        ctx.set_input_grad(0, gx);
      },
      0);
}

}  // namespace remat
