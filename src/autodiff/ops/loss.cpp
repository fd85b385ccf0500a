// Cross entropy of logits [N, C] against i64 targets [N], with label smoothing and an ignored
// target value: the mean over the rows whose target is not ignored of
//   (1 - eps) * -logp[target] + eps * mean_c(-logp[c]),   logp = log_softmax(logits).
// If every row is ignored (or N == 0) the loss is 0 and so is the gradient. The backward keeps
// the log-softmax (an aux output) and the targets:
//   glogits[r] = gloss / count * (softmax[r] - ((1 - eps) * onehot(target[r]) + eps / C)).
#include <cmath>

#include "autodiff/kernels.h"
#include "autodiff/op.h"

namespace remat {

using autodiff::BackwardContext;
using autodiff::OpSpec;

namespace {

const OpSpec kCrossEntropy{"cross_entropy", autodiff::save_inputs, 1, 0b10};  // keeps the targets only

Tensor contiguous_copy(const Tensor& t) { return t.is_contiguous() ? t : kernels::copy(t); }

// Calls f(row, target) for every target, reading CPU memory in place (strided). Targets on
// another device are first copied to the host.
template <class F>
void for_each_target(const Tensor& targets, F&& f) {
  Tensor host = targets;
  if (targets.device().type != DeviceType::cpu) {
    host = Tensor::empty(targets.shape(), DType::i64, memory::Tag::other, Device{});
    backend(targets.device()).copy(targets, host);
  }
  const int64_t* t = host.data<int64_t>();
  const int64_t stride = host.strides()[0];
  for (int64_t r = 0, n = host.size(0); r < n; ++r) f(r, t[r * stride]);
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, double label_smoothing, int64_t ignore_index) {
  REMAT_CHECK(logits.defined() && targets.defined(), "cross_entropy: input is undefined");
  REMAT_CHECK(is_floating(logits.dtype()) && logits.dim() == 2,
              "cross_entropy: logits must be a 2-D f32 or f64 tensor [N, C], got ", dtype_name(logits.dtype()),
              " of shape ", shape_str(logits.shape()));
  REMAT_CHECK(targets.dtype() == DType::i64 && targets.dim() == 1 && targets.size(0) == logits.size(0),
              "cross_entropy: targets must be i64 of shape [", logits.size(0), "] for logits of shape ",
              shape_str(logits.shape()), ", got ", dtype_name(targets.dtype()), " of shape ", shape_str(targets.shape()));
  REMAT_CHECK(logits.device() == targets.device(), "cross_entropy: logits are on ", device_name(logits.device()),
              ", targets on ", device_name(targets.device()));
  REMAT_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, "cross_entropy: label_smoothing ", label_smoothing,
              " is outside [0, 1]");
  const int64_t n = logits.size(0), classes = logits.size(1);
  REMAT_CHECK(classes > 0 || n == 0, "cross_entropy: logits of shape ", shape_str(logits.shape()), " have no classes");

  // Validate the targets and count the rows that contribute, before anything is recorded.
  int64_t count = 0;
  for_each_target(targets, [&](int64_t r, int64_t t) {
    if (t == ignore_index) return;
    REMAT_CHECK(t >= 0 && t < classes, "cross_entropy: target ", t, " at row ", r, " is out of range for ", classes,
                " classes (logits of shape ", shape_str(logits.shape()), ", ignore_index ", ignore_index, ")");
    ++count;
  });
  const double scale = count > 0 ? 1.0 / static_cast<double>(count) : 0.0;

  return autodiff::apply(
      kCrossEntropy, {logits, targets},
      [n, classes, scale, label_smoothing, ignore_index](const TensorList& in) {
        Tensor x = contiguous_copy(in[0]);
        Backend& b = kernels::backend_of(x);
        Tensor losses = kernels::empty({n}, x.dtype(), x.device());
        Tensor logp = kernels::empty({n, classes}, x.dtype(), x.device());
        b.cross_entropy(x, in[1], label_smoothing, ignore_index, losses, logp);
        Tensor total = kernels::reduce(ReduceOp::sum, losses, {0}, false, x.dtype());
        return TensorList{kernels::unary(UnaryOp::mul_scalar, total, scale), logp};
      },
      [n, classes, scale, label_smoothing, ignore_index](BackwardContext& ctx) {
        if (!ctx.needs_input_grad(0)) return;
        Tensor logp = ctx.output(1);
        Backend& b = kernels::backend_of(logp);
        // every row's loss enters the mean with weight 1 / count (ignored rows get 0 in the kernel)
        Tensor g = kernels::unary(UnaryOp::mul_scalar, ctx.grad_output(0), scale);
        Tensor gloss = kernels::empty({n}, logp.dtype(), logp.device());
        b.copy(g, gloss);
        Tensor glogits = kernels::empty({n, classes}, logp.dtype(), logp.device());
        b.cross_entropy_backward(logp, ctx.input(1), gloss, label_smoothing, ignore_index, glogits);
        ctx.set_input_grad(0, glogits);
      },
      4.0 * static_cast<double>(logits.numel()))[0];
}

}  // namespace remat
