// src/tools/train_report.h - what one `remat train` run measured, and how it is shown: the text
// report on stderr (nothing under --quiet) and the JSON lines on stdout (--json).
//
//   RunMeasure m = ...;   // filled by the step loop (train.cpp)
//   RunSummary s = ...;   // the probe against save-all, the per-rank figures, the budget plan
//   print_report(Human{o.progress}, o, dp, policy, m, s);
//   if (o.json) emit_run_json(o, dp, policy, m, s);
#pragma once

#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "data_parallel.h"
#include "remat/remat.h"

namespace remat::tools {

// Human output: on stderr, nothing under --quiet (stdout carries only the JSON lines).
struct Human {
  bool on;
  [[gnu::format(printf, 2, 3)]] void operator()(const char* format, ...) const {
    if (!on) return;
    va_list args;
    va_start(args, format);
    std::vfprintf(stderr, format, args);
    va_end(args);
  }
};

// One JSON line on stdout (NaN and infinities become null).
void emit_json(const nlohmann::json& j);

inline std::string bytes_text(size_t bytes) { return memory::format_bytes(static_cast<double>(bytes)); }

// One forward + backward under a policy (no optimizer step), measured.
struct StepMeasure {
  double seconds = 0, loss = 0;
  size_t peak_saved = 0, peak_total = 0;
  double recomputed_flops = 0;
  Counters counters;  // regions of this step
};

// The end-of-run comparison of the policy with save-all: this many steps of each, in turns.
inline constexpr int kProbeSteps = 5;

// The final loss is the mean of the last this many steps' losses.
inline constexpr size_t kReportedLossTail = 10;

// What the training steps measured.
struct RunMeasure {
  int64_t start_step = 0;  // resumed: the steps before the state, whose measures are not here
  double first_loss = std::nan("");
  std::vector<double> step_seconds;  // of the steps this process ran
  std::vector<double> losses;        // theirs, after (resumed) the last kReportedLossTail before
  int stopped_by = 0;                // the signal that stopped the run (a state was written), or 0
  double last_val_loss = std::nan("");  // evaluated at the last step
  double profiling_step_seconds = 0;    // budget policy: the first steps profile the chain
  size_t peak_saved = 0, peak_total = 0;
  double recomputed_flops = 0;
  DynamicCounters dynamic;  // dynamic: and offload: policies, summed over the run
  BudgetCounters budget;    // budget: policies: steps whose measured peak passed the budget, over the run
  std::string digest;       // of the gradients of step min(kProfilingSteps, steps - 1) + 1
  int64_t digest_step = 0;  // that step, counted from 1
  bool digest_under_plan = false;  // budget: whether that step ran the plan
  double communication_seconds = 0, hidden_seconds = 0;
  size_t optimizer_state_bytes = 0;  // allocated by the first step (AdamW's moments)
  double train_seconds = 0;
  bool bucketed = false;  // under mpirun with --bucket-bytes > 0: the buckets' count and buffers
  size_t buckets = 0, bucket_buffer_bytes = 0;
  // --state-dir: the states written, their time, the last one's path, the interval (0: automatic)
  int64_t state_writes = 0, state_interval = 0;
  double state_write_seconds = 0, last_state_write_seconds = 0;
  std::string state_path;
};

// What the run's end adds: the probe step under the policy and under save-all, every rank's
// figures, the budget plan's prediction, and what the run was.
struct RunSummary {
  double final_loss = 0;  // mean of the last `tail` steps' losses
  size_t tail = 0;
  StepMeasure chosen, save_all;  // the median of kProbeSteps steps each, on the same batch, in turns
  std::string weights_digest;    // of the final parameters (train_steps.h)
  std::vector<double> rank_peak_saved, rank_peak_total, rank_optimizer_bytes;
  double step_median = 0, tokens_per_second = 0;
  std::optional<BudgetPlanner::Report> plan;  // budget policy
  double predicted_step_seconds = 0;
  int64_t parameters = 0, vocab = 0;
  size_t bucket_bytes = 0;  // --bucket-bytes
  bool sharded = false;     // --shard-optimizer under mpirun
  std::string device_text;  // the device and its memory at the end of the run (device_option.h)
  nlohmann::json device;
};

// The report after the run: losses, the probe against save-all, the plan, the policy's counters,
// (--explain) the probe's regions, (mpirun) communication and every rank's memory.
void print_report(const Human& say, const TrainOptions& o, const DataParallel& dp, const Policy& policy,
                  const RunMeasure& m, const RunSummary& s);
// The run's JSON line.
void emit_run_json(const TrainOptions& o, const DataParallel& dp, const Policy& policy, const RunMeasure& m,
                   const RunSummary& s);

}  // namespace remat::tools
