// Cross entropy of logits [N, C] against i64 targets [N], with label smoothing and an ignored
// target value: the mean over the rows whose target is not ignored of
//   (1 - eps) * -logp[target] + eps * mean_c(-logp[c]),   logp = log_softmax(logits).
// If every row is ignored (or N == 0) the loss is 0 and so is the gradient. The kernel validates
// the targets and writes the mean's weight 1 / count (a 0-d tensor on the logits' device), so
// nothing here reads the targets on the host. The backward keeps that weight, the targets and a
// statistic of the rows (Note [what cross entropy keeps]):
//   glogits[r] = gloss * scale * (softmax[r] - ((1 - eps) * onehot(target[r]) + eps / C)).
//
// Note [what cross entropy keeps]. The softmax the backward needs is exp(logits - lse), lse each
// row's log-sum-exp, and the log-softmax the forward computes is logits - lse in the same dtype,
// so keeping the logits (an input: no new storage) and lse [N] gives the bits that keeping the
// [N, C] log-softmax would give, without writing and reading back an [N, C] tensor between the
// forward and the backward (1.65 GB at GPT-2 small, 8 x 1024 x 50257 float32). (16-bit logits:
// lse is float32, the kernels' float32 stand-in's, so the softmax is that of the log-softmax
// before it would be rounded to 16 bits.) Every backend keeps this one form; how a backend computes
// it is its own (CUDA: Note [cross entropy from checked kernels] in src/tensor/cuda/indexing.cu).
#include <cmath>

#include "autodiff/kernels.h"
#include "autodiff/op.h"

namespace remat {

using autodiff::BackwardContext;
using autodiff::OpSpec;

namespace {

// keeps the logits and the targets, and its outputs lse [N] and the mean's weight
const OpSpec kCrossEntropy{autodiff::OpKind::cross_entropy, autodiff::save_inputs, 2};

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, double label_smoothing, int64_t ignore_index) {
  REMAT_CHECK(logits.defined() && targets.defined(), "cross_entropy: input is undefined");
  REMAT_CHECK(is_floating(logits.dtype()) && logits.dim() == 2,
              "cross_entropy: logits must be a 2-D floating tensor [N, C], got ", dtype_name(logits.dtype()),
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

  return autodiff::apply(
      kCrossEntropy, {logits, targets},
      [n, label_smoothing, ignore_index](const TensorList& in) {
        Tensor x = kernels::contiguous(in[0]);
        Backend& b = kernels::backend_of(x);
        // the loss, its rows, the rows' log-sum-exp and the mean's weight in float32 for 16-bit logits
        const DType loss_dtype = accumulate_dtype(x.dtype());
        Tensor losses = kernels::empty({n}, loss_dtype, x.device());
        Tensor kept = kernels::empty({n}, loss_dtype, x.device());
        Tensor scale = kernels::empty({}, loss_dtype, x.device());
        b.cross_entropy(x, in[1], label_smoothing, ignore_index, losses, kept, scale);
        Tensor total = kernels::reduce(ReduceOp::sum, losses, {0}, false, loss_dtype);
        return TensorList{kernels::binary(BinaryOp::mul, total, scale), kept, scale};
      },
      [n, classes, label_smoothing, ignore_index](BackwardContext& ctx) {
        if (!ctx.needs_input_grad(0)) return;
        Tensor kept = ctx.output(1);
        Tensor x = kernels::contiguous(ctx.input(0));
        Backend& b = kernels::backend_of(kept);
        const DType dtype = ctx.input_meta(0).dtype;
        // every row's loss enters the mean with weight 1 / count (ignored rows get 0 in the kernel)
        Tensor g = kernels::binary(BinaryOp::mul, ctx.grad_output(0), ctx.output(2));
        Tensor gloss = kernels::empty({n}, accumulate_dtype(dtype), kept.device());
        b.copy(g, gloss);
        Tensor glogits = kernels::empty({n, classes}, dtype, kept.device());
        b.cross_entropy_backward(x, kept, ctx.input(1), gloss, label_smoothing, ignore_index, glogits);
        ctx.set_input_grad(0, glogits);
      },
      4.0 * static_cast<double>(logits.numel()))[0];
}

}  // namespace remat
