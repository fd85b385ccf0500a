// Binary elementwise ops with NumPy broadcasting, where/masked_fill, and sum_to (the reduction
// that undoes broadcasting in every backward).
#include <algorithm>

#include "autodiff/kernels.h"
#include "autodiff/op.h"

namespace remat {

using autodiff::BackwardContext;
using autodiff::OpSpec;

namespace {

void check_pair(const Tensor& a, const Tensor& b, const char* op) {
  REMAT_CHECK(a.defined() && b.defined(), op, ": input is undefined");
  REMAT_CHECK(is_floating(a.dtype()) && a.dtype() == b.dtype(), op, ": dtypes must be equal floating types, got ",
              dtype_name(a.dtype()), " ", shape_str(a.shape()), " and ", dtype_name(b.dtype()), " ",
              shape_str(b.shape()));
  REMAT_CHECK(a.device() == b.device(), op, ": input 0 is on ", device_name(a.device()), ", input 1 on ",
              device_name(b.device()), "; move one with .to(device) first");
  broadcast_shapes(a.shape(), b.shape(), op);
}

TensorList forward_binary(BinaryOp op, const TensorList& in) { return {kernels::binary(op, in[0], in[1])}; }

const OpSpec kAdd{autodiff::OpKind::add, autodiff::save_nothing};
const OpSpec kSub{autodiff::OpKind::sub, autodiff::save_nothing};
const OpSpec kMul{autodiff::OpKind::mul, autodiff::save_inputs};
const OpSpec kDiv{autodiff::OpKind::div, autodiff::save_inputs};
const OpSpec kMaximum{autodiff::OpKind::maximum, autodiff::save_inputs};
const OpSpec kMinimum{autodiff::OpKind::minimum, autodiff::save_inputs};
const OpSpec kWhere{autodiff::OpKind::where, autodiff::save_inputs, 0, 0b001};  // only the condition is kept

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  check_pair(a, b, "add");
  return autodiff::apply1(kAdd, {a, b}, [](const TensorList& in) { return forward_binary(BinaryOp::add, in); },
                          [](BackwardContext& ctx) {
                            Tensor g = ctx.grad_output(0);
                            ctx.set_input_grad(0, g);
                            ctx.set_input_grad(1, g);
                          });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  check_pair(a, b, "sub");
  return autodiff::apply1(kSub, {a, b}, [](const TensorList& in) { return forward_binary(BinaryOp::sub, in); },
                          [](BackwardContext& ctx) {
                            Tensor g = ctx.grad_output(0);
                            ctx.set_input_grad(0, g);
                            if (ctx.needs_input_grad(1)) ctx.set_input_grad(1, kernels::unary(UnaryOp::neg, g));
                          });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  check_pair(a, b, "mul");
  return autodiff::apply1(kMul, {a, b}, [](const TensorList& in) { return forward_binary(BinaryOp::mul, in); },
                          [](BackwardContext& ctx) {
                            Tensor g = ctx.grad_output(0);
                            if (ctx.needs_input_grad(0)) ctx.set_input_grad(0, kernels::binary(BinaryOp::mul, g, ctx.input(1)));
                            if (ctx.needs_input_grad(1)) ctx.set_input_grad(1, kernels::binary(BinaryOp::mul, g, ctx.input(0)));
                          });
}

Tensor div(const Tensor& a, const Tensor& b) {
  check_pair(a, b, "div");
  return autodiff::apply1(kDiv, {a, b}, [](const TensorList& in) { return forward_binary(BinaryOp::div, in); },
                          [](BackwardContext& ctx) {
                            Tensor g = ctx.grad_output(0);
                            Tensor bv = ctx.input(1);
                            Tensor ga = kernels::binary(BinaryOp::div, g, bv);  // g / b
                            if (ctx.needs_input_grad(0)) ctx.set_input_grad(0, ga);
                            if (ctx.needs_input_grad(1)) {
                              // -g * a / b^2 = -(g / b) * (a / b)
                              Tensor ab = kernels::binary(BinaryOp::div, ctx.input(0), bv);
                              ctx.set_input_grad(1, kernels::unary(UnaryOp::neg, kernels::binary(BinaryOp::mul, ga, ab)));
                            }
                          });
}

// maximum picks a where a >= b (ties go to a) or a is NaN, else b; minimum likewise with <=. So a
// NaN operand is returned (NaN propagates). The gradient goes to the input that was picked, exactly
// g there and exactly 0 for the other (also when g is inf or NaN).
static Tensor extremum(const OpSpec& spec, BinaryOp op, const Tensor& a, const Tensor& b) {
  check_pair(a, b, spec.name.c_str());
  return autodiff::apply1(spec, {a, b}, [op](const TensorList& in) { return forward_binary(op, in); },
                          [op](BackwardContext& ctx) {
                            Tensor g = ctx.grad_output(0);
                            const BinaryOp picks_b =
                                op == BinaryOp::maximum ? BinaryOp::maximum_picks_b : BinaryOp::minimum_picks_b;
                            Tensor mask = kernels::binary(picks_b, ctx.input(0), ctx.input(1));  // 1 where b
                            Tensor zero = zeros({}, g.dtype(), memory::Tag::other, g.device());
                            auto select = [&](const Tensor& where_b, const Tensor& where_a) {
                              Tensor out = kernels::empty(g.shape(), g.dtype(), g.device());
                              kernels::backend_of(out).where(mask, where_b, where_a, out);
                              return out;
                            };
                            if (ctx.needs_input_grad(1)) ctx.set_input_grad(1, select(g, zero));
                            if (ctx.needs_input_grad(0)) ctx.set_input_grad(0, select(zero, g));
                          });
}

Tensor maximum(const Tensor& a, const Tensor& b) { return extremum(kMaximum, BinaryOp::maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extremum(kMinimum, BinaryOp::minimum, a, b); }

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  REMAT_CHECK(cond.defined(), "where: condition is undefined");
  check_pair(a, b, "where");
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  return autodiff::apply1(
      kWhere, {cond, a, b},
      [shape](const TensorList& in) {
        Tensor out = kernels::empty(shape, in[1].dtype(), in[1].device());
        kernels::backend_of(out).where(in[0], in[1], in[2], out);
        return TensorList{out};
      },
      [](BackwardContext& ctx) {
        Tensor g = ctx.grad_output(0);
        Tensor c = ctx.input(0);
        Tensor zero = zeros({}, g.dtype(), memory::Tag::other, g.device());
        auto pick = [&](const Tensor& x, const Tensor& y) {
          Tensor out = kernels::empty(g.shape(), g.dtype(), g.device());
          kernels::backend_of(out).where(c, x, y, out);
          return out;
        };
        if (ctx.needs_input_grad(1)) ctx.set_input_grad(1, pick(g, zero));
        if (ctx.needs_input_grad(2)) ctx.set_input_grad(2, pick(zero, g));
      });
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  REMAT_CHECK(x.defined() && mask.defined(), "masked_fill: input is undefined");
  REMAT_CHECK(is_floating(x.dtype()), "masked_fill: expects a floating tensor, got ", dtype_name(x.dtype()));
  Shape b = broadcast_shapes(x.shape(), mask.shape(), "masked_fill");
  REMAT_CHECK(b == x.shape(), "masked_fill: mask of shape ", shape_str(mask.shape()),
              " does not broadcast to the input shape ", shape_str(x.shape()));
  return where(mask, full({}, value, x.dtype(), memory::Tag::other, x.device()), x);
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  REMAT_CHECK(static_cast<size_t>(x.dim()) >= shape.size(), "sum_to: cannot reduce shape ", shape_str(x.shape()),
              " to the larger rank of ", shape_str(shape));
  size_t lead = x.shape().size() - shape.size();
  std::vector<int64_t> axes;
  for (size_t i = 0; i < x.shape().size(); ++i) {
    if (i < lead) {
      axes.push_back(static_cast<int64_t>(i));
      continue;
    }
    int64_t target = shape[i - lead];
    if (target == 1 && x.shape()[i] != 1) axes.push_back(static_cast<int64_t>(i));
    else
      REMAT_CHECK(target == x.shape()[i], "sum_to: shape ", shape_str(x.shape()), " does not broadcast from ",
                  shape_str(shape));
  }
  Tensor s = axes.empty() ? x : sum(x, axes, true);
  return s.reshape(shape);
}

}  // namespace remat
