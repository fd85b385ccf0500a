// 2-D (and, through it, 1-D) convolution. Inputs are x, weight and (when defined) bias; the
// backward reads x and weight (never the bias or the output). The kernels are the backend's
// conv2d / conv2d_backward_input / conv2d_backward_weight (src/tensor/cpu/conv.cpp).
#include <climits>

#include "autodiff/kernels.h"
#include "autodiff/op.h"
#include "autodiff/ops/window.h"

namespace remat {

using autodiff::BackwardContext;
using autodiff::OpSpec;

namespace {

// Saved inputs: x and weight (inputs 0 and 1), never the bias.
const OpSpec kConv2d{autodiff::OpKind::conv2d, autodiff::save_inputs, 0, 0b011};

struct ConvPlan {
  Conv2dGeometry geometry;
  Shape output;
  double flops = 0;
};

ConvPlan check_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, Size2 stride, Size2 padding,
                      Size2 dilation, int64_t groups) {
  const char* op = "conv2d";
  REMAT_CHECK(x.defined() && w.defined(), op, ": input or weight is undefined");
  REMAT_CHECK(is_floating(x.dtype()), op, ": expects a floating input (f32, f64, bf16, f16), got ", dtype_name(x.dtype()));
  REMAT_CHECK(w.dtype() == x.dtype(), op, ": weight dtype ", dtype_name(w.dtype()), " differs from the input dtype ",
              dtype_name(x.dtype()));
  REMAT_CHECK(x.dim() == 4, op, ": expects an input [N, C, H, W], got shape ", shape_str(x.shape()));
  REMAT_CHECK(w.dim() == 4, op, ": expects a weight [O, C / groups, KH, KW], got shape ", shape_str(w.shape()));
  REMAT_CHECK(w.device() == x.device(), op, ": weight is on ", device_name(w.device()), ", the input on ",
              device_name(x.device()));
  window::check_parameter(op, "groups", groups, 1);
  for (int i = 0; i < 2; ++i) {
    window::check_parameter(op, "stride", stride[i], 1);
    window::check_parameter(op, "padding", padding[i], 0);
    window::check_parameter(op, "dilation", dilation[i], 1);
  }
  const int64_t n = x.shape()[0], c = x.shape()[1], o = w.shape()[0], kh = w.shape()[2], kw = w.shape()[3];
  REMAT_CHECK(c > 0 && c % groups == 0, op, ": the input has ", c, " channels (shape ", shape_str(x.shape()),
              "), which ", groups, " groups do not divide");
  REMAT_CHECK(o > 0 && o % groups == 0, op, ": the weight has ", o, " output channels (shape ", shape_str(w.shape()),
              "), which ", groups, " groups do not divide");
  REMAT_CHECK(w.shape()[1] == c / groups, op, ": weight of shape ", shape_str(w.shape()), " expects ",
              w.shape()[1] * groups, " input channels (", w.shape()[1], " per group x ", groups,
              " groups), the input of shape ", shape_str(x.shape()), " has ", c);
  REMAT_CHECK(kh > 0 && kw > 0, op, ": empty kernel in weight of shape ", shape_str(w.shape()));
  if (bias.defined()) {
    REMAT_CHECK(bias.shape() == Shape{o}, op, ": bias of shape ", shape_str(bias.shape()), " does not match [", o,
                "] (the output channels of the weight of shape ", shape_str(w.shape()), ")");
    REMAT_CHECK(bias.dtype() == x.dtype(), op, ": bias dtype ", dtype_name(bias.dtype()),
                " differs from the input dtype ", dtype_name(x.dtype()));
    REMAT_CHECK(bias.device() == x.device(), op, ": bias is on ", device_name(bias.device()), ", the input on ",
                device_name(x.device()));
  }
  ConvPlan plan;
  plan.geometry = {stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1], groups};
  const int64_t oh = window::output_length(op, "height", x.shape()[2], kh, stride[0], padding[0], dilation[0], false, x);
  const int64_t ow = window::output_length(op, "width", x.shape()[3], kw, stride[1], padding[1], dilation[1], false, x);
  plan.output = {n, o, oh, ow};
  window::checked_numel(plan.output, op);
  // one image's GEMM operands (im2col): [C/g * KH * KW, OH * OW]; BLAS takes int sizes
  const int64_t depth = window::checked_mul(c / groups, window::checked_mul(kh, kw, op, "the kernel"), op,
                                            "the GEMM depth C / groups x KH x KW");
  const int64_t pixels = window::checked_mul(oh, ow, op, "the output plane");
  REMAT_CHECK(depth <= INT_MAX && pixels <= INT_MAX &&
                  window::checked_mul(depth, pixels, op, "the im2col buffer") <= INT_MAX,
              op, ": one image's im2col buffer (", depth, " x ", pixels,
              " elements) exceeds the 2^31 - 1 elements a BLAS call can index");
  plan.flops = 2.0 * static_cast<double>(n) * static_cast<double>(o) * static_cast<double>(pixels) *
               static_cast<double>(depth);
  return plan;
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Size2 stride, Size2 padding, Size2 dilation,
              int64_t groups) {
  const ConvPlan plan = check_conv2d(x, weight, bias, stride, padding, dilation, groups);
  const Conv2dGeometry g = plan.geometry;
  const Shape out_shape = plan.output;
  TensorList inputs{x, weight};
  const bool has_bias = bias.defined();
  if (has_bias) inputs.push_back(bias);
  return autodiff::apply1(
      kConv2d, inputs,
      [g, out_shape, has_bias](const TensorList& in) {
        Tensor y = kernels::empty(out_shape, in[0].dtype(), in[0].device());
        kernels::backend_of(in[0]).conv2d(in[0], in[1], has_bias ? in[2] : Tensor(), g, y);
        return TensorList{y};
      },
      [g, has_bias](BackwardContext& ctx) {
        const bool need_x = ctx.needs_input_grad(0), need_w = ctx.needs_input_grad(1);
        const bool need_b = has_bias && ctx.needs_input_grad(2);
        if (!need_x && !need_w && !need_b) return;
        Tensor gy = ctx.grad_output(0);
        Tensor w = ctx.input(1);
        Backend& be = kernels::backend_of(gy);
        if (need_x) {
          const auto& meta = ctx.input_meta(0);
          Tensor gx = kernels::empty(meta.shape, meta.dtype, meta.device);
          be.conv2d_backward_input(gy, w, g, gx);
          ctx.set_input_grad(0, gx);
        }
        if (need_w || need_b) {
          Tensor gw = need_w ? kernels::empty(w.shape(), w.dtype(), w.device()) : Tensor();
          Tensor gb = need_b ? kernels::empty({w.shape()[0]}, w.dtype(), w.device()) : Tensor();
          be.conv2d_backward_weight(ctx.input(0), gy, g, gw, gb);
          if (need_w) ctx.set_input_grad(1, gw);
          if (need_b) ctx.set_input_grad(2, gb);
        }
      },
      plan.flops);
}

Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride, int64_t padding,
              int64_t dilation, int64_t groups) {
  REMAT_CHECK(x.defined() && weight.defined(), "conv1d: input or weight is undefined");
  REMAT_CHECK(x.dim() == 3, "conv1d: expects an input [N, C, L], got shape ", shape_str(x.shape()));
  REMAT_CHECK(weight.dim() == 3, "conv1d: expects a weight [O, C / groups, K], got shape ", shape_str(weight.shape()));
  // [N, C, 1, L] * [O, C / g, 1, K] -> [N, O, 1, OL]
  return conv2d(x.unsqueeze(2), weight.unsqueeze(2), bias, {1, stride}, {0, padding}, {1, dilation}, groups).squeeze(2);
}

}  // namespace remat
