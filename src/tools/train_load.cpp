// `remat train`: the options checked, the corpus, model and weights loaded (train_load.h).
#include "train_load.h"

#include <cmath>
#include <cstdio>
#include <optional>

#include <nlohmann/json.hpp>

#include "device_option.h"
#include "footprint.h"
#include "train_report.h"
#include "train_state.h"
#include "usage.h"
#include "weights.h"

namespace remat::tools::training {

namespace {

// Architecture flags passed with --load must agree with the file (the architecture comes from it).
void check_architecture_flags(const TrainOptions& o, const nn::GPTConfig& file) {
  std::string disagree, values;
  auto check = [&](bool given, const char* flag, int64_t value, int64_t in_file) {
    if (!given || value == in_file) return;
    disagree += detail::concat(disagree.empty() ? "" : ", ", flag, " ", value);
    values += detail::concat(values.empty() ? "" : ", ", flag + 2, " ", in_file);
  };
  check(o.layers_given, "--layers", o.layers, file.layers);
  check(o.width_given, "--width", o.width, file.width);
  check(o.heads_given, "--heads", o.heads, file.heads);
  check(o.seq_given, "--seq", o.seq, file.seq);
  REMAT_USAGE_CHECK(disagree.empty(), "train: ", disagree, " disagree", disagree.find(',') == std::string::npos ? "s" : "",
                    " with the model of ", o.load, " (", values, "); the architecture comes from the weight file: "
                    "drop the flag or pass the file's value");
}

}  // namespace

double validation_loss(nn::GPT& model, const std::vector<int64_t>& tokens, int64_t batch, int64_t seq, uint64_t seed,
                       Device device) {
  NoGradGuard no_grad;
  model.eval();
  double total = 0;
  const int batches = kValidationBatches;
  for (int i = 0; i < batches; ++i) {
    Batch b = sample_batch(tokens, batch, seq, seed ^ 0x5a5a5a5aull, static_cast<uint64_t>(i), device);
    total += model.loss(b.inputs, b.targets).to(kCpu).item();
  }
  model.train();
  return total / batches;
}

// ---- the options, checked before anything is read or built

CheckedOptions check_options(const TrainOptions& o, const DataParallel& dp) {
  CheckedOptions checked;
  try {
    checked.policy = Policy::parse(o.policy);
  } catch (const Error& e) {
    throw UsageError(detail::concat("train --policy: ", e.what()));
  }
  if (!o.memory_limit.empty()) {
    REMAT_USAGE_CHECK(checked.policy.keep.budget_auto, "train: --memory-limit caps the memory of --policy budget:auto, "
                      "and the policy is ", o.policy, "; pass --policy budget:auto (a fixed budget: budget:BYTES)");
    REMAT_USAGE_CHECK(checked.policy.keep.memory_limit_bytes == 0, "train: --memory-limit ", o.memory_limit,
                      " and the policy's limit= (", o.policy, ") both cap the memory; give one of them");
    checked.policy.keep.memory_limit_bytes = parse_bytes_option("train --memory-limit", o.memory_limit);
    REMAT_USAGE_CHECK(checked.policy.keep.memory_limit_bytes > 0, "train: --memory-limit must be positive, got ", o.memory_limit);
  }
  REMAT_USAGE_CHECK(o.steps >= 1 && o.steps <= kMaxSteps, "train: --steps must be from 1 to ", kMaxSteps, ", got ", o.steps);
  REMAT_USAGE_CHECK(o.batch >= 1 && o.seq >= 2, "train: --batch must be >= 1 and --seq >= 2");
  REMAT_USAGE_CHECK(std::isfinite(o.lr) && o.lr > 0, "train: --lr must be a finite number > 0, got ", o.lr);
  REMAT_USAGE_CHECK(o.dropout >= 0 && o.dropout < 1, "train: --dropout must be in [0, 1), got ", o.dropout);
  REMAT_USAGE_CHECK(o.format == "remat" || o.format == "nanogpt" || o.format == "hf-gpt2",
                    "train: --format must be remat, nanogpt or hf-gpt2, got \"", o.format, "\"");
  check_save_path(o.save, o.format);
  REMAT_USAGE_CHECK(!o.eval_only || !o.load.empty(), "train: --eval-only needs --load FILE (the weights to evaluate)");
  REMAT_USAGE_CHECK(!o.eval_only || o.state_dir.empty(), "train: --eval-only trains nothing, so --state-dir has no "
                    "state to keep; drop it");
  REMAT_USAGE_CHECK(o.given.count("--state-every") == 0 || !o.state_dir.empty(), "train: --state-every ", o.state_every,
                    " says how often to write the training state, but there is no --state-dir to write it to");
  REMAT_USAGE_CHECK(o.accumulate >= 1 && o.accumulate <= kMaxAccumulate, "train: --accumulate must be from 1 to ",
                    kMaxAccumulate, ", got ", o.accumulate);
  REMAT_USAGE_CHECK(o.steps <= kMaxMicroBatches / dp.micro_batches(), "train: --steps ", o.steps, " x --accumulate ",
                    o.accumulate, " x ", dp.world, " ranks is more than ", kMaxMicroBatches, " micro-batches");
  REMAT_USAGE_CHECK(std::isfinite(o.clip) && o.clip >= 0, "train: --clip must be a finite number >= 0, got ", o.clip);
  REMAT_USAGE_CHECK(!o.fuse_optimizer || o.clip == 0,
                    "train: --fuse-optimizer updates each parameter as soon as its gradient is final, but clipping by the "
                    "global gradient norm (--clip ", o.clip, ") needs every gradient before the first update; pass --clip 0 "
                    "to train without clipping");
  REMAT_USAGE_CHECK(!o.fuse_optimizer || dp.world == 1,
                    "train: --fuse-optimizer runs in one process (under mpirun the optimizer needs the gradients summed "
                    "over the ranks first)");
  checked.bucket_bytes = parse_bytes_option("train --bucket-bytes", o.bucket_bytes);
  REMAT_USAGE_CHECK(checked.bucket_bytes <= (size_t{1} << 30), "train: --bucket-bytes must be at most 1GiB, got ",
                    o.bucket_bytes);
  REMAT_USAGE_CHECK(!o.load.empty() || o.width % o.heads == 0, "train: --width ", o.width, " is not a multiple of --heads ",
                    o.heads);
  return checked;
}

// ---- loading: the corpus, the model's architecture (from --load or the flags), its weights

namespace {

// With --load: the architecture and the vocabulary from the file. Returns where the architecture
// comes from, for errors.
std::string configure_from_file(const TrainOptions& o, const CharGPTFile& weights, Loaded& l) {
  REMAT_CHECK(weights.config.seq >= 2, "train: ", o.load, " has seq ", weights.config.seq,
              weights.has_metadata ? " in its metadata" : " (rows of wpe)", "; training needs sequences of at least 2 tokens");
  // a file without remat's metadata (a nanoGPT state_dict): the characters of --data
  l.tokenizer = weights.has_metadata ? weights.tokenizer
                                     : vocabulary_from_text(weights, o.load, l.corpus.text, l.data_path, "train");
  l.config.layers = weights.config.layers;
  l.config.width = weights.config.width;
  l.config.heads = weights.config.heads;
  l.config.seq = weights.config.seq;
  l.config.tanh_gelu = weights.config.tanh_gelu;
  REMAT_USAGE_CHECK(!o.tie_embeddings || weights.config.tie_embeddings, "train: --tie-embeddings disagrees with the "
                    "model of ", o.load, ", whose lm_head.weight is a tensor of its own; drop the flag");
  l.config.tie_embeddings = weights.config.tie_embeddings;
  check_architecture_flags(o, weights.config);
  return detail::concat("train: the model of ", o.load, " (layers ", l.config.layers, ", width ", l.config.width,
                        ", heads ", l.config.heads, ", seq ", l.config.seq, ") with --batch ", o.batch);
}

}  // namespace

DType save_dtype(const TrainOptions& o) { return o.save_dtype == "bf16" ? DType::bf16 : DType::f32; }

Loaded load(const TrainOptions& o, Device device) {
  Loaded l;
  l.device = device;
  l.data_path = o.data.empty() ? kDefaultCorpus : o.data;
  l.corpus = load_corpus(l.data_path);
  l.config = nn::GPTConfig{.vocab = 0, .layers = o.layers, .width = o.width, .heads = o.heads, .seq = o.seq,
                           .dropout = o.dropout, .dtype = DType::f32, .seed = o.seed,
                           .tie_embeddings = o.tie_embeddings};
  REMAT_USAGE_CHECK(o.dtype == "f32" || o.dtype == "bf16" || o.dtype == "f16", "train: --dtype must be f32, bf16 or f16, "
                    "got '", o.dtype, "'");
  REMAT_USAGE_CHECK(o.save_dtype == "f32" || o.save_dtype == "bf16", "train: --save-dtype must be f32 or bf16, got '",
                    o.save_dtype, "'");
  if (o.dtype == "bf16") l.config.compute_dtype = DType::bf16;
  if (o.dtype == "f16") l.config.compute_dtype = DType::f16;
  std::optional<CharGPTFile> weights;
  std::string source;  // where the architecture comes from, for errors
  if (!o.resume_state.empty()) {  // the architecture and the vocabulary of the state (train_state.h)
    check_resumed_corpus(o, l.corpus, l.data_path);
    l.tokenizer = CharTokenizer::from_string(o.vocabulary, "the vocabulary of the state " + o.resume_state);
    l.config.tanh_gelu = o.tanh_gelu;
    source = detail::concat("train --resume ", o.resume_state, " (layers ", o.layers, ", width ", o.width, ", heads ",
                            o.heads, ", seq ", o.seq, ", batch ", o.batch, ")");
  } else if (!o.load.empty()) {
    weights = read_char_gpt(o.load, "train", o.heads);
    source = configure_from_file(o, *weights, l);
  } else {
    l.tokenizer = CharTokenizer::from_text(l.corpus.text);
    source = detail::concat("train --layers ", o.layers, " --width ", o.width, " --heads ", o.heads, " --seq ", o.seq,
                            " --batch ", o.batch);
  }
  l.config.vocab = l.tokenizer.vocab_size();
  check_footprint(l.config, o.batch, Use::train, source);  // before anything of that size is built
  l.tokens = l.tokenizer.encode(l.corpus.text);
  l.split = split_tokens(l.tokens, l.corpus.file_ends);

  l.model = std::make_shared<nn::GPT>(l.config);
  if (weights) {
    l.model->load_parameters(weights->file.tensors, o.load);
    weights.reset();  // the model holds the values now
  }
  l.model->to(device);
  return l;
}

// --eval-only: the validation loss of the --load weights, written to --save in --format when
// given (a conversion); nothing is trained.
int evaluate_only(const TrainOptions& o, Loaded& l) {
  const double val_loss = validation_loss(*l.model, l.split.validation, o.batch, l.config.seq, o.seed, l.device);
  if (o.progress)
    std::fprintf(stderr, "remat train --eval-only: %s on %s: validation loss %.4f (%d batches of %lld x %lld tokens)\n",
                 o.load.c_str(), l.data_path.c_str(), val_loss, kValidationBatches, static_cast<long long>(o.batch),
                 static_cast<long long>(l.config.seq));
  if (!o.save.empty()) {
    save_char_gpt(o.save, *l.model, char_gpt_metadata(l.config, l.tokenizer), o.format, save_dtype(o));
    if (o.progress)
      std::fprintf(stderr, "remat train --eval-only: the weights of %s written to %s (--format %s)\n", o.load.c_str(),
                   o.save.c_str(), o.format.c_str());
  }
  if (o.json) {
    nlohmann::json j = {{"version", REMAT_VERSION}, {"eval_only", true},          {"val_loss", val_loss},
                        {"batch", o.batch},         {"batches", kValidationBatches}, {"seq", l.config.seq},
                        {"vocab", l.config.vocab},  {"parameters", l.model->num_parameters()},
                        {"saved", o.save.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.save)},
                        {"format", o.format},
                        {"device", device_json(l.device)}};
    emit_json(j);
  }
  return 0;
}

}  // namespace remat::tools::training
