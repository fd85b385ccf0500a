// `remat train`'s step loop (train_steps.h).
#include "train_steps.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <cstdio>
#include <limits>
#include <string>

#include "remat/nn.h"
#include "train_state.h"

namespace remat::tools::training {

namespace {

// "nan" and "inf" without the sign a NaN may carry.
std::string number_text(double v) {
  if (std::isnan(v)) return "nan";
  return detail::concat(v);
}

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

TensorList updated_parameters(const TensorList& all_params, bool sharded, const std::vector<int>& owners, int rank) {
  TensorList updated;
  for (size_t i = 0; i < all_params.size(); ++i)
    if (!sharded || owners[i] == rank) updated.push_back(all_params[i]);
  return updated;
}

}  // namespace

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string weights_digest(const nn::Module& model) {
  std::vector<std::optional<uint64_t>> hashes;
  for (const auto& [name, p] : model.named_parameters()) hashes.push_back(gradient_hash(p.detach()));
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

Optimization::Optimization(const TrainOptions& o, const DataParallel& dp, nn::GPT& model)
    : all_params(model.parameters()),
      sharded(o.shard_optimizer && dp.world > 1),
      owners(sharded ? distributed::optimizer_owners(all_params, dp.world) : std::vector<int>{}),
      optimizer(updated_parameters(all_params, sharded, owners, dp.rank),
                {.lr = o.lr, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = 0.01}),
      lr_at{.max_lr = o.lr, .min_lr = 0.0,
            .warmup_steps = std::min<int64_t>(100, std::max<int64_t>(1, o.steps / 10)), .total_steps = o.steps} {}

double tokens_per_step(const TrainOptions& o, const DataParallel& dp, const nn::GPTConfig& config) {
  return static_cast<double>(o.batch) * static_cast<double>(dp.micro_batches()) * static_cast<double>(config.seq);
}

StepLoop::StepLoop(const TrainOptions& o, const DataParallel& dp, const Policy& policy, size_t bucket_bytes, Loaded& l,
                   Optimization& opt, RunMeasure restored, StateKeeper* keeper)
    : o_(o),
      policy_(policy),
      l_(l),
      opt_(opt),
      keeper_(keeper),
      progress_("train", o.steps, o.progress),
      eval_every_(o.eval_every > 0 ? o.eval_every : std::max<int64_t>(1, o.steps / 10)),
      tokens_per_step_(tokens_per_step(o, dp, l.config)),
      m_(std::move(restored)),
      saved_base_(memory_stats(l.device).live(memory::Tag::saved)),
      total_base_(memory_stats(l.device).live_total),
      step_dp_(dp) {
  if (dp.world > 1 && bucket_bytes > 0) {
    buckets_.emplace(opt.all_params, bucket_bytes, dp.reduction, dp.accumulate);
    step_dp_.buckets = &*buckets_;
  }
}

RunMeasure StepLoop::run() {
  const auto run_start = Clock::now();
  for (int64_t step = m_.start_step; step < o_.steps; ++step) {
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
    if (keeper_ != nullptr && (m_.stopped_by = keeper_->after_step(step + 1, m_)) != 0) break;
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
  if (step == digest_step(o_.steps)) {
    m_.digest = o_.fuse_optimizer ? combine_digest(fused_hashes) : gradient_digest(*l_.model);
    m_.digest_step = step + 1;
    // a budget plan is made by the forward that first runs it, so one in force now ran this step
    m_.digest_under_plan = policy_.keep.kind == Policy::Kind::budget && l_.model->planner()->report().has_value();
  }
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
  if (step == 0) m_.first_loss = loss_value;
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
  dynamic.bytes_over_plan = std::max(dynamic.bytes_over_plan, d.bytes_over_plan);
  const BudgetCounters b = counters().budget;
  m_.budget.steps += b.steps;
  m_.budget.steps_over += b.steps_over;
  m_.budget.most_over_bytes = std::max(m_.budget.most_over_bytes, b.most_over_bytes);
  if (b.steps > 0) m_.budget.last_peak_bytes = b.last_peak_bytes, m_.budget.last_budget_bytes = b.last_budget_bytes;
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

}  // namespace remat::tools::training
