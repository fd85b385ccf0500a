// Softmax and log-softmax over any axis. The kernels work on the last axis of a contiguous
// tensor; another axis is first swapped with the last one (a view, made contiguous), and the
// result is swapped back (so it is a view of a contiguous buffer in the swapped layout). Both
// backward formulas need only the output y:
//   softmax:      gx = y * (gy - sum(gy * y))
//   log-softmax:  gx = gy - exp(y) * sum(gy)
#include "autodiff/kernels.h"
#include "autodiff/op.h"

namespace remat {

using autodiff::BackwardContext;
using autodiff::OpSpec;

namespace {

const OpSpec kSoftmax{autodiff::OpKind::softmax, autodiff::save_outputs};
const OpSpec kLogSoftmax{autodiff::OpKind::log_softmax, autodiff::save_outputs};


Tensor softmax_op(const OpSpec& spec, bool log, const Tensor& x, int64_t axis) {
  const char* op = spec.name.c_str();
  REMAT_CHECK(x.defined(), op, ": input is undefined");
  REMAT_CHECK(is_floating(x.dtype()), op, ": expects a floating tensor (f32, f64, bf16, f16), got ", dtype_name(x.dtype()), " of shape ",
              shape_str(x.shape()));
  const int64_t rank = x.dim();
  REMAT_CHECK(rank >= 1, op, ": expects a tensor of rank >= 1, got shape ", shape_str(x.shape()));
  const int64_t a = axis < 0 ? axis + rank : axis;
  REMAT_CHECK(a >= 0 && a < rank, op, ": axis ", axis, " out of range for shape ", shape_str(x.shape()));
  const int64_t last = rank - 1;
  const bool swap = a != last;

  return autodiff::apply1(
      spec, {x},
      [log, swap, a, last](const TensorList& in) {
        Tensor xs = kernels::contiguous(swap ? in[0].transpose(a, last) : in[0]);
        Tensor y = kernels::empty(xs.shape(), xs.dtype(), xs.device());
        kernels::backend_of(xs).softmax(xs, y, log);
        return TensorList{swap ? y.transpose(a, last) : y};
      },
      [log, swap, a, last](BackwardContext& ctx) {
        Tensor y = ctx.output(0);
        Tensor gy = ctx.grad_output(0);
        if (swap) {
          y = y.transpose(a, last);
          gy = gy.transpose(a, last);
        }
        y = kernels::contiguous(y);
        gy = kernels::contiguous(gy);
        Tensor gx = kernels::empty(y.shape(), y.dtype(), y.device());
        kernels::backend_of(y).softmax_backward(y, gy, gx, log);
        ctx.set_input_grad(0, swap ? gx.transpose(a, last) : gx);
      },
      5.0 * static_cast<double>(x.numel()));
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t axis) { return softmax_op(kSoftmax, false, x, axis); }
Tensor log_softmax(const Tensor& x, int64_t axis) { return softmax_op(kLogSoftmax, true, x, axis); }

}  // namespace remat
