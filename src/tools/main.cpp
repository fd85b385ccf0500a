// The `remat` command line.
//   remat train [--data PATH] [--device cpu|cuda[:N]] [--layers N] ... [--policy P] [--json]
//   remat sample --load FILE [--device D] [--prompt TEXT] [--tokens N]
//   remat plan --budget BYTES [model options | --costs FILE] [--json]
//   remat --version
// Numeric options are read as text and parsed strictly (numbers.h) with a range each. Exit codes:
// 0 success, 2 a usage error (unknown option or subcommand, with the closest valid one suggested;
// a value that does not parse or is out of range; options that cannot be combined), 1 an error
// while running (a weight file, the corpus, divergence, a --device this build or machine cannot
// use). Errors print "remat: error: ..." on
// stderr; with --json, also a JSON object {"error": ..., "exit_code": ...} on stdout.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "device_option.h"
#include "numbers.h"
#include "remat/error.h"
#include "usage.h"

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

  // Parses the values; a bad one is a usage error.
  void convert() const {
    try {
      for (const auto& c : converters_) c();
    } catch (const UsageError&) {
      throw;
    } catch (const remat::Error& e) {
      throw UsageError(e.what());
    }
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
  n.add<int64_t>("--layers", o.layers, 0, kMaxInt, "transformer blocks", &o.layers_given);
  n.add<int64_t>("--width", o.width, 1, kMaxInt, "embedding width", &o.width_given);
  n.add<int64_t>("--heads", o.heads, 1, kMaxInt, "attention heads (a divisor of --width)", &o.heads_given);
  n.add<int64_t>("--seq", o.seq, 2, kMaxInt, "sequence length", &o.seq_given);
  n.add<int64_t>("--batch", o.batch, 1, kMaxInt, "sequences per step");
  n.add<uint64_t>("--seed", o.seed, 0, std::numeric_limits<uint64_t>::max(), "seed for initialisation, batches and dropout");
  n.add_real("--dropout", o.dropout, "dropout probability, in [0, 1)");
  n.add<int>("--threads", o.threads, 0, kMaxThreads, "CPU threads (0: all cores)");
}

void note_architecture(TrainOptions& o) {
  o.architecture_given = o.layers_given || o.width_given || o.heads_given || o.seq_given;
}

// The long option names of `app` (and of the top level's --help, --version).
std::vector<std::string> option_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* option : app.get_options())
    for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
  return names;
}

// " (did you mean ...?)" for the first unknown subcommand or option of argv, or "".
std::string suggestion(const CLI::App& app, int argc, char** argv) {
  if (argc < 2) return "";
  std::vector<std::string> subcommands;
  for (const CLI::App* sub : app.get_subcommands({}))
    if (!sub->get_name().empty()) subcommands.push_back(sub->get_name());
  const std::string first = argv[1];
  const CLI::App* sub = nullptr;
  for (const CLI::App* candidate : app.get_subcommands({}))
    if (candidate->get_name() == first) sub = candidate;
  if (sub == nullptr) {
    if (first.rfind("-", 0) == 0) return "";
    std::string match = closest_match(first, subcommands);
    return match.empty() ? "" : " (did you mean `remat " + match + "`?)";
  }
  const std::vector<std::string> known = option_names(*sub);
  for (int i = 2; i < argc; ++i) {
    std::string word = argv[i];
    if (word.rfind("--", 0) != 0 || word.size() == 2) continue;
    word = word.substr(0, word.find('='));
    if (std::find(known.begin(), known.end(), word) != known.end()) continue;
    std::string match = closest_match(word, known);
    if (!match.empty()) return " (did you mean " + match + "?)";
    return "";
  }
  return "";
}

bool wants_json(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--json") == 0) return true;
  return false;
}

