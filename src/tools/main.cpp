// The `remat` command line.
//   remat train [--data PATH] [--layers N] ... [--policy P] [--json]
//   remat sample --load FILE [--prompt TEXT] [--tokens N]
//   remat plan --budget BYTES [model options | --costs FILE] [--json]
// Numeric options are read as text and parsed strictly (numbers.h) with a range each; a bad
// value is a remat::Error ("remat: error: train --width: ...", exit 1), like every other error.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>
#include <vector>

#include "commands.h"
#include "numbers.h"
#include "remat/error.h"

namespace {

using namespace remat::tools;

// The numeric options of one subcommand: registered as text, converted after parsing.
class Numbers {
 public:
  explicit Numbers(CLI::App* app) : app_(app) {}

  // An integer option in [min, max]; `given`, when not null, is set if the option was passed.
  template <class T>
  void add(const std::string& name, T& target, T min, T max, const std::string& help, bool* given = nullptr) {
    auto text = std::make_shared<std::string>(std::to_string(target));
    CLI::Option* option = app_->add_option(name, *text, detail(help, min, max))->capture_default_str();
    option->type_name(std::is_same_v<T, uint64_t> ? "UINT" : "INT");
    converters_.push_back([this, text, option, name, min, max, given, &target] {
      if (option->count() == 0) return;
      if (given) *given = true;
      const std::string what = app_->get_name() + " " + name;
      if constexpr (std::is_same_v<T, uint64_t>) {
        target = parse_uint64(what, *text);
      } else {
        target = static_cast<T>(parse_int(what, *text, static_cast<int64_t>(min), static_cast<int64_t>(max)));
      }
    });
  }

  // A real option: any finite number (the command checks its range).
  void add_real(const std::string& name, double& target, const std::string& help) {
    auto text = std::make_shared<std::string>(CLI::detail::to_string(target));
    CLI::Option* option = app_->add_option(name, *text, help)->capture_default_str();
    option->type_name("REAL");
    converters_.push_back([this, text, option, name, &target] {
      if (option->count() > 0) target = parse_real(app_->get_name() + " " + name, *text);
    });
  }

  void convert() const {
    for (const auto& c : converters_) c();
  }

 private:
  template <class T>
  static std::string detail(const std::string& help, T min, T max) {
    if constexpr (std::is_same_v<T, uint64_t>) return help;
    if (max == std::numeric_limits<T>::max()) return help + " (>= " + std::to_string(min) + ")";
    return help + " [" + std::to_string(min) + ", " + std::to_string(max) + "]";
  }

  CLI::App* app_;
  std::vector<std::function<void()>> converters_;
};

constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();

// The model options shared by train and plan.
void add_model_options(Numbers& n, TrainOptions& o) {
  n.add<int64_t>("--layers", o.layers, 0, kMaxInt, "transformer blocks", &o.architecture_given);
  n.add<int64_t>("--width", o.width, 1, kMaxInt, "embedding width", &o.architecture_given);
  n.add<int64_t>("--heads", o.heads, 1, kMaxInt, "attention heads (a divisor of --width)", &o.architecture_given);
  n.add<int64_t>("--seq", o.seq, 2, kMaxInt, "sequence length", &o.architecture_given);
  n.add<int64_t>("--batch", o.batch, 1, kMaxInt, "sequences per step");
  n.add<uint64_t>("--seed", o.seed, 0, std::numeric_limits<uint64_t>::max(), "seed for initialisation, batches and dropout");
  n.add_real("--dropout", o.dropout, "dropout probability, in [0, 1)");
  n.add<int>("--threads", o.threads, 0, kMaxThreads, "CPU threads (0: all cores)");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"remat: train differentiable tensor programs when memory is the limit (recomputation by default)"};
  app.require_subcommand(1);

  TrainOptions train;
  auto* t = app.add_subcommand("train", "train a character-level GPT on a text corpus (default: Debian's fortunes)");
  Numbers train_numbers(t);
  t->add_option("--data", train.data, "text file or folder of text files (default: /usr/share/games/fortunes)");
  add_model_options(train_numbers, train);
  train_numbers.add<int64_t>("--steps", train.steps, 1, kMaxSteps, "optimizer steps");
  train_numbers.add_real("--lr", train.lr, "peak learning rate, > 0 (warm-up then cosine decay)");
  train_numbers.add<int64_t>("--accumulate", train.accumulate, 1, kMaxAccumulate,
                             "micro-batches of --batch summed per step (and per rank under mpirun)");
  t->add_option("--reduce", train.reduce, "gradient sum over MPI ranks: ordered (rank order, exact) | native")
      ->capture_default_str();
  t->add_option("--policy", train.policy,
                "save-all | every-layer | every-k:K | selective:OPS | budget:BYTES")->capture_default_str();
  t->add_flag("--shard-optimizer", train.shard_optimizer,
              "under mpirun: each rank keeps and updates the AdamW state of 1/N of the parameters (ZeRO-1)");
  t->add_option("--save", train.save, "write the weights (safetensors) here");
  t->add_option("--load", train.load, "start from these weights (architecture from the file)");
  t->add_flag("--allow-nonfinite", train.allow_nonfinite,
              "keep training when the loss or the gradient norm is NaN or infinite (default: stop with an error)");
  t->add_flag("--json", train.json, "print one JSON object with the results as the last line");
  t->add_flag("--explain", train.explain,
              "print, per checkpoint region of one step, what it kept, what its re-run saved, its times and re-runs");
  bool quiet = false;
  t->add_flag("--quiet", quiet, "no progress output");

  SampleOptions sample;
  auto* s = app.add_subcommand("sample", "generate text from weights saved by `remat train --save`");
  Numbers sample_numbers(s);
  s->add_option("--load", sample.load, "weights file")->required();
  s->add_option("--prompt", sample.prompt, "text to continue");
  sample_numbers.add<int64_t>("--tokens", sample.tokens, 1, kMaxSampleTokens, "characters to generate");
  sample_numbers.add_real("--temperature", sample.temperature, "sampling temperature, > 0");
  sample_numbers.add<uint64_t>("--seed", sample.seed, 0, std::numeric_limits<uint64_t>::max(), "sampling seed");
  sample_numbers.add<int>("--threads", sample.threads, 0, kMaxThreads, "CPU threads (0: all cores)");

  PlanOptions plan;
  auto* p = app.add_subcommand("plan", "show the schedule a budget:BYTES policy runs, against uniform segments and every-layer");
  Numbers plan_numbers(p);
  p->add_option("--budget", plan.budget, "memory budget for saved bytes, e.g. 64MiB")->required();
  p->add_option("--costs", plan.costs, "JSON file of per-stage costs instead of profiling a model");
  p->add_option("--data", plan.train.data, "text file or folder (for the vocabulary)");
  add_model_options(plan_numbers, plan.train);
  p->add_flag("--json", plan.train.json, "print one JSON object");

  CLI11_PARSE(app, argc, argv);
  try {
    if (*t) {
      train_numbers.convert();
      train.progress = !quiet;
      return run_train(train);
    }
    if (*s) {
      sample_numbers.convert();
      return run_sample(sample);
    }
    if (*p) {
      plan_numbers.convert();
      return run_plan(plan);
    }
  } catch (const remat::Error& e) {
    std::fprintf(stderr, "remat: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "remat: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "remat: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
