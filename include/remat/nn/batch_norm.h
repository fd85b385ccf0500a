// remat/nn/batch_norm.h - batch normalisation with running statistics, updated once per step
// whatever the checkpointing policy.
//
//   auto bn = std::make_shared<remat::nn::BatchNorm2d>(16);     // x [N, 16, H, W]
//   Tensor y = bn->forward(x);          // training: batch statistics; running stats updated
//   bn->eval();
//   Tensor z = bn->forward(x);          // evaluation: the running statistics normalise
//
// Training mode normalises each channel with the batch's mean and biased variance and updates
//   running_mean = (1 - momentum) running_mean + momentum mean
//   running_var  = (1 - momentum) running_var  + momentum var * n / (n - 1)
// (n values per channel), as PyTorch does. The update is a side effect of the batch_norm op, so a
// recomputation (any policy, dynamic: and offload: included) normalises with the batch statistics
// computed again from the same input and leaves the running statistics alone: they change exactly
// once per training step under every policy. num_batches_tracked() counts those updates.
//
// Parameters (affine): weight [C] = 1, bias [C] = 0. The running statistics are state, not
// parameters: they take no gradient, are not in named_parameters() (so Module::save does not
// write them; use running_mean / running_var directly), and live in the parameter memory account.
// They are the module's buffers (named_buffers()), so to(device) moves them with the parameters.
#pragma once

#include <cstdint>

#include "remat/nn/module.h"

namespace remat::nn {

class BatchNorm : public Module {
 public:
  // track_running_stats = false: batch statistics in evaluation mode too, no running state.
  BatchNorm(int64_t num_features, double eps, double momentum, bool affine, bool track_running_stats, DType dtype,
            int min_rank, int max_rank, const char* name);
  std::string type_name() const override;
  int64_t num_features() const { return features_; }
  int64_t num_batches_tracked() const { return batches_tracked_; }
  // "num_batches_tracked", for training states
  std::vector<std::pair<std::string, int64_t>> state_counters() const override;
  void set_state_counter(const std::string& name, int64_t value) override;
  // Running statistics back to mean 0, variance 1, and the count to 0.
  void reset_running_stats();

  Tensor weight, bias;              // undefined without affine
  Tensor running_mean, running_var;  // undefined without track_running_stats

 protected:
  Tensor forward_impl(const Tensor& x) override;

 private:
  int64_t features_;
  double eps_, momentum_;
  int min_rank_, max_rank_;
  const char* name_;
  int64_t batches_tracked_ = 0;
};

// x [N, C] or [N, C, L]
class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5, double momentum = 0.1, bool affine = true,
                       bool track_running_stats = true, DType dtype = DType::f32)
      : BatchNorm(num_features, eps, momentum, affine, track_running_stats, dtype, 2, 3, "BatchNorm1d") {}
};

// x [N, C, H, W]
class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1, bool affine = true,
                       bool track_running_stats = true, DType dtype = DType::f32)
      : BatchNorm(num_features, eps, momentum, affine, track_running_stats, dtype, 4, 4, "BatchNorm2d") {}
};

}  // namespace remat::nn
