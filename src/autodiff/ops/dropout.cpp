// Dropout: y = keep ? x / (1 - p) : 0, element i kept iff uniform_float(philox_word(state, i)) >= p.
// The mask is a pure function of the RngState, so the backward regenerates it from the captured
// state (gx = dropout(gy) with the same state) and nothing but the state is kept: no mask, no
// input, no output. The training version draws the state from the default generator, so a
// checkpoint region that restores the generator at entry replays the same mask.
#include <cmath>

#include "autodiff/kernels.h"
#include "autodiff/op.h"

namespace remat {

using autodiff::BackwardContext;
using autodiff::OpSpec;

namespace {

const OpSpec kDropout{autodiff::OpKind::dropout, autodiff::save_nothing};

void check_dropout(const Tensor& x, double p) {
  REMAT_CHECK(x.defined(), "dropout: input is undefined");
  REMAT_CHECK(is_floating(x.dtype()), "dropout: expects a floating tensor (f32, f64, bf16, f16), got ", dtype_name(x.dtype()),
              " of shape ", shape_str(x.shape()));
  REMAT_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability p = ", p, " is outside [0, 1] (input of shape ",
              shape_str(x.shape()), ")");
}

}  // namespace

Tensor dropout(const Tensor& x, double p, RngState state) {
  check_dropout(x, p);
  return autodiff::apply1(
      kDropout, {x},
      [p, state](const TensorList& in) {
        Tensor y = kernels::empty(in[0].shape(), in[0].dtype(), in[0].device());
        kernels::backend_of(y).dropout(in[0], p, state, y);
        return TensorList{y};
      },
      [p, state](BackwardContext& ctx) {
        Tensor gy = ctx.grad_output(0);
        Tensor gx = kernels::empty(gy.shape(), gy.dtype(), gy.device());
        kernels::backend_of(gx).dropout(gy, p, state, gx);
        ctx.set_input_grad(0, gx);
      });
}

Tensor dropout(const Tensor& x, double p, bool training) {
  check_dropout(x, p);
  if (!training || p == 0.0) return x;
  return dropout(x, p, rng_reserve(static_cast<uint64_t>(x.numel())));
}

}  // namespace remat
