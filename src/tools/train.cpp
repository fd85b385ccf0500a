// `remat train`: a character-level GPT on a text corpus, checkpointed by the policy.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "corpus.h"
#include "data_parallel.h"
#include "footprint.h"
#include "progress.h"
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
  Tensor c = g.contiguous();
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
void emit_json(const nlohmann::json& j) {
  std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  std::fflush(stdout);
}

std::string bytes_text(size_t bytes) { return memory::format_bytes(static_cast<double>(bytes)); }

double validation_loss(nn::GPT& model, const std::vector<int64_t>& tokens, int64_t batch, int64_t seq, uint64_t seed) {
  NoGradGuard no_grad;
  model.eval();
  double total = 0;
  const int batches = kValidationBatches;
  for (int i = 0; i < batches; ++i) {
    Batch b = sample_batch(tokens, batch, seq, seed ^ 0x5a5a5a5aull, static_cast<uint64_t>(i));
    total += model.loss(b.inputs, b.targets).item();
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

struct StepMeasure {
  double seconds = 0, loss = 0;
  size_t peak_saved = 0, peak_total = 0;
  double recomputed_flops = 0;
  Counters counters;  // regions of this step
};

nlohmann::json regions_json(const Counters& c) {
  nlohmann::json regions = nlohmann::json::array();
  for (const auto& r : c.regions)
    regions.push_back({{"label", r.label},
                       {"kind", r.kind},
                       {"calls", r.calls},
                       {"boundary_bytes", r.boundary_bytes},
                       {"cached_bytes", r.cached_bytes},
                       {"recomputed_saved_bytes", r.recomputed_saved_bytes},
                       {"forward_seconds", r.forward_seconds},
                       {"recompute_seconds", r.recompute_seconds},
                       {"backward_seconds", r.backward_seconds},
                       {"recomputations", r.recomputations}});
  return regions;
}

// One forward + backward under `policy` (no optimizer step), measured.
StepMeasure measure_step(nn::GPT& model, const Batch& batch, const Policy& policy, uint64_t dropout_seed) {
  model.zero_grad();
  manual_seed(dropout_seed);
  memory::reset_peaks();
  reset_counters();
  size_t saved_base = memory::live_bytes(memory::Tag::saved);
  size_t total_base = memory::stats().live_total;
  auto t0 = Clock::now();
  Tensor loss = backward([&] { return model.loss(batch.inputs, batch.targets); }, GradOptions{policy});
  StepMeasure m;
  m.seconds = seconds_since(t0);
  m.loss = loss.item();
  m.peak_saved = memory::peak_bytes(memory::Tag::saved) - saved_base;
  m.peak_total = memory::stats().peak_total - total_base;
  m.counters = counters();
  m.recomputed_flops = m.counters.ops.recomputed_flops;
  return m;
}

}  // namespace

namespace {

int train(const TrainOptions& o, const DataParallel& dp) {
  if (o.threads > 0) set_num_threads(o.threads);
  Policy policy;
  try {
    policy = Policy::parse(o.policy);
  } catch (const Error& e) {
    throw UsageError(detail::concat("train --policy: ", e.what()));
  }
  REMAT_USAGE_CHECK(o.steps >= 1 && o.steps <= kMaxSteps, "train: --steps must be from 1 to ", kMaxSteps, ", got ", o.steps);
  REMAT_USAGE_CHECK(o.batch >= 1 && o.seq >= 2, "train: --batch must be >= 1 and --seq >= 2");
  REMAT_USAGE_CHECK(std::isfinite(o.lr) && o.lr > 0, "train: --lr must be a finite number > 0, got ", o.lr);
  REMAT_USAGE_CHECK(o.dropout >= 0 && o.dropout < 1, "train: --dropout must be in [0, 1), got ", o.dropout);
  REMAT_USAGE_CHECK(o.format == "remat" || o.format == "nanogpt" || o.format == "hf-gpt2",
                    "train: --format must be remat, nanogpt or hf-gpt2, got \"", o.format, "\"");
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
  const size_t bucket_bytes = parse_bytes_option("train --bucket-bytes", o.bucket_bytes);
  REMAT_USAGE_CHECK(bucket_bytes <= (size_t{1} << 30), "train: --bucket-bytes must be at most 1GiB, got ", o.bucket_bytes);
  REMAT_USAGE_CHECK(!o.load.empty() || o.width % o.heads == 0, "train: --width ", o.width, " is not a multiple of --heads ",
                    o.heads);

  const std::string data_path = o.data.empty() ? kDefaultCorpus : o.data;
  Corpus corpus = load_corpus(data_path);
  nn::GPTConfig config{.vocab = 0, .layers = o.layers, .width = o.width, .heads = o.heads, .seq = o.seq,
                       .dropout = o.dropout, .dtype = DType::f32, .seed = o.seed,
                       .tie_embeddings = o.tie_embeddings};
  CharTokenizer tokenizer;
  std::optional<CharGPTFile> weights;
  std::string source;  // where the architecture comes from, for errors
  if (!o.load.empty()) {
    weights = read_char_gpt(o.load, "train", o.heads);
    REMAT_CHECK(weights->config.seq >= 2, "train: ", o.load, " has seq ", weights->config.seq,
                weights->has_metadata ? " in its metadata" : " (rows of wpe)", "; training needs sequences of at least 2 tokens");
    // a file without remat's metadata (a nanoGPT state_dict): the characters of --data
    tokenizer = weights->has_metadata ? weights->tokenizer
                                      : vocabulary_from_text(*weights, o.load, corpus.text, data_path, "train");
    config.layers = weights->config.layers;
    config.width = weights->config.width;
    config.heads = weights->config.heads;
    config.seq = weights->config.seq;
    config.tanh_gelu = weights->config.tanh_gelu;
    REMAT_USAGE_CHECK(!o.tie_embeddings || weights->config.tie_embeddings, "train: --tie-embeddings disagrees with the "
                      "model of ", o.load, ", whose lm_head.weight is a tensor of its own; drop the flag");
    config.tie_embeddings = weights->config.tie_embeddings;
    check_architecture_flags(o, weights->config);
    source = detail::concat("train: the model of ", o.load, " (layers ", config.layers, ", width ", config.width,
                            ", heads ", config.heads, ", seq ", config.seq, ") with --batch ", o.batch);
  } else {
    tokenizer = CharTokenizer::from_text(corpus.text);
    source = detail::concat("train --layers ", o.layers, " --width ", o.width, " --heads ", o.heads, " --seq ", o.seq,
                            " --batch ", o.batch);
  }
  config.vocab = tokenizer.vocab_size();
  check_footprint(config, o.batch, Use::train, source);  // before anything of that size is built
  std::vector<int64_t> tokens = tokenizer.encode(corpus.text);
  TokenSplit split = split_tokens(tokens);

  auto model = std::make_shared<nn::GPT>(config);
  if (weights) {
    model->load_parameters(weights->file.tensors, o.load);
    weights.reset();  // the model holds the values now
  }
  if (o.eval_only) {
    const double val_loss = validation_loss(*model, split.validation, o.batch, config.seq, o.seed);
    if (o.progress)
      std::fprintf(stderr, "remat train --eval-only: %s on %s: validation loss %.4f (%d batches of %lld x %lld tokens)\n",
                   o.load.c_str(), data_path.c_str(), val_loss, kValidationBatches, static_cast<long long>(o.batch),
                   static_cast<long long>(config.seq));
    if (o.json) {
      nlohmann::json j = {{"version", REMAT_VERSION}, {"eval_only", true},          {"val_loss", val_loss},
                          {"batch", o.batch},         {"batches", kValidationBatches}, {"seq", config.seq},
                          {"vocab", config.vocab},    {"parameters", model->num_parameters()}};
      emit_json(j);
    }
    return 0;
  }
  if (dp.world > 1) check_ranks_agree(o, tokens, *model);
  // every rank updates every parameter, or (--shard-optimizer) only those whose state it owns
  const TensorList all_params = model->parameters();
  const bool sharded = o.shard_optimizer && dp.world > 1;
  const std::vector<int> owners = sharded ? optimizer_owners(all_params, dp.world) : std::vector<int>{};
  TensorList updated;
  for (size_t i = 0; i < all_params.size(); ++i)
    if (!sharded || owners[i] == dp.rank) updated.push_back(all_params[i]);
  size_t optimizer_state_bytes = 0;  // allocated by the first step (AdamW's moments)
  nn::AdamW optimizer(updated, {.lr = o.lr, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.01});

  const int64_t warmup = std::min<int64_t>(100, std::max<int64_t>(1, o.steps / 10));
  const nn::WarmupCosine lr_at{.max_lr = o.lr, .min_lr = o.lr * 0.1, .warmup_steps = warmup, .total_steps = o.steps};

  const Human say{o.progress};
  say("remat train: %zu files, %s of text, vocabulary %lld, train %zu / validation %zu tokens\n",
              corpus.files.size(), memory::format_bytes(static_cast<double>(corpus.text.size())).c_str(),
              static_cast<long long>(config.vocab), split.train.size(), split.validation.size());
  if (dp.micro_batches() > 1)
    say("global batch %lld = %d ranks x %lld micro-batches x %lld sequences; gradients summed %s\n",
        static_cast<long long>(o.batch * dp.micro_batches()), dp.world, static_cast<long long>(o.accumulate),
        static_cast<long long>(o.batch), dp.world > 1 ? distributed::to_string(dp.reduction) : "in order");
  say("model: GPT layers=%lld width=%lld heads=%lld seq=%lld, %s parameters%s; batch %lld; policy %s; %d threads\n",
              static_cast<long long>(config.layers), static_cast<long long>(config.width),
              static_cast<long long>(config.heads), static_cast<long long>(config.seq),
              human_count(static_cast<double>(model->num_parameters())).c_str(),
              config.tie_embeddings ? " (lm_head tied to wte)" : "", static_cast<long long>(o.batch),
              o.policy.c_str(), num_threads());

  Progress progress("train", o.steps, o.progress);
  const int64_t eval_every = o.eval_every > 0 ? o.eval_every : std::max<int64_t>(1, o.steps / 10);
  double last_val_loss = std::nan("");
  std::vector<double> step_seconds, losses;
  double profiling_step_seconds = 0;  // budget policy: the first step profiles the chain
  size_t peak_saved = 0, peak_total = 0;
  double recomputed_flops = 0;
  DynamicCounters dynamic;  // dynamic: and offload: policies, summed over the run
  std::string digest;
  double communication_seconds = 0, hidden_seconds = 0;
  const double tokens_per_step =
      static_cast<double>(o.batch) * static_cast<double>(dp.micro_batches()) * static_cast<double>(config.seq);
  const size_t saved_base = memory::live_bytes(memory::Tag::saved);
  const size_t total_base = memory::stats().live_total;
  // under mpirun: the gradients are reduced in buckets while the backward runs (--bucket-bytes);
  // allocated after total_base, so that the peak total counts their buffers
  std::optional<distributed::GradientBuckets> buckets;
  DataParallel step_dp = dp;
  if (dp.world > 1 && bucket_bytes > 0) {
    buckets.emplace(all_params, bucket_bytes, dp.reduction);
    step_dp.buckets = &*buckets;
  }
  auto run_start = Clock::now();
  for (int64_t step = 0; step < o.steps; ++step) {
    model->zero_grad();
    memory::reset_peaks();
    reset_counters();
    auto t0 = Clock::now();
    // forward and backward of every micro-batch of the step (one, unless --accumulate or mpirun)
    std::optional<FusedUpdate> fused;
    double fused_grad_sq = 0;  // --fuse-optimizer: the squared gradient norm, summed as the updates run
    std::vector<std::optional<uint64_t>> fused_hashes;  // and, at the first step, the digest's parts
    if (o.fuse_optimizer) {
      optimizer.set_lr(lr_at(step));
      // one rank, so the optimizer holds every parameter, in the model's (the digest's) order
      fused_hashes.assign(optimizer.params().size(), std::nullopt);
      fused.emplace(FusedUpdate{&optimizer, [&, step](const Tensor& p) {
                                  Tensor g = p.grad().detach();
                                  const double sq = sum(square(g)).item();
                                  // a non-finite gradient would turn this parameter into NaN: stop first
                                  if (!o.allow_nonfinite && !std::isfinite(sq))
                                    throw Error(detail::concat(
                                        "train: step ", step + 1, " of ", o.steps, ": the gradient of \"", p.name(),
                                        "\" is not finite (learning rate ", lr_at(step), "): training diverged and was "
                                        "stopped before that parameter's update (--fuse-optimizer: the parameters "
                                        "updated earlier in this step keep their update)",
                                        o.save.empty() ? "" : ", nothing was saved",
                                        ". Lower --lr, or pass --allow-nonfinite to keep going"));
                                  fused_grad_sq += sq;
                                  if (step == 0)
                                    fused_hashes[static_cast<size_t>(optimizer.index_of(p))] = gradient_hash(g);
                                }});
    }
    const StepGradients sg = step_gradients(*model, split.train, o.batch, config.seq, o.seed, policy, step, step_dp,
                                            fused ? &*fused : nullptr);
    communication_seconds += sg.communication_seconds;
    hidden_seconds += sg.hidden_seconds;
    if (step == 0) digest = o.fuse_optimizer ? combine_digest(fused_hashes) : gradient_digest(*model);
    const double loss_value = sg.loss;
    // the global gradient norm, clipped to --clip (infinity: measured, not clipped)
    const double grad_norm = o.fuse_optimizer ? std::sqrt(fused_grad_sq)
                                              : nn::clip_grad_norm(model->parameters(), o.clip > 0 ? o.clip
                                                                                    : std::numeric_limits<double>::infinity());
    // A non-finite loss or gradient would turn every weight into NaN at this step: stop first.
    if (!o.allow_nonfinite && !(std::isfinite(loss_value) && std::isfinite(grad_norm))) {
      progress.finish();
      throw Error(detail::concat("train: step ", step + 1, " of ", o.steps, " has loss ", number_text(loss_value),
                                 " and gradient norm ", number_text(grad_norm), " (learning rate ", lr_at(step), "): training ",
                                 "diverged and was stopped", o.fuse_optimizer ? "" : " before the update",
                                 o.save.empty() ? "" : ", nothing was saved",
                                 ". Lower --lr, or pass --allow-nonfinite to keep going"));
    }
    if (!o.fuse_optimizer) {
      optimizer.set_lr(lr_at(step));
      const size_t other_before = memory::live_bytes(memory::Tag::other);
      optimizer.step();
      if (step == 0) optimizer_state_bytes = memory::live_bytes(memory::Tag::other) - std::min(other_before,
                                                 memory::live_bytes(memory::Tag::other));
    } else if (step == 0) {
      for (size_t i = 0; i < optimizer.params().size(); ++i)  // the moments the updates allocated
        if (optimizer.exp_avg(i).defined()) optimizer_state_bytes += optimizer.exp_avg(i).nbytes() + optimizer.exp_avg_sq(i).nbytes();
    }
    if (sharded) broadcast_from_owners(all_params, owners);  // the owners' updates to every rank
    step_seconds.push_back(seconds_since(t0));
    if (step == BudgetPlanner::kProfilingSteps - 1) profiling_step_seconds = step_seconds.back();
    losses.push_back(loss_value);
    peak_saved = std::max(peak_saved, memory::peak_bytes(memory::Tag::saved) - saved_base);
    peak_total = std::max(peak_total, memory::stats().peak_total - total_base);
    recomputed_flops += counters().ops.recomputed_flops;
    {
      const DynamicCounters d = counters().dynamic;
      dynamic.evictions += d.evictions;
      dynamic.rematerializations += d.rematerializations;
      dynamic.remat_flops += d.remat_flops;
      dynamic.remat_seconds += d.remat_seconds;
      dynamic.smallest_feasible_bytes = std::max(dynamic.smallest_feasible_bytes, d.smallest_feasible_bytes);
      dynamic.offloaded += d.offloaded;
      dynamic.bytes_offloaded += d.bytes_offloaded;
      dynamic.bytes_prefetched += d.bytes_prefetched;
      dynamic.bytes_read_on_demand += d.bytes_read_on_demand;
      dynamic.stall_seconds += d.stall_seconds;
    }
    if ((step + 1) % eval_every == 0 || step + 1 == o.steps) {  // validation: --eval-every steps and at the end
      last_val_loss = validation_loss(*model, split.validation, o.batch, config.seq, o.seed);
      progress.note(detail::concat("step ", step + 1, "/", o.steps, ": train loss ", number_text(loss_value),
                                   ", validation loss ", number_text(last_val_loss)));
      if (o.json)
        emit_json({{"version", REMAT_VERSION}, {"event", "eval"}, {"step", step + 1}, {"train_loss", loss_value},
                   {"val_loss", last_val_loss}, {"seconds", seconds_since(run_start)}});
    }
    double tokens_per_s = tokens_per_step / step_seconds.back();
    char fields[160], val[24] = "-";
    if (!std::isnan(last_val_loss)) std::snprintf(val, sizeof val, "%.3f", last_val_loss);
    std::snprintf(fields, sizeof fields, "loss %.3f  val %s  %s tok/s  peak %s", losses.back(), val,
                  human_count(tokens_per_s).c_str(), bytes_text(peak_saved).c_str());
    progress.update(step + 1, fields);
  }
  progress.finish();
  const double train_seconds = seconds_since(run_start);
  size_t tail = std::min<size_t>(10, losses.size());
  double final_loss = 0;
  for (size_t i = losses.size() - tail; i < losses.size(); ++i) final_loss += losses[i];
  final_loss /= static_cast<double>(tail);
  const double val_loss = last_val_loss;  // evaluated at the last step

  // Side by side, on one batch: the chosen policy and save-all.
  Batch probe = sample_batch(split.train, o.batch, config.seq, o.seed, static_cast<uint64_t>(o.steps));
  StepMeasure chosen = measure_step(*model, probe, policy, o.seed);
  StepMeasure save_all = measure_step(*model, probe, Policy::save_all(), o.seed);
  model->zero_grad();

  if (!o.save.empty() && dp.rank == 0) {
    save_char_gpt(o.save, *model, char_gpt_metadata(config, tokenizer), o.format);
  }
  const std::vector<double> rank_peak_saved = distributed::all_gather(static_cast<double>(peak_saved));
  const std::vector<double> rank_peak_total = distributed::all_gather(static_cast<double>(peak_total));
  const std::vector<double> rank_optimizer_bytes = distributed::all_gather(static_cast<double>(optimizer_state_bytes));

  const double step_median = median(step_seconds);
  const double tokens_per_second = tokens_per_step / step_median;
  say("\nreport (%lld steps in %s)\n", static_cast<long long>(o.steps), human_duration(train_seconds).c_str());
  say("  loss: first %.3f, final %.3f (mean of last %zu steps), validation %.3f\n", losses.front(), final_loss, tail,
      val_loss);
  say("  %-14s %12s %12s\n", "policy", "peak saved", "step time");
  say("  %-14s %12s %10.1f ms   (whole run: peak saved %s, median step %.1f ms)\n", o.policy.c_str(),
      bytes_text(chosen.peak_saved).c_str(), chosen.seconds * 1e3, bytes_text(peak_saved).c_str(), step_median * 1e3);
  say("  %-14s %12s %10.1f ms\n", "save-all", bytes_text(save_all.peak_saved).c_str(), save_all.seconds * 1e3);
  say("  %-14s %12.3f %12.3f   (%s / save-all, one step each, same batch)\n", "ratio",
      static_cast<double>(chosen.peak_saved) / static_cast<double>(std::max<size_t>(1, save_all.peak_saved)),
      chosen.seconds / save_all.seconds, o.policy.c_str());
  std::optional<BudgetPlanner::Report> plan;
  double predicted_step_seconds = 0;
  if (policy.kind == Policy::Kind::budget) plan = model->planner()->report();
  if (plan) {
    // the plan predicts the chain of blocks; the rest of the step is taken from the profiling step
    double outside = std::max(0.0, profiling_step_seconds - plan->profiled_chain_seconds);
    predicted_step_seconds = plan->predicted_seconds + outside;
    say("  budget plan %s\n", plan->tree.c_str());
    say("  predicted: peak saved %s, step %.1f ms; measured: peak saved %s, step %.1f ms (median of the run %.1f ms)\n",
        bytes_text(plan->predicted_peak_bytes).c_str(), predicted_step_seconds * 1e3,
        bytes_text(chosen.peak_saved).c_str(), chosen.seconds * 1e3, step_median * 1e3);
  }
  if (policy.kind == Policy::Kind::dynamic) {
    say("  dynamic: %llu evictions, %llu rematerializations (%s FLOP, %.3f s) over the run; the smallest feasible "
        "budget seen: %s\n",
        static_cast<unsigned long long>(dynamic.evictions), static_cast<unsigned long long>(dynamic.rematerializations),
        human_count(dynamic.remat_flops).c_str(), dynamic.remat_seconds,
        bytes_text(dynamic.smallest_feasible_bytes).c_str());
  }
  if (policy.kind == Policy::Kind::offload) {
    say("  offload: %llu values (%s) written, %s read ahead, %s read on demand, %.3f s stalled over the run\n",
        static_cast<unsigned long long>(dynamic.offloaded), bytes_text(dynamic.bytes_offloaded).c_str(),
        bytes_text(dynamic.bytes_prefetched).c_str(), bytes_text(dynamic.bytes_read_on_demand).c_str(),
        dynamic.stall_seconds);
  }
  if (o.explain) {
    say("\nregions of one step under %s (the probe step above; times in milliseconds):\n%s", o.policy.c_str(),
        memory_report(chosen.counters, save_all.peak_saved).c_str());
  }
  if (dp.world > 1) {
    if (buckets)
      say("  data parallel: %d ranks, %s sum in %zu buckets of up to %s (buffers %s per rank); communication %.3f s "
          "over the run, of which %.3f s (%.0f%%) in flight while the backward ran and %.3f s waited for after it\n",
          dp.world, distributed::to_string(dp.reduction), buckets->bucket_count(), bytes_text(bucket_bytes).c_str(),
          bytes_text(buckets->buffer_bytes()).c_str(),
          communication_seconds, hidden_seconds,
          communication_seconds > 0 ? 100.0 * hidden_seconds / communication_seconds : 0.0,
          communication_seconds - hidden_seconds);
    else
      say("  data parallel: %d ranks, %s sum; communication %.3f s over the run (after the backward: --bucket-bytes 0)\n",
          dp.world, distributed::to_string(dp.reduction), communication_seconds);
    for (int r = 0; r < dp.world; ++r)
      say("  rank %d: peak saved %s, peak total %s, optimizer state %s%s\n", r,
          bytes_text(static_cast<size_t>(rank_peak_saved[static_cast<size_t>(r)])).c_str(),
          bytes_text(static_cast<size_t>(rank_peak_total[static_cast<size_t>(r)])).c_str(),
          bytes_text(static_cast<size_t>(rank_optimizer_bytes[static_cast<size_t>(r)])).c_str(), sharded ? " (sharded)" : "");
  }
  if (!o.save.empty()) say("  weights saved to %s\n", o.save.c_str());
  if (o.json) {
    nlohmann::json j = {{"version", REMAT_VERSION},
                        {"policy", policy.to_string()},
                        {"steps", o.steps},
                        {"first_loss", losses.front()},
                        {"final_loss", final_loss},
                        {"val_loss", val_loss},
                        {"tokens_per_second", tokens_per_second},
                        {"step_seconds_median", step_median},
                        {"train_seconds", train_seconds},
                        {"peak_saved_bytes", peak_saved},
                        {"peak_total_bytes", peak_total},
                        {"recomputed_flops", recomputed_flops},
                        {"evictions", dynamic.evictions},
                        {"rematerializations", dynamic.rematerializations},
                        {"remat_flops", dynamic.remat_flops},
                        {"remat_seconds", dynamic.remat_seconds},
                        {"smallest_feasible_bytes", dynamic.smallest_feasible_bytes},
                        {"values_offloaded", dynamic.offloaded},
                        {"bytes_offloaded", dynamic.bytes_offloaded},
                        {"bytes_prefetched", dynamic.bytes_prefetched},
                        {"bytes_read_on_demand", dynamic.bytes_read_on_demand},
                        {"stall_seconds", dynamic.stall_seconds},
                        {"grad_digest", digest},
                        {"probe_step_seconds", chosen.seconds},
                        {"probe_peak_saved_bytes", chosen.peak_saved},
                        {"save_all_step_seconds", save_all.seconds},
                        {"save_all_peak_saved_bytes", save_all.peak_saved},
                        {"saved_bytes_ratio", static_cast<double>(chosen.peak_saved) /
                                                  static_cast<double>(std::max<size_t>(1, save_all.peak_saved))},
                        {"step_time_ratio", chosen.seconds / save_all.seconds},
                        {"parameters", model->num_parameters()},
                        {"budget_bytes", policy.kind == Policy::Kind::budget ? policy.budget_bytes : 0},
                        {"predicted_peak_saved_bytes", plan ? plan->predicted_peak_bytes : 0},
                        {"predicted_step_seconds", predicted_step_seconds},
                        {"plan", plan ? plan->tree : ""},
                        {"layer_calls", chosen.counters.layer_calls},
                        {"regions_created", chosen.counters.regions_created},
                        {"regions", regions_json(chosen.counters)},
                        {"vocab", config.vocab},
                        {"accumulate", o.accumulate},
                        {"world_size", dp.world},
                        {"global_batch", o.batch * dp.micro_batches()},
                        {"reduction", distributed::to_string(dp.reduction)},
                        {"communication_seconds", communication_seconds},
                        {"communication_hidden_seconds", hidden_seconds},
                        {"bucket_bytes", dp.world > 1 ? bucket_bytes : 0},
                        {"buckets", buckets ? buckets->bucket_count() : 0},
                        {"bucket_buffer_bytes", buckets ? buckets->buffer_bytes() : 0},
                        {"fuse_optimizer", o.fuse_optimizer},
                        {"clip", o.clip},
                        {"rank_peak_saved_bytes", rank_peak_saved},
                        {"rank_peak_total_bytes", rank_peak_total},
                        {"shard_optimizer", sharded},
                        {"optimizer_state_bytes", optimizer_state_bytes},
                        {"rank_optimizer_state_bytes", rank_optimizer_bytes}};
    emit_json(j);
  }
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
