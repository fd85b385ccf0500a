// Batch normalisation over axis 1. The op's inputs are x, then weight and bias when defined;
// the running statistics are not inputs (they take no gradient): in training mode the forward
// updates them in place when they are given, in evaluation mode it reads them. The per-channel
// mean and rstd used to normalise are aux outputs kept for the backward, which also reads x and
// the weight. They are copies, so a later update of the running statistics cannot reach a
// pending backward.
//
// The running-statistics update is the op's side effect: it happens only on a first run
// (autodiff::recompute_depth() == 0), never when any form of recomputation re-runs the forward
// (see "Side effects" in docs/design.md).
#include <cmath>

#include "autodiff/kernels.h"
#include "autodiff/op.h"

namespace remat {

using autodiff::BackwardContext;
using autodiff::OpSpec;

namespace {

const OpSpec kBatchNorm{autodiff::OpKind::batch_norm, autodiff::save_inputs, 2, 0b001};
const OpSpec kBatchNormAffine{autodiff::OpKind::batch_norm, autodiff::save_inputs, 2, 0b011};

// `statistics`: running statistics, which may also be float32 beside a 16-bit input.
void check_channel_vector(const Tensor& v, const char* name, const Tensor& x, bool statistics = false) {
  if (!v.defined()) return;
  const int64_t c = x.shape()[1];
  REMAT_CHECK(v.shape() == Shape{c}, "batch_norm: ", name, " of shape ", shape_str(v.shape()), " does not match [", c,
              "] (the channels of the input of shape ", shape_str(x.shape()), ")");
  REMAT_CHECK(v.dtype() == x.dtype() || (statistics && v.dtype() == accumulate_dtype(x.dtype())), "batch_norm: ",
              name, " dtype ", dtype_name(v.dtype()), " differs from the input dtype ", dtype_name(x.dtype()));
  REMAT_CHECK(v.device() == x.device(), "batch_norm: ", name, " is on ", device_name(v.device()), ", the input on ",
              device_name(x.device()));
}

// rstd = 1 / sqrt(var + eps), as kernels on [C].
Tensor reciprocal_std(const Tensor& var, double eps) {
  Tensor shifted = kernels::unary(UnaryOp::add_scalar, var, eps);
  return kernels::unary(UnaryOp::reciprocal, kernels::unary(UnaryOp::sqrt, shifted));
}

// running = (1 - momentum) running + momentum batch, in place (no gradient).
void update_running(const Tensor& running, const Tensor& batch_statistic, double momentum) {
  const Tensor batch = batch_statistic.dtype() == running.dtype() ? batch_statistic
                                                                   : kernels::convert(batch_statistic, running.dtype());
  Tensor blended = kernels::binary(BinaryOp::add, kernels::unary(UnaryOp::mul_scalar, running, 1.0 - momentum),
                                   kernels::unary(UnaryOp::mul_scalar, batch, momentum));
  kernels::backend_of(running).copy(blended, running);
  running.storage()->bump_version();
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum, double eps) {
  REMAT_CHECK(x.defined(), "batch_norm: input is undefined");
  REMAT_CHECK(is_floating(x.dtype()), "batch_norm: expects a floating input, got ", dtype_name(x.dtype()));
  REMAT_CHECK(x.dim() >= 2, "batch_norm: expects an input [N, C, ...], got shape ", shape_str(x.shape()));
  REMAT_CHECK(x.shape()[1] > 0, "batch_norm: the input of shape ", shape_str(x.shape()), " has no channels");
  check_channel_vector(weight, "weight", x);
  check_channel_vector(bias, "bias", x);
  check_channel_vector(running_mean, "running_mean", x, true);
  check_channel_vector(running_var, "running_var", x, true);
  REMAT_CHECK(running_mean.defined() == running_var.defined(),
              "batch_norm: give both running_mean and running_var, or neither");
  REMAT_CHECK(eps > 0.0 && std::isfinite(eps), "batch_norm: eps must be positive and finite, got ", eps);
  REMAT_CHECK(momentum >= 0.0 && momentum <= 1.0, "batch_norm: momentum must be in [0, 1], got ", momentum);
  REMAT_CHECK(!running_mean.defined() || (!running_mean.requires_grad() && !running_var.requires_grad()),
              "batch_norm: the running statistics must not require grad");
  const int64_t per_channel = x.numel() / x.shape()[1];
  if (training) {
    REMAT_CHECK(per_channel > 1, "batch_norm: training needs more than one value per channel, got input shape ",
                shape_str(x.shape()));
  } else {
    REMAT_CHECK(running_mean.defined(), "batch_norm: evaluation mode needs running_mean and running_var");
  }

  TensorList inputs{x};
  const int wi = weight.defined() ? static_cast<int>(inputs.size()) : -1;
  if (weight.defined()) inputs.push_back(weight);
  const int bi = bias.defined() ? static_cast<int>(inputs.size()) : -1;
  if (bias.defined()) inputs.push_back(bias);
  const OpSpec& spec = weight.defined() ? kBatchNormAffine : kBatchNorm;
  // the buffers' own handles (no new handle: a region sees none made by the op that outlives it)
  const Tensor rm = running_mean, rv = running_var;

  TensorList out = autodiff::apply(
      spec, inputs,
      [=](const TensorList& in) {
        const Tensor& xc = in[0];
        Backend& be = kernels::backend_of(xc);
        const Shape channels{xc.shape()[1]};
        Tensor mean, rstd;
        if (training) {
          mean = kernels::empty(channels, accumulate_dtype(xc.dtype()), xc.device());
          Tensor var = kernels::empty(channels, accumulate_dtype(xc.dtype()), xc.device());
          be.batch_norm_statistics(xc, mean, var);
          rstd = reciprocal_std(var, eps);
          if (rm.defined() && autodiff::recompute_depth() == 0) {
            const double unbias = static_cast<double>(per_channel) / static_cast<double>(per_channel - 1);
            update_running(rm, mean, momentum);
            update_running(rv, kernels::unary(UnaryOp::mul_scalar, var, unbias), momentum);
          }
        } else {
          mean = kernels::convert(rm, accumulate_dtype(xc.dtype()));
          rstd = reciprocal_std(kernels::convert(rv, accumulate_dtype(xc.dtype())), eps);
        }
        Tensor y = kernels::empty(xc.shape(), xc.dtype(), xc.device());
        be.batch_norm_apply(xc, mean, rstd, wi >= 0 ? in[wi] : Tensor(), bi >= 0 ? in[bi] : Tensor(), y);
        return TensorList{y, mean, rstd};
      },
      [wi, bi, training](BackwardContext& ctx) {
        const bool need_x = ctx.needs_input_grad(0);
        const bool need_w = wi >= 0 && ctx.needs_input_grad(wi);
        const bool need_b = bi >= 0 && ctx.needs_input_grad(bi);
        if (!need_x && !need_w && !need_b) return;
        Tensor x = ctx.input(0);
        Tensor w = wi >= 0 ? ctx.input(wi) : Tensor();
        const Shape channels{x.shape()[1]};
        Tensor gx = need_x ? kernels::empty(x.shape(), x.dtype(), x.device()) : Tensor();
        Tensor gw = need_w ? kernels::empty(channels, x.dtype(), x.device()) : Tensor();
        Tensor gb = need_b ? kernels::empty(channels, x.dtype(), x.device()) : Tensor();
        kernels::backend_of(x).batch_norm_backward(x, ctx.output(1), ctx.output(2), w, ctx.grad_output(0), training,
                                                   gx, gw, gb);
        if (need_x) ctx.set_input_grad(0, gx);
        if (need_w) ctx.set_input_grad(wi, gw);
        if (need_b) ctx.set_input_grad(bi, gb);
      },
      8.0 * static_cast<double>(x.numel()));
  return out[0];
}

}  // namespace remat
