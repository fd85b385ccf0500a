// Losses: mean squared error and the cross entropy wrapper for [..., C] logits.
#include "remat/nn/loss.h"

#include "remat/ops.h"

namespace remat::nn {

Tensor mse_loss(const Tensor& pred, const Tensor& target) {
  REMAT_CHECK(pred.defined() && target.defined(), "mse_loss: input is undefined");
  REMAT_CHECK(pred.shape() == target.shape(), "mse_loss: pred of shape ", shape_str(pred.shape()),
              " and target of shape ", shape_str(target.shape()), " differ");
  return mean(square(sub(pred, target)));
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, double label_smoothing, int64_t ignore_index) {
  REMAT_CHECK(logits.defined() && targets.defined(), "cross_entropy: input is undefined");
  REMAT_CHECK(logits.dim() >= 1, "cross_entropy: logits must have a class axis, got shape ", shape_str(logits.shape()));
  Shape lead(logits.shape().begin(), logits.shape().end() - 1);
  REMAT_CHECK(targets.shape() == lead, "cross_entropy: targets of shape ", shape_str(targets.shape()),
              " do not match logits of shape ", shape_str(logits.shape()), " (expected ", shape_str(lead), ")");
  const int64_t classes = logits.size(-1);
  const int64_t rows = shape_numel(lead);
  return remat::cross_entropy(logits.reshape({rows, classes}), targets.reshape({rows}), label_smoothing, ignore_index);
}

}  // namespace remat::nn
