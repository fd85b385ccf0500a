// `remat train`: a character-level GPT on a text corpus, checkpointed by the policy.
//
// train() is one run in four parts: the options checked and the corpus, model and weights loaded
// (check_options, load), the steps (StepLoop, which measures a RunMeasure), the side-by-side probe
// against save-all (finish_run), then the text report on stderr and the JSON line on stdout
// (print_report, emit_run_json: train_report.cpp). run_train wraps it for mpirun.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "corpus.h"
#include "data_parallel.h"
#include "device_option.h"
#include "footprint.h"
#include "progress.h"
#include "train_report.h"
#include "usage.h"
#include "remat/nn.h"
#include "remat/remat.h"
#include "weights.h"

namespace remat::tools {

namespace {

using Clock = std::chrono::steady_clock;

// "nan" and "inf" without the sign a NaN may carry.
std::string number_text(double v) {
  if (std::isnan(v)) return "nan";
  return detail::concat(v);
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull);

// FNV-1a over the bytes of one gradient.
uint64_t gradient_hash(const Tensor& g) {
  Tensor c = g.to(kCpu).contiguous();
  return fnv1a(c.raw_data(), c.nbytes());
}

// grad_digest: FNV-1a over the per-parameter hashes (gradient_hash; parameters without a
// gradient are skipped), in parameter order. Per parameter first, so that the optimizer inside
// the backward, which sees each gradient alone and in backward order, gives the same digest.
std::string combine_digest(const std::vector<std::optional<uint64_t>>& hashes) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& one : hashes)
    if (one) h = fnv1a(&*one, sizeof(uint64_t), h);
  char buffer[20];
  std::snprintf(buffer, sizeof buffer, "%016llx", static_cast<unsigned long long>(h));
  return buffer;
}

// The step whose gradients grad_digest hashes, the same under every policy: the first one that
// runs a budget policy's plan (after its profiling steps), or the last step of a shorter run.
int64_t digest_step(int64_t steps) { return std::min<int64_t>(BudgetPlanner::kProfilingSteps, steps - 1); }

std::string gradient_digest(const nn::Module& model) {
  std::vector<std::optional<uint64_t>> hashes;
  for (const auto& [name, p] : model.named_parameters()) {
    Tensor g = p.grad();
    hashes.push_back(g.defined() ? std::optional<uint64_t>(gradient_hash(g)) : std::nullopt);
  }
  return combine_digest(hashes);
}

uint64_t fnv1a(const void* data, size_t n, uint64_t h) {
  const unsigned char* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= bytes[i];
    h *= 1099511628211ull;
  }
  return h;
}

// Under mpirun: every rank must run the same training (options that change the result or the
// number of collectives), on the same text, with the same model: else an error on every rank.
void check_ranks_agree(const TrainOptions& o, const std::vector<int64_t>& tokens, const nn::GPT& model) {
  const std::string options = detail::concat("steps ", o.steps, " batch ", o.batch, " accumulate ", o.accumulate, " lr ",
                                             o.lr, " seed ", o.seed, " dropout ", o.dropout, " reduce ", o.reduce,
                                             " allow_nonfinite ", o.allow_nonfinite, " shard_optimizer ",
                                             o.shard_optimizer, " bucket_bytes ", o.bucket_bytes, " clip ", o.clip);
  distributed::check_same(fnv1a(options.data(), options.size()),
                          "set of training options (--steps, --batch, --accumulate, --lr, --seed, --dropout, --reduce, "
                          "--allow-nonfinite, --shard-optimizer, --bucket-bytes, --clip)");
  distributed::check_same(fnv1a(tokens.data(), tokens.size() * sizeof(int64_t)), "corpus (--data)");
  // names, shapes and dtypes, then rank 0's weights everywhere; with --load every rank must have
  // read the same weights (a different file on one rank is an error, not silently replaced)
  distributed::broadcast_parameters(model.named_parameters(), !o.load.empty());
}

constexpr int kValidationBatches = 8;

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

