// `remat train`'s options (cli.h); the command is train.cpp.
#include "cli.h"
#include "corpus.h"

namespace remat::tools {

namespace {

struct TrainCommand : Parsed<TrainOptions> {
  using Parsed::Parsed;
  bool quiet = false;  // --quiet: options.progress = false
};

// The options after the model's: the run, the optimizer, the weights, the output.
void add_run_options(CLI::App* t, Numbers& n, TrainOptions& train) {
  n.add<int64_t>("--steps", train.steps, 1, kMaxSteps, "optimizer steps");
  n.add<int64_t>("--eval-every", train.eval_every, 0, kMaxSteps,
                 "validation loss every N steps, and after the last (0: about 10 times a run)");
  n.add_real("--lr", train.lr, "peak learning rate, > 0 (warm-up, then cosine decay to 0)");
  n.add<int64_t>("--accumulate", train.accumulate, 1, kMaxAccumulate,
                 "micro-batches of --batch summed per step (and per rank under mpirun)");
  t->add_option("--reduce", train.reduce, "gradient sum over MPI ranks: ordered (rank order, exact) | native")
      ->capture_default_str();
  t->add_option("--dtype", train.dtype,
                "what the model computes in: f32 | bf16 | f16 (bf16, f16: mixed precision, float32 master weights "
                "and optimizer state, activations and saved values in 16 bits, losses and statistics in float32)")
      ->capture_default_str();
  t->add_option("--policy", train.policy,
                "what is kept: save-all | every-layer | every-k:K | selective:OPS | budget:BYTES | budget:auto | "
                "dynamic:BYTES; and where: +offload:DIR[,threshold=BYTES][,ram=BYTES] after any (e.g. "
                "every-layer+offload:/scratch; after dynamic: it takes evictions, without ram=); offload:DIR alone is "
                "save-all+offload:DIR")->capture_default_str();
  t->add_option("--memory-limit", train.memory_limit,
                "with --policy budget:auto: the most memory the run may use, e.g. 2GiB (default: the device's free "
                "memory; on the CPU the host's available memory or the cgroup's limit)");
  t->add_flag("--shard-optimizer", train.shard_optimizer,
              "under mpirun: each rank keeps and updates the AdamW state of 1/N of the parameters (ZeRO-1)");
  t->add_option("--bucket-bytes", train.bucket_bytes,
                "under mpirun: gradients are all-reduced in buckets of this size while the backward runs "
                "(0: all at once after it)")->capture_default_str();
  n.add_real("--clip", train.clip, "clip the global gradient norm to this, >= 0 (0: no clipping)");
  t->add_flag("--fuse-optimizer", train.fuse_optimizer,
              "update each parameter as soon as its gradient is final, inside the backward, and free the gradient "
              "(needs --clip 0; one process)");
}

void add_weight_and_output_options(CLI::App* t, TrainOptions& train, bool& quiet) {
  t->add_option("--save", train.save, "write the weights here (a safetensors file; for --format hf-gpt2 a directory)");
  t->add_option("--load", train.load, "start from these weights (architecture from the file; remat, nanoGPT or Hugging Face GPT-2 "
                "layout; a file without remat metadata takes --heads and the vocabulary of --data)");
  t->add_option("--save-dtype", train.save_dtype,
                "the dtype of the weights --save writes: f32 | bf16 (the float32 weights rounded once)")
      ->capture_default_str();
  t->add_option("--format", train.format, "names and layout of --save: remat | nanogpt | hf-gpt2 (a directory Transformers loads)")->capture_default_str();
  t->add_flag("--tie-embeddings", train.tie_embeddings,
              "the output layer shares the token embedding's weight (one parameter, as in nanoGPT and GPT-2; "
              "with --load the file decides: tied when it has no lm_head.weight)");
  t->add_flag("--allow-nonfinite", train.allow_nonfinite,
              "keep training when the loss or the gradient norm is NaN or infinite (default: stop with an error)");
  t->add_flag("--json", train.json,
              "JSON lines on stdout: one per validation, then the results (human output stays on stderr)");
  t->add_flag("--eval-only", train.eval_only,
              "with --load: print the validation loss of the weights on --data, and train nothing (with --save: "
              "write them in --format, a conversion)");
  t->add_flag("--explain", train.explain,
              "print, per checkpoint region of one step, what it kept, what its re-run saved, its times and re-runs");
  t->add_flag("--plan-from-flops", train.plan_from_flops,
              "budget plans price each layer call by its FLOP estimate instead of its measured time: one model plans the same on every run and machine (predicted times are then nominal)");
  t->add_flag("--quiet", quiet, "print nothing but errors (and the JSON lines with --json)");
}

void add_state_options(CLI::App* t, Numbers& n, TrainOptions& train) {
  t->add_option("--state-dir", train.state_dir,
                "keep the training state here (weights, optimizer, schedule, random streams, data position), every "
                "--state-every steps, at the end and when stopped by SIGINT or SIGTERM; the last two are kept");
  n.add<int64_t>("--state-every", train.state_every, 0, kMaxSteps,
                 "steps between training states (0: as often as costs about 1% of the run's time, measured)");
  t->add_option("--resume", train.resume,
                "continue the run whose state is in this directory (the newest state of a --state-dir, or one "
                "state); its options come from the state, and options given beside it must agree");
}

}  // namespace

Subcommand add_train(CLI::App& app) {
  auto* t = app.add_subcommand("train", "train a character-level GPT on a text corpus (default: Debian's fortunes)");
  auto command = std::make_shared<TrainCommand>(t);
  TrainOptions& train = command->options;
  t->add_option("--data", train.data,
                "text file or folder of text files, at most " + std::to_string(kMaxCorpusMiB) +
                    " MiB in all (default: /usr/share/games/fortunes)");
  t->add_option("--device", train.device, "where the model, batches and evaluation run: cpu | cuda | cuda:N")
      ->capture_default_str();
  t->add_option("--backend-options", train.backend_options,
                "the device backend's options, comma-separated: async, stream_ordered_allocator, copy_stream, "
                "sixteen_bit, tf32, profile, each or -NAME, or none (docs/backends.md); the report and --json name "
                "those in force");
  add_model_options(command->numbers, train);
  add_run_options(t, command->numbers, train);
  add_weight_and_output_options(t, train, command->quiet);
  add_state_options(t, command->numbers, train);
  return {t, [command, t] {
            command->numbers.convert();
            for (const CLI::Option* option : t->get_options())
              if (option->count() > 0)
                for (const std::string& name : option->get_lnames()) command->options.given.insert("--" + name);
            note_architecture(command->options);
            command->options.progress = !command->quiet;
            return run_train(command->options);
          }};
}

}  // namespace remat::tools
