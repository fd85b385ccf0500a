// Matrix products: a [..., m, k] @ b [..., k, n], either operand transposed, batch axes
// broadcast. A batched a against a 2-D b (the common x @ W) is folded into one large GEMM.
#include "autodiff/kernels.h"
#include "autodiff/op.h"

namespace remat {

using autodiff::BackwardContext;
using autodiff::OpSpec;

namespace {

const OpSpec kMatmul{autodiff::OpKind::matmul, autodiff::save_inputs};

struct MatmulShape {
  Shape batch;       // broadcast batch shape
  int64_t m, k, n;
};

MatmulShape check_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  REMAT_CHECK(a.defined() && b.defined(), "matmul: input is undefined");
  REMAT_CHECK(is_floating(a.dtype()) && a.dtype() == b.dtype(), "matmul: dtypes must be equal floating types, got ",
              dtype_name(a.dtype()), " and ", dtype_name(b.dtype()));
  REMAT_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: operands must have rank >= 2, got ", shape_str(a.shape()), " and ",
              shape_str(b.shape()));
  int64_t m = a.size(ta ? -1 : -2), ka = a.size(ta ? -2 : -1);
  int64_t kb = b.size(tb ? -1 : -2), n = b.size(tb ? -2 : -1);
  REMAT_CHECK(ka == kb, "matmul: inner dimensions differ: a is ", shape_str(a.shape()), (ta ? " (transposed)" : ""),
              ", b is ", shape_str(b.shape()), (tb ? " (transposed)" : ""), " (", ka, " vs ", kb, ")");
  Shape ab(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  Shape batch = broadcast_shapes(ab, bb, "matmul");
  Shape out = batch;
  out.push_back(m);
  out.push_back(n);
  check_shape(out, "matmul");  // valid operands can have a product too large to exist
  return {std::move(batch), m, ka, n};
}

// A [batch, r, c] view of x expanded to the batch shape (copies only when the batch axes cannot
// be flattened into one stride).
Tensor as_batched(const Tensor& x, const Shape& batch) {
  Shape full = batch;
  full.push_back(x.size(-2));
  full.push_back(x.size(-1));
  int64_t nb = shape_numel(batch);
  bool all_broadcast = true;
  size_t lead = batch.size() - (x.shape().size() - 2);
  for (size_t i = 0; i < batch.size(); ++i) {
    if (i >= lead && x.shape()[i - lead] != 1) all_broadcast = false;
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = x.storage();
  impl->dtype = x.dtype();
  impl->offset = x.offset();
  impl->shape = {nb, x.size(-2), x.size(-1)};
  impl->strides = {0, x.strides()[x.dim() - 2], x.strides()[x.dim() - 1]};
  if (all_broadcast) return Tensor(impl);
  // flattenable: x has the full batch shape and its batch axes are contiguous over each other
  Tensor e = x.detach().expand(full);
  bool flat = true;
  for (size_t i = 0; i + 1 < batch.size(); ++i)
    if (e.strides()[i] != e.strides()[i + 1] * batch[i + 1]) flat = false;
  for (size_t i = 0; i < batch.size(); ++i)
    if (e.strides()[i] == 0 && batch[i] != 1) flat = false;
  if (!flat) {
    e = kernels::copy(e);
  }
  impl->storage = e.storage();
  impl->offset = e.offset();
  impl->strides = {batch.empty() ? 0 : e.strides()[batch.size() - 1], e.strides()[e.dim() - 2], e.strides()[e.dim() - 1]};
  if (nb == 1) impl->strides[0] = 0;
  return Tensor(impl);
}

// a @ b (+ bias [n] on every row: the backend's gemm_bias, which may add it in the GEMM's epilogue)
Tensor matmul_forward(const Tensor& a, const Tensor& b, bool ta, bool tb, const Tensor& bias = Tensor()) {
  MatmulShape s = check_matmul(a, b, ta, tb);
  Shape out_shape = s.batch;
  out_shape.push_back(s.m);
  out_shape.push_back(s.n);
  Tensor out = kernels::empty(out_shape, a.dtype(), a.device());
  Backend& be = kernels::backend_of(a);
  auto product = [&](const Tensor& x, bool tx, const Tensor& y, bool ty, const Tensor& c) {
    if (bias.defined())
      be.gemm_bias(x, tx, y, ty, bias, c);
    else
      be.gemm(x, tx, y, ty, c, 1.0, 0.0);
  };
  if (!ta && b.dim() == 2 && a.dim() > 2 && a.is_contiguous()) {
    // fold batch into rows: [B*m, k] @ [k, n]
    int64_t rows = a.numel() / s.k;
    Tensor a2 = a.detach().view({1, rows, s.k});
    Tensor b2 = as_batched(b, {1});
    product(a2, false, b2, tb, out.detach().view({1, rows, s.n}));
    return out;
  }
  Tensor a3 = as_batched(a, s.batch), b3 = as_batched(b, s.batch);
  product(a3, ta, b3, tb, out.detach().view({shape_numel(s.batch), s.m, s.n}));
  return out;
}

}  // namespace

namespace {

// The backward of a @ op(b) for inputs 0 (a) and 1 (b); shared by matmul and linear.
void matmul_backward(BackwardContext& ctx, bool trans_a, bool trans_b) {
  Tensor g = ctx.grad_output(0);
  Tensor av = ctx.input(0), bv = ctx.input(1);
  if (ctx.needs_input_grad(0)) {
    Tensor ga = trans_a ? matmul_forward(bv, g, trans_b, true) : matmul_forward(g, bv, false, !trans_b);
    ctx.set_input_grad(0, ga);
  }
  if (ctx.needs_input_grad(1)) {
    Tensor gb;
    if (bv.dim() == 2 && av.dim() > 2 && !trans_a) {
      // fold the batch: [B*m, k]^T @ [B*m, n]
      Tensor a2 = av.contiguous().reshape({-1, av.size(-1)});
      Tensor g2 = g.contiguous().reshape({-1, g.size(-1)});
      gb = trans_b ? matmul_forward(g2, a2, true, false) : matmul_forward(a2, g2, true, false);
    } else {
      gb = trans_b ? matmul_forward(g, av, true, trans_a) : matmul_forward(av, g, !trans_a, false);
    }
    ctx.set_input_grad(1, gb);
  }
}

const OpSpec kLinear{autodiff::OpKind::matmul, autodiff::save_inputs, 0, 0b011};  // x and weight are kept, not the bias

}  // namespace

// x [..., in] @ weight [out, in]^T + bias [out]: one matmul op whose GEMM adds the bias.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  MatmulShape s = check_matmul(x, weight, false, true);
  REMAT_CHECK(weight.dim() == 2, "linear: weight must be [out, in], got ", shape_str(weight.shape()));
  if (!bias.defined()) return matmul(x, weight, false, true);
  REMAT_CHECK(bias.dtype() == x.dtype() && bias.device() == x.device(), "linear: bias dtype ", dtype_name(bias.dtype()),
              " differs from the input dtype ", dtype_name(x.dtype()));
  REMAT_CHECK(bias.shape() == Shape{s.n}, "linear: bias of shape ", shape_str(bias.shape()), " for a weight of shape ",
              shape_str(weight.shape()), " (expected [", s.n, "])");
  double flops = 2.0 * static_cast<double>(shape_numel(s.batch)) * s.m * s.n * s.k;
  return autodiff::apply1(
      kLinear, {x, weight, bias},
      [](const TensorList& in) { return TensorList{matmul_forward(in[0], in[1], false, true, in[2])}; },
      [](BackwardContext& ctx) {
        matmul_backward(ctx, false, true);
        if (ctx.needs_input_grad(2)) ctx.set_input_grad(2, ctx.grad_output(0));  // summed over the rows
      },
      flops);
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  MatmulShape s = check_matmul(a, b, trans_a, trans_b);
  double flops = 2.0 * static_cast<double>(shape_numel(s.batch)) * s.m * s.n * s.k;
  return autodiff::apply1(
      kMatmul, {a, b}, [=](const TensorList& in) { return TensorList{matmul_forward(in[0], in[1], trans_a, trans_b)}; },
      [=](BackwardContext& ctx) { matmul_backward(ctx, trans_a, trans_b); },
      flops);
}

}  // namespace remat
