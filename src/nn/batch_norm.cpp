// BatchNorm1d / BatchNorm2d (see include/remat/nn/batch_norm.h). The once-per-step rule is the
// batch_norm op's: its running-statistics update is a side effect, skipped by every recomputation
// (docs/design.md, "Side effects"); the layer only counts first runs.
#include "remat/nn/batch_norm.h"

#include <cmath>

#include "remat/checkpoint.h"
#include "remat/ops.h"

namespace remat::nn {

BatchNorm::BatchNorm(int64_t num_features, double eps, double momentum, bool affine, bool track_running_stats,
                     DType dtype, int min_rank, int max_rank, const char* name)
    : features_(num_features), eps_(eps), momentum_(momentum), min_rank_(min_rank), max_rank_(max_rank), name_(name) {
  REMAT_CHECK(num_features > 0, name, ": num_features must be positive, got ", num_features);
  REMAT_CHECK(eps > 0.0 && std::isfinite(eps), name, ": eps must be positive and finite, got ", eps);
  REMAT_CHECK(momentum >= 0.0 && momentum <= 1.0, name, ": momentum must be in [0, 1], got ", momentum);
  REMAT_CHECK(is_floating(dtype), name, ": dtype must be floating (f32, f64, bf16, f16), got ", dtype_name(dtype));
  if (affine) {
    weight = register_parameter("weight", {num_features}, dtype, Init::ones());
    bias = register_parameter("bias", {num_features}, dtype, Init::zeros());
  }
  if (track_running_stats) {
    running_mean = register_buffer("running_mean", zeros({num_features}, dtype, memory::Tag::parameter));
    running_var = register_buffer("running_var", ones({num_features}, dtype, memory::Tag::parameter));
  }
}

std::string BatchNorm::type_name() const { return detail::concat(name_, "(", features_, ")"); }

void BatchNorm::reset_running_stats() {
  if (running_mean.defined()) {
    running_mean.fill_(0.0);
    running_var.fill_(1.0);
  }
  batches_tracked_ = 0;
}

std::vector<std::pair<std::string, int64_t>> BatchNorm::state_counters() const {
  return {{"num_batches_tracked", batches_tracked_}};
}

void BatchNorm::set_state_counter(const std::string& name, int64_t value) {
  REMAT_CHECK(name == "num_batches_tracked" && value >= 0, type_name(), ": cannot set counter \"", name, "\" to ",
              value, " (it has \"num_batches_tracked\", >= 0)");
  batches_tracked_ = value;
}

Tensor BatchNorm::forward_impl(const Tensor& x) {
  REMAT_CHECK(x.defined() && x.dim() >= min_rank_ && x.dim() <= max_rank_ && x.size(1) == features_, type_name(),
              ": expects an input ", min_rank_ == 4 ? "[N, " : "[N, ", features_,
              min_rank_ == 4 ? ", H, W]" : "] or [N, " + std::to_string(features_) + ", L]", ", got ",
              x.defined() ? shape_str(x.shape()) : "an undefined tensor");
  const bool tracking = running_mean.defined();
  if (training() || !tracking) {
    const bool update = tracking && training();
    Tensor y = batch_norm(x, compute_weight(weight), compute_weight(bias), update ? running_mean : Tensor(), update ? running_var : Tensor(),
                          /*training=*/true, momentum_, eps_);
    if (update && !is_recomputing()) ++batches_tracked_;
    return y;
  }
  return batch_norm(x, compute_weight(weight), compute_weight(bias), running_mean, running_var, /*training=*/false, momentum_, eps_);
}

}  // namespace remat::nn