// One forward + backward under `policy` (no optimizer step), measured on the batch's device.
StepMeasure measure_step(nn::GPT& model, const Batch& batch, const Policy& policy, uint64_t dropout_seed) {
  const Device device = batch.inputs.device();
  model.zero_grad();
  manual_seed(dropout_seed);
  reset_peaks(device);
  reset_counters();
  const memory::Stats base = memory_stats(device);
  auto t0 = Clock::now();
  Tensor loss = backward([&] { return model.loss(batch.inputs, batch.targets); }, GradOptions{policy});
  StepMeasure m;
  m.loss = loss.detach().to(kCpu).item();  // waits for the device
  m.seconds = seconds_since(t0);
  const memory::Stats after = memory_stats(device);
  m.peak_saved = after.peak(memory::Tag::saved) - base.live(memory::Tag::saved);
  m.peak_total = after.peak_total - base.live_total;
  m.counters = counters();
  m.recomputed_flops = m.counters.ops.recomputed_flops;
  return m;
}

// ---- the options, checked before anything is read or built

struct CheckedOptions {
  Policy policy;
  size_t bucket_bytes = 0;  // --bucket-bytes in bytes
};

CheckedOptions check_options(const TrainOptions& o, const DataParallel& dp) {
  CheckedOptions checked;
  try {
    checked.policy = Policy::parse(o.policy);
  } catch (const Error& e) {
    throw UsageError(detail::concat("train --policy: ", e.what()));
  }
  REMAT_USAGE_CHECK(o.steps >= 1 && o.steps <= kMaxSteps, "train: --steps must be from 1 to ", kMaxSteps, ", got ", o.steps);
  REMAT_USAGE_CHECK(o.batch >= 1 && o.seq >= 2, "train: --batch must be >= 1 and --seq >= 2");
  REMAT_USAGE_CHECK(std::isfinite(o.lr) && o.lr > 0, "train: --lr must be a finite number > 0, got ", o.lr);
  REMAT_USAGE_CHECK(o.dropout >= 0 && o.dropout < 1, "train: --dropout must be in [0, 1), got ", o.dropout);
  REMAT_USAGE_CHECK(o.format == "remat" || o.format == "nanogpt" || o.format == "hf-gpt2",
                    "train: --format must be remat, nanogpt or hf-gpt2, got \"", o.format, "\"");
  check_save_path(o.save, o.format);
  REMAT_USAGE_CHECK(!o.eval_only || !o.load.empty(), "train: --eval-only needs --load FILE (the weights to evaluate)");
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

struct Loaded {
  Device device;  // --device: the model, the batches and the evaluation's
  std::string data_path;
  Corpus corpus;
  nn::GPTConfig config;
  CharTokenizer tokenizer;
  std::vector<int64_t> tokens;  // the corpus, encoded
  TokenSplit split;
  std::shared_ptr<nn::GPT> model;
};

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

Loaded load(const TrainOptions& o, Device device) {
  Loaded l;
  l.device = device;
  l.data_path = o.data.empty() ? kDefaultCorpus : o.data;
  l.corpus = load_corpus(l.data_path);
  l.config = nn::GPTConfig{.vocab = 0, .layers = o.layers, .width = o.width, .heads = o.heads, .seq = o.seq,
                           .dropout = o.dropout, .dtype = DType::f32, .seed = o.seed,
                           .tie_embeddings = o.tie_embeddings};
  std::optional<CharGPTFile> weights;
  std::string source;  // where the architecture comes from, for errors
  if (!o.load.empty()) {
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
  l.split = split_tokens(l.tokens);

  l.model = std::make_shared<nn::GPT>(l.config);
  if (weights) {
    l.model->load_parameters(weights->file.tensors, o.load);
    weights.reset();  // the model holds the values now
  }
  l.model->to(device);
  return l;
}

// --eval-only: the validation loss of the --load weights; nothing is trained.
int evaluate_only(const TrainOptions& o, Loaded& l) {
  const double val_loss = validation_loss(*l.model, l.split.validation, o.batch, l.config.seq, o.seed, l.device);
  if (o.progress)
    std::fprintf(stderr, "remat train --eval-only: %s on %s: validation loss %.4f (%d batches of %lld x %lld tokens)\n",
                 o.load.c_str(), l.data_path.c_str(), val_loss, kValidationBatches, static_cast<long long>(o.batch),
                 static_cast<long long>(l.config.seq));
  if (o.json) {
    nlohmann::json j = {{"version", REMAT_VERSION}, {"eval_only", true},          {"val_loss", val_loss},
                        {"batch", o.batch},         {"batches", kValidationBatches}, {"seq", l.config.seq},
                        {"vocab", l.config.vocab},  {"parameters", l.model->num_parameters()},
                        {"device", device_json(l.device)}};
    emit_json(j);
  }
  return 0;
}

// ---- the optimizer: every rank updates every parameter, or (--shard-optimizer) only those whose
// state it owns

TensorList updated_parameters(const TensorList& all_params, bool sharded, const std::vector<int>& owners, int rank) {
  TensorList updated;
  for (size_t i = 0; i < all_params.size(); ++i)
    if (!sharded || owners[i] == rank) updated.push_back(all_params[i]);
  return updated;
}

struct Optimization {
  TensorList all_params;
  bool sharded;
  std::vector<int> owners;  // with sharded: the rank that updates each of all_params
  nn::AdamW optimizer;
  nn::WarmupCosine lr_at;

  Optimization(const TrainOptions& o, const DataParallel& dp, nn::GPT& model)
      : all_params(model.parameters()),
        sharded(o.shard_optimizer && dp.world > 1),
        owners(sharded ? distributed::optimizer_owners(all_params, dp.world) : std::vector<int>{}),
        optimizer(updated_parameters(all_params, sharded, owners, dp.rank),
                  {.lr = o.lr, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.01}),
        lr_at{.max_lr = o.lr, .min_lr = o.lr * 0.1,
              .warmup_steps = std::min<int64_t>(100, std::max<int64_t>(1, o.steps / 10)), .total_steps = o.steps} {}
};

// The opening lines of the text report: the text, the global batch, the model.
void print_banner(const Human& say, const TrainOptions& o, const DataParallel& dp, const Loaded& l) {
  const nn::GPTConfig& config = l.config;
  say("remat train: %zu files, %s of text, vocabulary %lld, train %zu / validation %zu tokens\n",
              l.corpus.files.size(), memory::format_bytes(static_cast<double>(l.corpus.text.size())).c_str(),
              static_cast<long long>(config.vocab), l.split.train.size(), l.split.validation.size());
  if (dp.micro_batches() > 1)
    say("global batch %lld = %d ranks x %lld micro-batches x %lld sequences; gradients summed %s\n",
        static_cast<long long>(o.batch * dp.micro_batches()), dp.world, static_cast<long long>(o.accumulate),
        static_cast<long long>(o.batch), dp.world > 1 ? distributed::to_string(dp.reduction) : "in order");
  say("model: GPT layers=%lld width=%lld heads=%lld seq=%lld, %s parameters%s; batch %lld; policy %s; %d threads\n",
              static_cast<long long>(config.layers), static_cast<long long>(config.width),
              static_cast<long long>(config.heads), static_cast<long long>(config.seq),
              human_count(static_cast<double>(l.model->num_parameters())).c_str(),
              config.tie_embeddings ? " (lm_head tied to wte)" : "", static_cast<long long>(o.batch),
              o.policy.c_str(), num_threads());
  say("device: %s\n", device_summary(l.device).c_str());
}

// ---- the step loop

double tokens_per_step(const TrainOptions& o, const DataParallel& dp, const nn::GPTConfig& config) {
  return static_cast<double>(o.batch) * static_cast<double>(dp.micro_batches()) * static_cast<double>(config.seq);
}

class StepLoop {
 public:
  StepLoop(const TrainOptions& o, const DataParallel& dp, const Policy& policy, size_t bucket_bytes, Loaded& l,
           Optimization& opt);
  // Runs the --steps steps; the gradient buckets stay allocated while the loop lives.
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

StepLoop::StepLoop(const TrainOptions& o, const DataParallel& dp, const Policy& policy, size_t bucket_bytes, Loaded& l,
                   Optimization& opt)
    : o_(o),
      policy_(policy),
      l_(l),
      opt_(opt),
      progress_("train", o.steps, o.progress),
      eval_every_(o.eval_every > 0 ? o.eval_every : std::max<int64_t>(1, o.steps / 10)),
      tokens_per_step_(tokens_per_step(o, dp, l.config)),
      saved_base_(memory_stats(l.device).live(memory::Tag::saved)),
      total_base_(memory_stats(l.device).live_total),
      step_dp_(dp) {
  if (dp.world > 1 && bucket_bytes > 0) {
    buckets_.emplace(opt.all_params, bucket_bytes, dp.reduction);
    step_dp_.buckets = &*buckets_;
  }
}

RunMeasure StepLoop::run() {
  const auto run_start = Clock::now();
  for (int64_t step = 0; step < o_.steps; ++step) {
    l_.model->zero_grad();
    reset_peaks(l_.device);
    reset_counters();
    const auto t0 = Clock::now();
    const Gradients g = gradients(step);
    check_finite(step, g);
    update(step);
    account(step, t0, g.loss);
    evaluate(step, g.loss, run_start);
    show(step);
  }
  progress_.finish();
  m_.train_seconds = seconds_since(run_start);
  if (buckets_) {
    m_.bucketed = true;
    m_.buckets = buckets_->bucket_count();
    m_.bucket_buffer_bytes = buckets_->buffer_bytes();
  }
  return m_;
}

// --fuse-optimizer: AdamW inside the backward. Sums the squared gradient norm into grad_sq as the
// updates run and, at the digest's step, puts the digest's parts into hashes.
FusedUpdate StepLoop::fused_update(int64_t step, double& grad_sq, std::vector<std::optional<uint64_t>>& hashes) {
  nn::AdamW& optimizer = opt_.optimizer;
  optimizer.set_lr(opt_.lr_at(step));
  // one rank, so the optimizer holds every parameter, in the model's (the digest's) order
  hashes.assign(optimizer.params().size(), std::nullopt);
  return FusedUpdate{&optimizer, [this, step, &grad_sq, &hashes](const Tensor& p) {
                       Tensor g = p.grad().detach();
                       const double sq = sum(square(g)).to(kCpu).item();
                       // a non-finite gradient would turn this parameter into NaN: stop first
                       if (!o_.allow_nonfinite && !std::isfinite(sq))
                         throw Error(detail::concat(
                             "train: step ", step + 1, " of ", o_.steps, ": the gradient of \"", p.name(),
                             "\" is not finite (learning rate ", opt_.lr_at(step), "): training diverged and was "
                             "stopped before that parameter's update (--fuse-optimizer: the parameters "
                             "updated earlier in this step keep their update)",
                             o_.save.empty() ? "" : ", nothing was saved",
                             ". Lower --lr, or pass --allow-nonfinite to keep going"));
                       grad_sq += sq;
                       if (step == digest_step(o_.steps))
                         hashes[static_cast<size_t>(opt_.optimizer.index_of(p))] = gradient_hash(g);
                     }};
}

// Forward and backward of every micro-batch of the step (one, unless --accumulate or mpirun).
StepLoop::Gradients StepLoop::gradients(int64_t step) {
  std::optional<FusedUpdate> fused;
  double fused_grad_sq = 0;                           // --fuse-optimizer: the squared gradient norm
  std::vector<std::optional<uint64_t>> fused_hashes;  // and, at the digest's step, its parts
  if (o_.fuse_optimizer) fused.emplace(fused_update(step, fused_grad_sq, fused_hashes));
  const StepGradients sg = step_gradients(*l_.model, l_.split.train, o_.batch, l_.config.seq, o_.seed, policy_, step,
                                          step_dp_, fused ? &*fused : nullptr);
  m_.communication_seconds += sg.communication_seconds;
  m_.hidden_seconds += sg.hidden_seconds;
  if (step == digest_step(o_.steps))
    m_.digest = o_.fuse_optimizer ? combine_digest(fused_hashes) : gradient_digest(*l_.model);
  // the global gradient norm, clipped to --clip (infinity: measured, not clipped)
  const double grad_norm = o_.fuse_optimizer
                               ? std::sqrt(fused_grad_sq)
                               : nn::clip_grad_norm(l_.model->parameters(),
                                                    o_.clip > 0 ? o_.clip : std::numeric_limits<double>::infinity());
  return {sg.loss, grad_norm};
}

// A non-finite loss or gradient would turn every weight into NaN at this step: stop first.
void StepLoop::check_finite(int64_t step, const Gradients& g) {
  if (o_.allow_nonfinite || (std::isfinite(g.loss) && std::isfinite(g.grad_norm))) return;
  progress_.finish();
  throw Error(detail::concat("train: step ", step + 1, " of ", o_.steps, " has loss ", number_text(g.loss),
                             " and gradient norm ", number_text(g.grad_norm), " (learning rate ", opt_.lr_at(step),
                             "): training diverged and was stopped", o_.fuse_optimizer ? "" : " before the update",
                             o_.save.empty() ? "" : ", nothing was saved",
                             ". Lower --lr, or pass --allow-nonfinite to keep going"));
}

// The optimizer step (unless it ran inside the backward), and the state it allocated at the first.
void StepLoop::update(int64_t step) {
  nn::AdamW& optimizer = opt_.optimizer;
  if (!o_.fuse_optimizer) {
    optimizer.set_lr(opt_.lr_at(step));
    const size_t other_before = memory_stats(l_.device).live(memory::Tag::other);
    optimizer.step();
    const size_t other_after = memory_stats(l_.device).live(memory::Tag::other);
    if (step == 0) m_.optimizer_state_bytes = other_after - std::min(other_before, other_after);
  } else if (step == 0) {
    for (size_t i = 0; i < optimizer.params().size(); ++i)  // the moments the updates allocated
      if (optimizer.exp_avg(i).defined())
        m_.optimizer_state_bytes += optimizer.exp_avg(i).nbytes() + optimizer.exp_avg_sq(i).nbytes();
  }
  if (opt_.sharded) distributed::broadcast_from_owners(opt_.all_params, opt_.owners);  // the owners' updates to every rank
}

// The step's time, loss, peaks and counters, added to the run's.
void StepLoop::account(int64_t step, Clock::time_point t0, double loss_value) {
  m_.step_seconds.push_back(seconds_since(t0));
  if (step == BudgetPlanner::kProfilingSteps - 1) m_.profiling_step_seconds = m_.step_seconds.back();
  m_.losses.push_back(loss_value);
  const memory::Stats stats = memory_stats(l_.device);
  m_.peak_saved = std::max(m_.peak_saved, stats.peak(memory::Tag::saved) - saved_base_);
  m_.peak_total = std::max(m_.peak_total, stats.peak_total - total_base_);
  m_.recomputed_flops += counters().ops.recomputed_flops;
  const DynamicCounters d = counters().dynamic;
  DynamicCounters& dynamic = m_.dynamic;
  dynamic.evictions += d.evictions;
  dynamic.rematerializations += d.rematerializations;
  dynamic.remat_flops += d.remat_flops;
  dynamic.remat_seconds += d.remat_seconds;
  dynamic.smallest_feasible_bytes = std::max(dynamic.smallest_feasible_bytes, d.smallest_feasible_bytes);
  dynamic.offloaded += d.offloaded;
  dynamic.bytes_offloaded += d.bytes_offloaded;
  dynamic.bytes_prefetched += d.bytes_prefetched;
  dynamic.bytes_read_on_demand += d.bytes_read_on_demand;
  dynamic.bytes_mapped += d.bytes_mapped;
  dynamic.stall_seconds += d.stall_seconds;
}

// Validation: every --eval-every steps and at the end.
void StepLoop::evaluate(int64_t step, double loss_value, Clock::time_point run_start) {
  if ((step + 1) % eval_every_ != 0 && step + 1 != o_.steps) return;
  m_.last_val_loss = validation_loss(*l_.model, l_.split.validation, o_.batch, l_.config.seq, o_.seed, l_.device);
  progress_.note(detail::concat("step ", step + 1, "/", o_.steps, ": train loss ", number_text(loss_value),
                                ", validation loss ", number_text(m_.last_val_loss)));
  if (o_.json)
    emit_json({{"version", REMAT_VERSION}, {"event", "eval"}, {"step", step + 1}, {"train_loss", loss_value},
               {"val_loss", m_.last_val_loss}, {"seconds", seconds_since(run_start)}});
}

void StepLoop::show(int64_t step) {
  double tokens_per_s = tokens_per_step_ / m_.step_seconds.back();
  char loss[32], val[32] = "";
  std::snprintf(loss, sizeof loss, "loss %.3f", m_.losses.back());
  if (!std::isnan(m_.last_val_loss)) std::snprintf(val, sizeof val, "val %.3f", m_.last_val_loss);
  // kept in this order as the width shrinks: loss, (ETA), val, tok/s, peak
  progress_.update(step + 1, {{loss, 90}, {val, 70}, {human_count(tokens_per_s) + " tok/s", 60},
                              {"peak " + bytes_text(m_.peak_saved), 50}});
}

// ---- after the loop: the probe, the saved weights, the per-rank figures (RunSummary)

RunSummary finish_run(const TrainOptions& o, const DataParallel& dp, const CheckedOptions& checked, bool sharded, Loaded& l,
                      const RunMeasure& m) {
  const Policy& policy = checked.policy;
  RunSummary r;
  r.tail = std::min<size_t>(10, m.losses.size());
  for (size_t i = m.losses.size() - r.tail; i < m.losses.size(); ++i) r.final_loss += m.losses[i];
  r.final_loss /= static_cast<double>(r.tail);

  // Side by side, on one batch: the chosen policy and save-all.
  Batch probe = sample_batch(l.split.train, o.batch, l.config.seq, o.seed, static_cast<uint64_t>(o.steps), l.device);
  r.chosen = measure_step(*l.model, probe, policy, o.seed);
  r.save_all = measure_step(*l.model, probe, Policy::save_all(), o.seed);
  l.model->zero_grad();

  if (!o.save.empty() && dp.rank == 0) {
    save_char_gpt(o.save, *l.model, char_gpt_metadata(l.config, l.tokenizer), o.format);
  }
  r.rank_peak_saved = distributed::all_gather(static_cast<double>(m.peak_saved));
  r.rank_peak_total = distributed::all_gather(static_cast<double>(m.peak_total));
  r.rank_optimizer_bytes = distributed::all_gather(static_cast<double>(m.optimizer_state_bytes));

  r.step_median = median(m.step_seconds);
  r.tokens_per_second = tokens_per_step(o, dp, l.config) / r.step_median;
  if (policy.kind == Policy::Kind::budget) r.plan = l.model->planner()->report();
  if (r.plan) {
    // the plan predicts the chain of blocks; the rest of the step is taken from the profiling step
    double outside = std::max(0.0, m.profiling_step_seconds - r.plan->profiled_chain_seconds);
    r.predicted_step_seconds = r.plan->predicted_seconds + outside;
  }
  r.parameters = l.model->num_parameters();
  r.vocab = l.config.vocab;
  r.bucket_bytes = checked.bucket_bytes;
  r.sharded = sharded;
  r.device_text = device_summary(l.device);
  r.device = device_json(l.device);
  return r;
}

// ---- one run: load, loop, report, JSON

int train(const TrainOptions& o, const DataParallel& dp) {
  if (o.threads > 0) set_num_threads(o.threads);
  const CheckedOptions checked = check_options(o, dp);
  REMAT_USAGE_CHECK(o.device == "cpu" || dp.micro_batches() == 1, "train: --device ", o.device,
                    " runs one micro-batch per step in one process (--accumulate and mpirun add gradients on the host)");
  REMAT_USAGE_CHECK(o.device == "cpu" || checked.policy.kind != Policy::Kind::offload, "train: --policy ", o.policy,
                    " keeps saved values of host memory only; it does not run with --device ", o.device, " yet");
  Loaded l = load(o, select_device("train --device", o.device));
  if (o.progress) l.model->planner()->set_options({.progress = planning_progress("remat train: planning the budget")});
  if (o.eval_only) return evaluate_only(o, l);
  if (dp.world > 1) check_ranks_agree(o, l.tokens, *l.model);
  Optimization opt(o, dp, *l.model);

  const Human say{o.progress};
  print_banner(say, o, dp, l);
  StepLoop loop(o, dp, checked.policy, checked.bucket_bytes, l, opt);
  const RunMeasure m = loop.run();
  const RunSummary s = finish_run(o, dp, checked, opt.sharded, l, m);
  print_report(say, o, dp, checked.policy, m, s);
  if (o.json) emit_run_json(o, dp, checked.policy, m, s);
  return 0;
}

}  // namespace

int run_train(const TrainOptions& o) {
  DataParallel dp;
  dp.accumulate = o.accumulate;
  REMAT_CHECK(o.reduce == "ordered" || o.reduce == "native", "train --reduce: expected ordered or native, got \"",
              o.reduce, "\"");
  dp.reduction = distributed::parse_reduction(o.reduce);
  distributed::init();  // MPI, when started by mpirun
  dp.rank = distributed::rank();
  dp.world = distributed::world_size();
  if (dp.world == 1) {  // a plain run, or mpirun -np 1
    try {
      const int code = train(o, dp);
      distributed::finalize();
      return code;
    } catch (...) {
      distributed::finalize();
      throw;
    }
  }
  try {
    TrainOptions mine = o;
    if (dp.rank != 0) {
      // rank 0 prints progress and the report; errors still reach stderr from every rank
      mine.progress = false;
      REMAT_CHECK(std::freopen("/dev/null", "w", stdout) != nullptr, "train: cannot silence stdout on rank ", dp.rank);
    }
    const int code = train(mine, dp);
    std::fflush(stdout);
    distributed::finalize();
    return code;
  } catch (const std::exception& e) {
    // The other ranks may be waiting in a collective for this one: end them all.
    std::fprintf(stderr, "remat: error: rank %d of %d: %s\n", dp.rank, dp.world, e.what());
    std::fflush(stderr);
    std::fflush(stdout);
    distributed::abort(1);
    throw;
  }
}

}  // namespace remat::tools
