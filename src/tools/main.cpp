// The `remat` command line.
//   remat train [--data PATH] [--layers N] ... [--policy P] [--json]
//   remat sample --load FILE [--prompt TEXT] [--tokens N]
//   remat plan --budget BYTES [model options | --costs FILE] [--json]
#include <CLI/CLI.hpp>
#include <cstdio>

#include "commands.h"
#include "remat/error.h"

int main(int argc, char** argv) {
  using namespace remat::tools;
  CLI::App app{"remat: train differentiable tensor programs when memory is the limit (recomputation by default)"};
  app.require_subcommand(1);

  TrainOptions train;
  auto* t = app.add_subcommand("train", "train a character-level GPT on a text corpus (default: Debian's fortunes)");
  t->add_option("--data", train.data, "text file or folder of text files (default: /usr/share/games/fortunes)");
  t->add_option("--layers", train.layers, "transformer blocks")->capture_default_str();
  t->add_option("--width", train.width, "embedding width")->capture_default_str();
  t->add_option("--heads", train.heads, "attention heads")->capture_default_str();
  t->add_option("--seq", train.seq, "sequence length")->capture_default_str();
  t->add_option("--batch", train.batch, "sequences per step")->capture_default_str();
  t->add_option("--steps", train.steps, "optimizer steps")->capture_default_str();
  t->add_option("--lr", train.lr, "peak learning rate (warm-up then cosine decay)")->capture_default_str();
  t->add_option("--seed", train.seed, "seed for initialisation, batches and dropout")->capture_default_str();
  t->add_option("--policy", train.policy,
                "save-all | every-layer | every-k:K | selective:OPS | budget:BYTES")->capture_default_str();
  t->add_option("--dropout", train.dropout, "dropout probability")->capture_default_str();
  t->add_option("--threads", train.threads, "CPU threads (0: all cores)")->capture_default_str();
  t->add_option("--save", train.save, "write the weights (safetensors) here");
  t->add_option("--load", train.load, "start from these weights (architecture from the file)");
  t->add_flag("--json", train.json, "print one JSON object with the results as the last line");
  t->add_flag("--explain", train.explain,
              "print, per checkpoint region of one step, what it kept, what its re-run saved, its times and re-runs");
  bool quiet = false;
  t->add_flag("--quiet", quiet, "no progress output");

  SampleOptions sample;
  auto* s = app.add_subcommand("sample", "generate text from weights saved by `remat train --save`");
  s->add_option("--load", sample.load, "weights file")->required();
  s->add_option("--prompt", sample.prompt, "text to continue");
  s->add_option("--tokens", sample.tokens, "characters to generate")->capture_default_str();
  s->add_option("--temperature", sample.temperature, "sampling temperature")->capture_default_str();
  s->add_option("--seed", sample.seed, "sampling seed")->capture_default_str();
  s->add_option("--threads", sample.threads, "CPU threads (0: all cores)")->capture_default_str();

  PlanOptions plan;
  auto* p = app.add_subcommand("plan", "show the schedule a budget:BYTES policy runs, against uniform segments and every-layer");
  p->add_option("--budget", plan.budget, "memory budget for saved bytes, e.g. 64MiB")->required();
  p->add_option("--costs", plan.costs, "JSON file of per-stage costs instead of profiling a model");
  p->add_option("--data", plan.train.data, "text file or folder (for the vocabulary)");
  p->add_option("--layers", plan.train.layers, "transformer blocks")->capture_default_str();
  p->add_option("--width", plan.train.width, "embedding width")->capture_default_str();
  p->add_option("--heads", plan.train.heads, "attention heads")->capture_default_str();
  p->add_option("--seq", plan.train.seq, "sequence length")->capture_default_str();
  p->add_option("--batch", plan.train.batch, "sequences per step")->capture_default_str();
  p->add_option("--seed", plan.train.seed, "seed")->capture_default_str();
  p->add_option("--dropout", plan.train.dropout, "dropout probability")->capture_default_str();
  p->add_option("--threads", plan.train.threads, "CPU threads (0: all cores)")->capture_default_str();
  p->add_flag("--json", plan.train.json, "print one JSON object");

  CLI11_PARSE(app, argc, argv);
  try {
    if (*t) {
      train.progress = !quiet;
      return run_train(train);
    }
    if (*s) return run_sample(sample);
    if (*p) return run_plan(plan);
  } catch (const remat::Error& e) {
    std::fprintf(stderr, "remat: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "remat: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
