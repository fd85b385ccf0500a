// remat/nn/loss.h - losses.
//
//   Tensor l1 = remat::nn::mse_loss(pred, target);                      // mean((pred - target)^2)
//   Tensor l2 = remat::nn::cross_entropy(logits, targets, /*label_smoothing=*/0.1);
#pragma once

#include <cstdint>

#include "remat/tensor.h"

namespace remat::nn {

// mean((pred - target)^2) over all elements; shapes must be equal (no broadcasting, which would
// silently change the mean).
Tensor mse_loss(const Tensor& pred, const Tensor& target);

// Mean cross entropy of logits [..., C] against i64 targets [...] (the leading axes are
// flattened), with label smoothing eps: each row's loss is (1 - eps) * -log p[target] +
// eps * mean_c(-log p[c]); rows whose target is ignore_index are left out of the mean.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, double label_smoothing = 0.0,
                     int64_t ignore_index = -100);

}  // namespace remat::nn
