// The subcommands of the `remat` command line.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace remat::tools {

// Limits of the numeric options (the model sizes are bounded by check_footprint instead).
inline constexpr int kMaxThreads = 1024;
inline constexpr int64_t kMaxSteps = 100'000'000;        // the run keeps 16 bytes per step
inline constexpr int64_t kMaxSampleTokens = 10'000'000;
inline constexpr int64_t kMaxAccumulate = 1'000'000;
inline constexpr int64_t kMaxMicroBatches = 1'000'000'000'000;  // steps x accumulate x ranks

struct TrainOptions {
  std::string data;  // empty: the default corpus
  std::string device = "cpu";  // --device: cpu, cuda or cuda:N (device_option.h)
  std::string backend_options;  // --backend-options: the device's backend options (device_option.h)
  // the defaults are the demo's (scripts/demo), chosen by measurement on the fortunes corpus: a
  // validation loss of about 1.69 in about 3 minutes on 2 cores; batch 16 (or 32) reaches a lower
  // loss than 8 in the same time (docs/cli.md, "The demo's defaults")
  int64_t layers = 2, width = 128, heads = 4, seq = 64, batch = 16, steps = 6500;
  double lr = 4e-3;
  uint64_t seed = 1;
  std::string policy = "every-layer";
  std::string memory_limit;  // --memory-limit: caps budget:auto's memory (empty: the device's)
  double dropout = 0.0;
  int threads = 0;  // 0: all cores
  std::string save, load;
  std::string format = "remat";     // --save's names: remat, nanogpt or hf-gpt2 (--load reads each)
  bool architecture_given = false;  // --layers, --width, --heads or --seq was passed
  bool layers_given = false, width_given = false, heads_given = false, seq_given = false;
  bool eval_only = false;           // --eval-only: the validation loss of the --load weights
  bool tie_embeddings = false;      // lm_head shares wte's weight (with --load: the file says)
  int64_t eval_every = 0;           // validation loss every this many steps (0: about 10 times a run)
  bool allow_nonfinite = false;     // keep training on a NaN or infinite loss or gradient norm
  bool json = false;
  bool progress = true;
  bool explain = false;  // print the per-region table of one step
  bool plan_from_flops = false;  // budget plans priced by FLOPs (ChainPlanOptions::times_from_flops)
  int64_t accumulate = 1;          // micro-batches of --batch per rank and step (data_parallel.h)
  std::string reduce = "ordered";  // gradient sum over MPI ranks: ordered | native
  bool shard_optimizer = false;    // ZeRO-1 under mpirun: each rank keeps 1/N of the AdamW state
  std::string bucket_bytes = "1MiB";  // under mpirun: all-reduce buckets overlapped with the backward (0: after it)
  double clip = 1.0;               // global gradient-norm clipping (0: none)
  bool fuse_optimizer = false;     // AdamW inside the backward (needs --clip 0; one rank)
  // Training states (train_state.h): --state-dir, --state-every (0: about 1 % of the run's time),
  // --resume (a state directory, or a directory of them: the newest)
  std::string state_dir, resume;
  int64_t state_every = 0;
  std::set<std::string> given;  // the options on the command line ("--steps", ...)
  // Set by --resume from the state (not options): the state to load, its vocabulary and GELU.
  std::string resume_state, vocabulary;
  bool tanh_gelu = false;
  // --dtype: what the model computes in: f32, or bf16 / f16 with float32 master weights (mixed
  // precision, docs/precision.md)
  std::string dtype = "f32";
  std::string save_dtype = "f32";  // --save-dtype: the dtype of --save's weights (f32 | bf16)
};
int run_train(const TrainOptions& options);

struct SampleOptions {
  std::string load;
  // for a --load file without remat's metadata (a nanoGPT state_dict): the heads, which no shape
  // gives, and the text whose bytes are the vocabulary (empty: the default corpus)
  int64_t heads = TrainOptions{}.heads;
  bool heads_given = false;
  std::string data;
  std::string prompt;
  std::string device = "cpu";  // --device
  std::string backend_options;  // --backend-options
  int64_t tokens = 300;
  double temperature = 0.6;  // 0: greedy (the most likely character each step)
  int64_t top_k = 0;         // > 0: sample among the k most likely characters only
  double top_p = 1.0;        // < 1: sample among the fewest characters whose probability reaches p
  bool raw = false;          // write the bytes as generated (default: valid UTF-8, bad bytes escaped)
  uint64_t seed = 1;
  int threads = 0;
  bool stop_at_separator = true;  // stop at the fortune separator "\n%\n"
};
int run_sample(const SampleOptions& options);
// The candidates' weights after temperature, top-k and top-p (unnormalised; zero = excluded), for
// logits z; greedy (temperature 0) leaves one candidate, the first most likely.
std::vector<double> sampling_weights(const std::vector<double>& z, double temperature, int64_t top_k, double top_p);
// `bytes` as valid UTF-8: well-formed sequences are kept, every other byte becomes "\xNN".
std::string utf8_escaped(const std::string& bytes);

struct PlanOptions {
  TrainOptions train;  // the model options (and --json, --threads)
  std::string budget;  // e.g. "64MiB"
  std::string costs;   // a JSON file of per-stage costs instead of a model
  std::string offload;  // a directory: the smallest budget with it too, and --budget planned with it
};
int run_plan(const PlanOptions& options);

}  // namespace remat::tools
