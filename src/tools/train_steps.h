// `remat train`'s step loop: per step the gradients of every micro-batch (data_parallel.h), the
// finite check, the optimizer's update, the step's measures added to the run's (RunMeasure),
// validation and the progress line.
//
//   Optimization opt(o, dp, *l.model);
//   StepLoop loop(o, dp, checked.policy, checked.bucket_bytes, l, opt);
//   const RunMeasure m = loop.run();
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "commands.h"
#include "data_parallel.h"
#include "progress.h"
#include "train_load.h"
#include "train_report.h"
#include "remat/distributed.h"
#include "remat/nn.h"
#include "remat/remat.h"

namespace remat::tools::training {

class StateKeeper;  // train_state.h

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// FNV-1a over n bytes, continued from h.
uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull);

// The median (the upper of the two middle values); 0 for none.
double median(std::vector<double> v);

// FNV-1a over the per-parameter FNV-1a hashes of the parameters' bytes, in named_parameters()
// order, as 16 hexadecimal digits: equal for equal weights, whatever the device.
std::string weights_digest(const nn::Module& model);

// The tokens of one step's global batch (all micro-batches of all ranks).
double tokens_per_step(const TrainOptions& o, const DataParallel& dp, const nn::GPTConfig& config);

// The optimizer: every rank updates every parameter, or (--shard-optimizer) only those whose
// state it owns.
struct Optimization {
  TensorList all_params;
  bool sharded;
  std::vector<int> owners;  // with sharded: the rank that updates each of all_params
  nn::AdamW optimizer;
  nn::WarmupCosine lr_at;

  Optimization(const TrainOptions& o, const DataParallel& dp, nn::GPT& model);
};

// The --steps steps of one run, measured.
class StepLoop {
 public:
  // `keeper`, when not null, writes the training states; `restored` holds the measures of the steps
  // before a resumed state (RunMeasure::start_step is the first step to run).
  StepLoop(const TrainOptions& o, const DataParallel& dp, const Policy& policy, size_t bucket_bytes, Loaded& l,
           Optimization& opt, RunMeasure restored = {}, StateKeeper* keeper = nullptr);
  // Runs the steps left of --steps, or until a signal stops it (RunMeasure::stopped_by); the
  // gradient buckets stay allocated while the loop lives.
  RunMeasure run();

 private:
  struct Gradients {
    double loss, grad_norm;
  };
  FusedUpdate fused_update(int64_t step, double& grad_sq, std::vector<std::optional<uint64_t>>& hashes);
  Gradients gradients(int64_t step);
  void check_finite(int64_t step, const Gradients& g);
  void update(int64_t step);
  void account(int64_t step, Clock::time_point t0, double loss_value);
  void evaluate(int64_t step, double loss_value, Clock::time_point run_start);
  void show(int64_t step);

  const TrainOptions& o_;
  const Policy& policy_;
  Loaded& l_;
  Optimization& opt_;
  StateKeeper* keeper_;
  Progress progress_;
  const int64_t eval_every_;
  const double tokens_per_step_;
  RunMeasure m_;
  const size_t saved_base_, total_base_;
  // under mpirun: the gradients are reduced in buckets while the backward runs (--bucket-bytes);
  // allocated after total_base_, so that the peak total counts their buffers
  std::optional<distributed::GradientBuckets> buckets_;
  DataParallel step_dp_;
};

}  // namespace remat::tools::training
