// `remat train`'s training states (remat/nn/training_state.h): --state-dir, --state-every, the
// stop on SIGINT or SIGTERM, and --resume.
//
//   apply_resume(o);                          // --resume: the run's options from the state
//   Loaded l = load(o, device);
//   Optimization opt(o, dp, *l.model);
//   RunMeasure m = restore_state(o, dp, l, opt);   // --resume: weights, optimizer, losses so far
//   StateKeeper keeper(o, dp, l, opt);        // writes a state when due (after_step) and at the end
#pragma once

#include <cstdint>
#include <string>

#include "commands.h"
#include "data_parallel.h"
#include "train_load.h"
#include "train_report.h"
#include "train_steps.h"
#include "remat/nn.h"

namespace remat::tools::training {

// With --resume: the state to load (its newest under a --state-dir) in o.resume_state, and the
// run's options from its configuration. An option given beside --resume that defines the run
// (--steps, --lr, the model, ...) must have the state's value, else a UsageError naming each;
// those that do not change the bits (--policy, --eval-every, --memory-limit, --bucket-bytes,
// --state-every, --data's path) may differ; --threads and --device may too, with a warning.
void apply_resume(TrainOptions& o);

// With --resume, once the number of ranks is known: --accumulate such that the global batch (ranks
// x --accumulate micro-batches) is the state's, whatever the number of ranks that wrote it; a
// UsageError when --accumulate is given otherwise or the ranks cannot share it evenly.
void fit_world(TrainOptions& o, DataParallel& dp);

// With --resume: the --steps of the run in the state (o.steps when the run is extended:
// Note [extending a run]); without: o.steps.
int64_t resumed_run_steps(const TrainOptions& o);

// With --resume, before the text is tokenised: a UsageError when --data is not the run's corpus
// (so a changed corpus is named as such, not as a byte outside the vocabulary).
void check_resumed_corpus(const TrainOptions& o, const Corpus& corpus, const std::string& data_path);

// The run's configuration, as the state keeps it and a resume compares it.
nn::Metadata run_configuration(const TrainOptions& o, const DataParallel& dp, const Loaded& l);

// With --resume: loads the state into the model and the optimizer; returns the measures of the
// steps before it (the losses the report needs, the gradient digest).
RunMeasure restore_state(const TrainOptions& o, const DataParallel& dp, Loaded& l, Optimization& opt);

// Writes the training state to --state-dir every --state-every steps (or as often as costs about
// 1 % of the run's time), at the end, and when a signal asked the run to stop; keeps the last two.
class StateKeeper {
 public:
  // `start`: the step the run starts from (a resumed state's, whose state exists).
  StateKeeper(const TrainOptions& o, const DataParallel& dp, Loaded& l, Optimization& opt, int64_t start);
  // After step `done` (counted from 1): writes a state if one is due or a stop was asked for (on
  // every rank alike); returns the signal that stops the run, or 0.
  int after_step(int64_t done, const RunMeasure& m);
  // After the last step: the final state (unless the last step's was written).
  void finish(int64_t done, const RunMeasure& m);
  // What the writes cost: their number, total and last seconds, the last state's path.
  int64_t writes() const { return writes_; }
  double write_seconds() const { return write_seconds_; }
  double last_write_seconds() const { return last_write_seconds_; }
  const std::string& last_path() const { return last_path_; }
  int64_t interval() const { return interval_; }  // 0: automatic

 private:
  void write(int64_t done, const RunMeasure& m);
  bool stop_requested() const;

  const TrainOptions& o_;
  const DataParallel& dp_;
  Loaded& l_;
  Optimization& opt_;
  nn::Metadata configuration_;
  int64_t interval_ = 0, next_ = 1, written_step_ = -1, writes_ = 0;
  uint64_t last_state_bytes_ = 0;  // rank 0: the last state's bytes on disk (the next one's room)
  double write_seconds_ = 0, last_write_seconds_ = 0;
  std::string last_path_;
};

// How to continue after a stop, for the message and the JSON line.
std::string resume_command(const TrainOptions& o);

}  // namespace remat::tools::training
