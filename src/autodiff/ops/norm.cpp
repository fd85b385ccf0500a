// Layer norm and RMS norm over the last axis, with optional affine parameters, and the residual
// add fused into layer norm. Only the defined parameters are op inputs: layer_norm's inputs are x,
// then weight (if defined), then bias (if defined); add_layer_norm's are x, r, then the same. The
// per-row statistics (mean, rstd) are aux outputs kept for the backward, which also reads the
// normalised tensor (x, or add_layer_norm's sum s) and weight (never bias or y).
//
// Note [the residual add fused into layer norm]. add_layer_norm(x, r) = {s = x + r, y =
// layer_norm(s)} is the add and the layer_norm op of a pre-LN block in one op: one kernel call
// forward (add_layer_norm) and one backward (add_layer_norm_backward), which adds s's gradient from
// its other consumers to the norm's input gradient. Each kernel gives the bits of the unfused
// kernels in f32 and f64 (backend.h), and the op keeps what the unfused pair keeps (s, weight, mean,
// rstd), so it is the unfused graph's bits wherever the engine would have added s's gradients in
// the same order. It does when s has one other consumer (a residual stream: the block's next add):
// the engine then adds two terms, and a + b is b + a in IEEE arithmetic. With several other
// consumers the engine sums theirs first and the norm's last here, which the unfused graph does
// only if the norm's node runs last. bf16 and f16 run the unfused kernels (binary add, then
// layer_norm; layer_norm_backward, then binary add), each rounding once as it does alone, so that
// y is the norm of the s the caller gets and the gradients are the unfused graph's.
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
// Saved: the output s (visible output 0) and, when it is an input (input 2), weight.
const OpSpec kAddLayerNorm{autodiff::OpKind::add_layer_norm, autodiff::save_outputs, 2, 0, 0b01};
const OpSpec kAddLayerNormAffine{autodiff::OpKind::add_layer_norm, autodiff::save_inputs_and_outputs, 2, 0b100, 0b01};
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

namespace {

// The fused kernels take f32 and f64; 16-bit values run the unfused kernels (the Note above).
bool fused_dtype(DType dtype) { return dtype == DType::f32 || dtype == DType::f64; }

TensorList add_layer_norm_forward(const TensorList& in, int wi, int bi, double eps) {
  Tensor x = kernels::contiguous(in[0]), r = kernels::contiguous(in[1]);
  Tensor w = wi >= 0 ? in[wi] : Tensor(), b = bi >= 0 ? in[bi] : Tensor();
  const int64_t rows = x.numel() / x.size(-1);
  Backend& backend = kernels::backend_of(x);
  Tensor y = kernels::empty(x.shape(), x.dtype(), x.device());
  Tensor mean = kernels::empty({rows}, accumulate_dtype(x.dtype()), x.device());
  Tensor rstd = kernels::empty({rows}, accumulate_dtype(x.dtype()), x.device());
  Tensor s;
  if (fused_dtype(x.dtype())) {
    s = kernels::empty(x.shape(), x.dtype(), x.device());
    backend.add_layer_norm(x, r, w, b, eps, s, y, mean, rstd);
  } else {
    s = kernels::binary(BinaryOp::add, x, r);
    backend.layer_norm(s, w, b, eps, y, mean, rstd);
  }
  return TensorList{s, y, mean, rstd};
}

// x and r both get g = gs + layer_norm_backward(gy) (gs, or the norm's gradient alone, when only
// one of the outputs got a gradient); weight and bias get the norm's parameter gradients.
void add_layer_norm_backward(BackwardContext& ctx, int wi, int bi, int64_t c) {
  const bool need_x = ctx.needs_input_grad(0) || ctx.needs_input_grad(1);
  const bool has_gy = ctx.has_grad_output(1);
  const bool need_w = has_gy && wi >= 0 && ctx.needs_input_grad(wi);
  const bool need_b = has_gy && bi >= 0 && ctx.needs_input_grad(bi);
  Tensor gx;
  if (!has_gy) {
    gx = ctx.grad_output(0);
  } else if (need_x || need_w || need_b) {
    Tensor s = kernels::contiguous(ctx.output(0));
    Tensor w = wi >= 0 ? ctx.input(wi) : Tensor();
    Tensor gy = kernels::contiguous(ctx.grad_output(1));
    Tensor gs = need_x && ctx.has_grad_output(0) ? kernels::contiguous(ctx.grad_output(0)) : Tensor();
    Tensor gw = need_w ? kernels::empty({c}, s.dtype(), s.device()) : Tensor();
    Tensor gb = need_b ? kernels::empty({c}, s.dtype(), s.device()) : Tensor();
    if (need_x) gx = kernels::empty(s.shape(), s.dtype(), s.device());
    Backend& backend = kernels::backend_of(s);
    if (gs.defined() && fused_dtype(s.dtype())) {
      backend.add_layer_norm_backward(s, w, ctx.output(2), ctx.output(3), gy, gs, gx, gw, gb);
    } else {
      backend.layer_norm_backward(s, w, ctx.output(2), ctx.output(3), gy, gx, gw, gb);
      if (gs.defined()) gx = kernels::binary(BinaryOp::add, gs, gx);
    }
    if (need_w) ctx.set_input_grad(wi, gw);
    if (need_b) ctx.set_input_grad(bi, gb);
  }
  if (!need_x) return;
  if (ctx.needs_input_grad(0)) ctx.set_input_grad(0, gx);
  if (ctx.needs_input_grad(1)) ctx.set_input_grad(1, gx);
}

}  // namespace

TensorList add_layer_norm(const Tensor& x, const Tensor& r, const Tensor& weight, const Tensor& bias, double eps) {
  const int64_t c = check_norm("add_layer_norm", x, weight, "weight", bias, eps);
  REMAT_CHECK(r.defined(), "add_layer_norm: the residual is undefined");
  REMAT_CHECK(r.shape() == x.shape(), "add_layer_norm: the residual of shape ", shape_str(r.shape()),
              " does not match the input of shape ", shape_str(x.shape()), " (no broadcasting)");
  REMAT_CHECK(r.dtype() == x.dtype(), "add_layer_norm: the residual's dtype ", dtype_name(r.dtype()),
              " differs from the input dtype ", dtype_name(x.dtype()));
  REMAT_CHECK(r.device() == x.device(), "add_layer_norm: the residual is on ", device_name(r.device()),
              ", the input on ", device_name(x.device()));
  TensorList inputs{x, r};
  const int wi = weight.defined() ? static_cast<int>(inputs.size()) : -1;
  if (weight.defined()) inputs.push_back(weight);
  const int bi = bias.defined() ? static_cast<int>(inputs.size()) : -1;
  if (bias.defined()) inputs.push_back(bias);
  const OpSpec& spec = weight.defined() ? kAddLayerNormAffine : kAddLayerNorm;
  return autodiff::apply(
      spec, inputs, [wi, bi, eps](const TensorList& in) { return add_layer_norm_forward(in, wi, bi, eps); },
      [wi, bi, c](BackwardContext& ctx) { add_layer_norm_backward(ctx, wi, bi, c); },
      9.0 * static_cast<double>(x.numel()));
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
