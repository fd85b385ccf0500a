// Layer norm and RMS norm over the last axis, with optional affine parameters. Only the defined
// parameters are op inputs: layer_norm's inputs are x, then weight (if defined), then bias (if
// defined). The per-row statistics (mean, rstd) are aux outputs kept for the backward, which
// also reads x and weight (never bias or y).
#include <cmath>
#include <utility>

#include "autodiff/kernels.h"
#include "autodiff/op.h"

namespace remat {

using autodiff::BackwardContext;
using autodiff::OpSpec;

namespace {

// Saved inputs: x always, weight when it is an input (it is then input 1).
const OpSpec kLayerNorm{autodiff::OpKind::layer_norm, autodiff::save_inputs, 2, 0b01};
const OpSpec kLayerNormAffine{autodiff::OpKind::layer_norm, autodiff::save_inputs, 2, 0b11};
const OpSpec kRmsNorm{autodiff::OpKind::rms_norm, autodiff::save_inputs, 1, 0b01};
const OpSpec kRmsNormAffine{autodiff::OpKind::rms_norm, autodiff::save_inputs, 1, 0b11};


// Validates x, the optional parameters and eps; returns the normalised size C = x.size(-1).
int64_t check_norm(const char* op, const Tensor& x, const Tensor& weight, const char* wname, const Tensor& bias,
                   double eps) {
  REMAT_CHECK(x.defined(), op, ": input is undefined");
  REMAT_CHECK(is_floating(x.dtype()), op, ": expects a floating tensor (f32, f64, bf16, f16), got ", dtype_name(x.dtype()), " of shape ",
              shape_str(x.shape()));
  REMAT_CHECK(x.dim() >= 1, op, ": expects a tensor of rank >= 1, got shape ", shape_str(x.shape()));
  const int64_t c = x.size(-1);
  REMAT_CHECK(c > 0, op, ": cannot normalise over the empty last axis of shape ", shape_str(x.shape()));
  for (const auto& [p, name] : {std::pair<const Tensor&, const char*>{weight, wname}, {bias, "bias"}}) {
    if (!p.defined()) continue;
    REMAT_CHECK(p.shape() == Shape{c}, op, ": ", name, " of shape ", shape_str(p.shape()), " does not match [", c,
                "] (the last axis of the input of shape ", shape_str(x.shape()), ")");
    REMAT_CHECK(p.dtype() == x.dtype(), op, ": ", name, " dtype ", dtype_name(p.dtype()), " differs from the input dtype ",
                dtype_name(x.dtype()));
    REMAT_CHECK(p.device() == x.device(), op, ": ", name, " is on ", device_name(p.device()), ", the input on ",
                device_name(x.device()));
  }
  REMAT_CHECK(eps > 0.0 && std::isfinite(eps), op, ": eps must be positive and finite, got ", eps);
  return c;
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const int64_t c = check_norm("layer_norm", x, weight, "weight", bias, eps);
  const int64_t rows = x.numel() / c;
  TensorList inputs{x};
  const int wi = weight.defined() ? static_cast<int>(inputs.size()) : -1;
  if (weight.defined()) inputs.push_back(weight);
  const int bi = bias.defined() ? static_cast<int>(inputs.size()) : -1;
  if (bias.defined()) inputs.push_back(bias);
  const OpSpec& spec = weight.defined() ? kLayerNormAffine : kLayerNorm;

  TensorList out = autodiff::apply(
      spec, inputs,
      [eps, wi, bi, rows](const TensorList& in) {
        Tensor xc = kernels::contiguous(in[0]);
        Tensor w = wi >= 0 ? in[wi] : Tensor(), b = bi >= 0 ? in[bi] : Tensor();
        Tensor y = kernels::empty(xc.shape(), xc.dtype(), xc.device());
        Tensor mean = kernels::empty({rows}, accumulate_dtype(xc.dtype()), xc.device());
        Tensor rstd = kernels::empty({rows}, accumulate_dtype(xc.dtype()), xc.device());
        kernels::backend_of(xc).layer_norm(xc, w, b, eps, y, mean, rstd);
        return TensorList{y, mean, rstd};
      },
      [wi, bi, c](BackwardContext& ctx) {
        const bool need_x = ctx.needs_input_grad(0);
        const bool need_w = wi >= 0 && ctx.needs_input_grad(wi);
        const bool need_b = bi >= 0 && ctx.needs_input_grad(bi);
        if (!need_x && !need_w && !need_b) return;
        Tensor x = kernels::contiguous(ctx.input(0));
        Tensor w = wi >= 0 ? ctx.input(wi) : Tensor();
        Tensor gy = kernels::contiguous(ctx.grad_output(0));
        Tensor gx = need_x ? kernels::empty(x.shape(), x.dtype(), x.device()) : Tensor();
        Tensor gw = need_w ? kernels::empty({c}, x.dtype(), x.device()) : Tensor();
        Tensor gb = need_b ? kernels::empty({c}, x.dtype(), x.device()) : Tensor();
        kernels::backend_of(x).layer_norm_backward(x, w, ctx.output(1), ctx.output(2), gy, gx, gw, gb);
        if (need_x) ctx.set_input_grad(0, gx);
        if (need_w) ctx.set_input_grad(wi, gw);
        if (need_b) ctx.set_input_grad(bi, gb);
      },
      8.0 * static_cast<double>(x.numel()));
  return out[0];
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  const int64_t c = check_norm("rms_norm", x, weight, "weight", Tensor(), eps);
  const int64_t rows = x.numel() / c;
  TensorList inputs{x};
  const int wi = weight.defined() ? 1 : -1;
  if (weight.defined()) inputs.push_back(weight);
  const OpSpec& spec = weight.defined() ? kRmsNormAffine : kRmsNorm;

  TensorList out = autodiff::apply(
      spec, inputs,
      [eps, wi, rows](const TensorList& in) {
        Tensor xc = kernels::contiguous(in[0]);
        Tensor w = wi >= 0 ? in[wi] : Tensor();
        Tensor y = kernels::empty(xc.shape(), xc.dtype(), xc.device());
        Tensor rstd = kernels::empty({rows}, accumulate_dtype(xc.dtype()), xc.device());
        kernels::backend_of(xc).rms_norm(xc, w, eps, y, rstd);
        return TensorList{y, rstd};
      },
      [wi, c](BackwardContext& ctx) {
        const bool need_x = ctx.needs_input_grad(0);
        const bool need_w = wi >= 0 && ctx.needs_input_grad(wi);
        if (!need_x && !need_w) return;
        Tensor x = kernels::contiguous(ctx.input(0));
        Tensor w = wi >= 0 ? ctx.input(wi) : Tensor();
        Tensor gy = kernels::contiguous(ctx.grad_output(0));
        Tensor gx = need_x ? kernels::empty(x.shape(), x.dtype(), x.device()) : Tensor();
        Tensor gw = need_w ? kernels::empty({c}, x.dtype(), x.device()) : Tensor();
        kernels::backend_of(x).rms_norm_backward(x, w, ctx.output(1), gy, gx, gw);
        if (need_x) ctx.set_input_grad(0, gx);
        if (need_w) ctx.set_input_grad(wi, gw);
      },
      5.0 * static_cast<double>(x.numel()));
  return out[0];
}

}  // namespace remat