// Prints the error (and, with --json, a JSON object on stdout); returns the exit code.
int report_error(const std::string& message, int code, bool json) {
  std::fprintf(stderr, "remat: error: %s\n", message.c_str());
  if (json) {
    nlohmann::json j = {{"error", message}, {"exit_code", code}, {"version", REMAT_VERSION}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    std::fflush(stdout);
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"remat: train differentiable tensor programs when memory is the limit (recomputation by default)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::function<std::string()>(version_text),
                       "print the version, the backends compiled in and the devices found");

  TrainOptions train;
  auto* t = app.add_subcommand("train", "train a character-level GPT on a text corpus (default: Debian's fortunes)");
  Numbers train_numbers(t);
  t->add_option("--data", train.data, "text file or folder of text files (default: /usr/share/games/fortunes)");
  t->add_option("--device", train.device, "where the model, batches and evaluation run: cpu | cuda | cuda:N")
      ->capture_default_str();
  add_model_options(train_numbers, train);
  train_numbers.add<int64_t>("--steps", train.steps, 1, kMaxSteps, "optimizer steps");
  train_numbers.add<int64_t>("--eval-every", train.eval_every, 0, kMaxSteps,
                             "validation loss every N steps, and after the last (0: about 10 times a run)");
  train_numbers.add_real("--lr", train.lr, "peak learning rate, > 0 (warm-up then cosine decay)");
  train_numbers.add<int64_t>("--accumulate", train.accumulate, 1, kMaxAccumulate,
                             "micro-batches of --batch summed per step (and per rank under mpirun)");
  t->add_option("--reduce", train.reduce, "gradient sum over MPI ranks: ordered (rank order, exact) | native")
      ->capture_default_str();
  t->add_option("--policy", train.policy,
                "save-all | every-layer | every-k:K | selective:OPS | budget:BYTES | dynamic:BYTES | "
                "offload:DIR[,threshold=BYTES][,ram=BYTES]")->capture_default_str();
  t->add_flag("--shard-optimizer", train.shard_optimizer,
              "under mpirun: each rank keeps and updates the AdamW state of 1/N of the parameters (ZeRO-1)");
  t->add_option("--bucket-bytes", train.bucket_bytes,
                "under mpirun: gradients are all-reduced in buckets of this size while the backward runs "
                "(0: all at once after it)")->capture_default_str();
  train_numbers.add_real("--clip", train.clip, "clip the global gradient norm to this, >= 0 (0: no clipping)");
  t->add_flag("--fuse-optimizer", train.fuse_optimizer,
              "update each parameter as soon as its gradient is final, inside the backward, and free the gradient "
              "(needs --clip 0; one process)");
  t->add_option("--save", train.save, "write the weights here (a safetensors file; for --format hf-gpt2 a directory)");
  t->add_option("--load", train.load, "start from these weights (architecture from the file; remat, nanoGPT or Hugging Face GPT-2 "
                "layout; a file without remat metadata takes --heads and the vocabulary of --data)");
  t->add_option("--format", train.format, "names and layout of --save: remat | nanogpt | hf-gpt2 (a directory Transformers loads)")->capture_default_str();
  t->add_flag("--tie-embeddings", train.tie_embeddings,
              "the output layer shares the token embedding's weight (one parameter, as in nanoGPT and GPT-2; "
              "with --load the file decides: tied when it has no lm_head.weight)");
  t->add_flag("--allow-nonfinite", train.allow_nonfinite,
              "keep training when the loss or the gradient norm is NaN or infinite (default: stop with an error)");
  t->add_flag("--json", train.json,
              "JSON lines on stdout: one per validation, then the results (human output stays on stderr)");
  t->add_flag("--eval-only", train.eval_only,
              "with --load: print the validation loss of the weights on --data, and train nothing");
  t->add_flag("--explain", train.explain,
              "print, per checkpoint region of one step, what it kept, what its re-run saved, its times and re-runs");
  bool quiet = false;
  t->add_flag("--quiet", quiet, "print nothing but errors (and the JSON lines with --json)");

  SampleOptions sample;
  auto* s = app.add_subcommand("sample", "generate text from weights saved by `remat train --save`");
  Numbers sample_numbers(s);
  s->add_option("--load", sample.load, "weights file")->required();
  s->add_option("--prompt", sample.prompt, "text to continue");
  s->add_option("--device", sample.device, "where the model runs: cpu | cuda | cuda:N")->capture_default_str();
  s->add_option("--data", sample.data,
                "for weights without remat metadata (e.g. nanoGPT's): the text whose bytes are the vocabulary "
                "(default: /usr/share/games/fortunes)");
  sample_numbers.add<int64_t>("--heads", sample.heads, 1, kMaxInt,
                              "for weights without remat metadata: their attention heads (no shape gives them; default 4)",
                              &sample.heads_given);
  sample_numbers.add<int64_t>("--tokens", sample.tokens, 1, kMaxSampleTokens, "characters to generate");
  sample_numbers.add_real("--temperature", sample.temperature, "sampling temperature, >= 0 (0: greedy)");
  sample_numbers.add<int64_t>("--top-k", sample.top_k, 0, kMaxInt, "sample among the K most likely characters (0: all)");
  sample_numbers.add_real("--top-p", sample.top_p, "sample among the most likely characters whose probability reaches P, in (0, 1]");
  s->add_flag("--raw", sample.raw, "write the generated bytes as they are (default: bytes that are not UTF-8 are shown as \\xNN)");
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

  const bool json = wants_json(argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::string where = app.get_subcommands().empty() ? "remat" : "remat " + app.get_subcommands()[0]->get_name();
    return report_error(std::string(e.what()) + suggestion(app, argc, argv) + "; see `" + where + " --help`",
                        kExitUsageError, json);
  }
  try {
    if (*t) {
      train_numbers.convert();
      note_architecture(train);
      train.progress = !quiet;
      return run_train(train);
    }
    if (*s) {
      sample_numbers.convert();
      return run_sample(sample);
    }
    if (*p) {
      plan_numbers.convert();
      note_architecture(plan.train);
      return run_plan(plan);
    }
  } catch (const remat::tools::UsageError& e) {
    return report_error(e.what(), kExitUsageError, json);
  } catch (const remat::Error& e) {
    return report_error(e.what(), kExitRuntimeError, json);
  } catch (const std::bad_alloc&) {
    return report_error("out of memory", kExitRuntimeError, json);
  } catch (const std::exception& e) {
    return report_error(e.what(), kExitRuntimeError, json);
  }
  return 0;
}
