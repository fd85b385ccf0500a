// The subcommands of the `remat` command line.
#pragma once

#include <cstdint>
#include <string>

namespace remat::tools {

// Limits of the numeric options (the model sizes are bounded by check_footprint instead).
inline constexpr int kMaxThreads = 1024;
inline constexpr int64_t kMaxSteps = 100'000'000;        // the run keeps 16 bytes per step
inline constexpr int64_t kMaxSampleTokens = 10'000'000;
inline constexpr int64_t kMaxAccumulate = 1'000'000;
inline constexpr int64_t kMaxMicroBatches = 1'000'000'000'000;  // steps x accumulate x ranks

struct TrainOptions {
  std::string data;  // empty: the default corpus
  int64_t layers = 4, width = 128, heads = 4, seq = 64, batch = 32, steps = 1000;
  double lr = 2e-3;
  uint64_t seed = 1;
  std::string policy = "every-layer";
  double dropout = 0.0;
  int threads = 0;  // 0: all cores
  std::string save, load;
  bool architecture_given = false;  // --layers, --width, --heads or --seq was passed
  bool allow_nonfinite = false;     // keep training on a NaN or infinite loss or gradient norm
  bool json = false;
  bool progress = true;
  bool explain = false;  // print the per-region table of one step
  int64_t accumulate = 1;          // micro-batches of --batch per rank and step (data_parallel.h)
  std::string reduce = "ordered";  // gradient sum over MPI ranks: ordered | native
  bool shard_optimizer = false;    // ZeRO-1 under mpirun: each rank keeps 1/N of the AdamW state
};
int run_train(const TrainOptions& options);

struct SampleOptions {
  std::string load;
  std::string prompt;
  int64_t tokens = 300;
  double temperature = 0.8;
  uint64_t seed = 1;
  int threads = 0;
  bool stop_at_separator = true;  // stop at the fortune separator "\n%\n"
};
int run_sample(const SampleOptions& options);

struct PlanOptions {
  TrainOptions train;  // the model options (and --json, --threads)
  std::string budget;  // e.g. "64MiB"
  std::string costs;   // a JSON file of per-stage costs instead of a model
};
int run_plan(const PlanOptions& options);

}  // namespace remat::tools
