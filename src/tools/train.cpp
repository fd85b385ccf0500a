// `remat train`: a character-level GPT on a text corpus, checkpointed by the policy.
//
// train() is one run in four parts: the options checked and the corpus, model and weights loaded
// (check_options, load: train_load.cpp), the steps (StepLoop, which measures a RunMeasure:
// train_steps.cpp), the side-by-side probe against save-all (finish_run), then the text report on
// stderr and the JSON line on stdout (print_report, emit_run_json: train_report.cpp). run_train
// wraps it for mpirun.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <optional>
#include <vector>

#include "commands.h"
#include "data_parallel.h"
#include "device_option.h"
#include "progress.h"
#include "train_load.h"
#include "train_report.h"
#include "train_signals.h"
#include "train_state.h"
#include "train_state_dir.h"
#include "train_steps.h"
#include "usage.h"
#include "remat/nn.h"
#include "remat/remat.h"
#include "weights.h"

namespace remat::tools {

namespace {

using namespace training;

// Under mpirun: every rank must run the same training (options that change the result or the
// number of collectives), on the same text, with the same model: else an error on every rank.
void check_ranks_agree(const TrainOptions& o, const std::vector<int64_t>& tokens, const nn::GPT& model) {
  // with --load or --resume every rank must have read the same weights (a different file on one
  // rank is an error, not silently replaced)
  const bool loaded = !o.load.empty() || !o.resume_state.empty();
  const std::string options = detail::concat("steps ", o.steps, " batch ", o.batch, " accumulate ", o.accumulate, " lr ",
                                             o.lr, " seed ", o.seed, " dropout ", o.dropout, " reduce ", o.reduce,
                                             " allow_nonfinite ", o.allow_nonfinite, " shard_optimizer ",
                                             o.shard_optimizer, " bucket_bytes ", o.bucket_bytes, " clip ", o.clip, " dtype ", o.dtype);
  distributed::check_same(fnv1a(options.data(), options.size()),
                          "set of training options (--steps, --batch, --accumulate, --lr, --seed, --dropout, --reduce, "
                          "--allow-nonfinite, --shard-optimizer, --bucket-bytes, --clip, --dtype)");
  distributed::check_same(fnv1a(tokens.data(), tokens.size() * sizeof(int64_t)), "corpus (--data)");
  // names, shapes and dtypes, then rank 0's weights everywhere
  distributed::broadcast_parameters(model.named_parameters(), loaded);
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
  if (o.dtype != "f32")
    say("precision: %s activations and saved values, float32 master weights, optimizer state and loss\n",
        o.dtype.c_str());
}

// A dynamic: budget too small for a step fails at the first op that cannot fit, whose error can
// only name what the step needed up to there. Measures the whole step's smallest budget
// (dynamic_feasible_range, on a batch of the same shape) and names it. One process only: the
// probing steps run no collectives.
[[noreturn]] void rethrow_with_dynamic_minimum(const Error& e, const TrainOptions& o, const DataParallel& dp,
                                                const Policy& policy, Loaded& l) {
  if (policy.saved.dynamic_bytes == 0 || dp.world > 1 || counters().dynamic.smallest_feasible_bytes <= policy.saved.dynamic_bytes)
    throw;
  const Batch batch = sample_batch(l.split.train, o.batch, l.config.seq, o.seed, 0, l.device);
  const DynamicRange range = dynamic_feasible_range([&] {
    l.model->zero_grad();
    manual_seed(o.seed);
    backward([&] { return l.model->loss(batch.inputs, batch.targets); }, GradOptions{});
  });
  l.model->zero_grad();
  const size_t smallest = range.smallest_budget_bytes;
  const size_t plus = o.policy.find('+');  // +offload:... stays as given
  const std::string placement = plus == std::string::npos ? "" : o.policy.substr(plus);
  throw Error(detail::concat("train --policy ", o.policy, ": the budget is below the smallest feasible dynamic: budget of "
                             "a step of this model, ", smallest, " bytes (", memory::format_bytes(static_cast<double>(smallest)),
                             "; measured over a whole step in ", range.runs, " runs; save-all's peak is ",
                             range.save_all_peak_bytes, " bytes): pass --policy dynamic:", smallest, placement,
                             " (or a larger budget). The op that failed said: ", e.what()));
}

// ---- after the loop: the probe, the saved weights, the per-rank figures (RunSummary)

// --save at the end; a failure says where the trained weights still are, or how to keep them next
// time (its free space was checked before step 1, but a disk can fill up during a run).
void save_weights(const TrainOptions& o, Loaded& l) {
  try {
    save_char_gpt(o.save, *l.model, char_gpt_metadata(l.config, l.tokenizer), o.format, save_dtype(o));
  } catch (const Error& e) {
    if (o.state_dir.empty())
      throw Error(detail::concat(e.what(), "; the trained weights were not kept. Pass --state-dir DIR to keep the training "
                                 "state as the run goes (and at its end, before --save): a failed --save is then "
                                 "written again with remat train --resume DIR --save ", o.save));
    throw Error(detail::concat(e.what(), "; the trained weights are kept in the final state under ", o.state_dir,
                               ": free space and write them with remat train --resume ", o.state_dir, " --save ", o.save));
  }
}

RunSummary finish_run(const TrainOptions& o, const DataParallel& dp, const CheckedOptions& checked, bool sharded, Loaded& l,
                      const RunMeasure& m) {
  const Policy& policy = checked.policy;
  RunSummary r;
  r.tail = std::min<size_t>(kReportedLossTail, m.losses.size());
  for (size_t i = m.losses.size() - r.tail; i < m.losses.size(); ++i) r.final_loss += m.losses[i];
  r.final_loss /= static_cast<double>(std::max<size_t>(1, r.tail));
  r.weights_digest = weights_digest(*l.model);

  // Side by side, on one batch: the chosen policy and save-all, in turns, the median of each.
  Batch probe = sample_batch(l.split.train, o.batch, l.config.seq, o.seed, static_cast<uint64_t>(o.steps), l.device);
  std::vector<StepMeasure> chosen, save_all;
  std::vector<double> chosen_seconds, save_all_seconds;
  for (int i = 0; i < kProbeSteps; ++i) {
    chosen.push_back(measure_step(*l.model, probe, policy, o.seed));
    save_all.push_back(measure_step(*l.model, probe, Policy::save_all(), o.seed));
    chosen_seconds.push_back(chosen.back().seconds);
    save_all_seconds.push_back(save_all.back().seconds);
  }
  r.chosen = chosen.back();  // the last: a budget plan or dynamic: runtime has settled by then
  r.save_all = save_all.back();
  r.chosen.seconds = median(chosen_seconds);
  r.save_all.seconds = median(save_all_seconds);
  l.model->zero_grad();

  if (!o.save.empty() && dp.rank == 0) save_weights(o, l);
  r.rank_peak_saved = distributed::all_gather(static_cast<double>(m.peak_saved));
  r.rank_peak_total = distributed::all_gather(static_cast<double>(m.peak_total));
  r.rank_optimizer_bytes = distributed::all_gather(static_cast<double>(m.optimizer_state_bytes));

  r.step_median = median(m.step_seconds);
  r.tokens_per_second = tokens_per_step(o, dp, l.config) / r.step_median;
  if (policy.keep.kind == Policy::Kind::budget) r.plan = l.model->planner()->report();
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

// A signal stopped the run after a state was written: say where it is and how to continue.
int stopped(const TrainOptions& o, const DataParallel& dp, const RunMeasure& m) {
  const char* name = m.stopped_by == SIGINT ? "SIGINT" : m.stopped_by == SIGTERM ? "SIGTERM" : "a signal";
  const int64_t done = m.start_step + static_cast<int64_t>(m.step_seconds.size());
  if (dp.rank == 0) {
    std::fprintf(stderr, "remat train: stopped by %s after step %lld of %lld; the training state is in %s\n"
                 "  continue with: %s\n", name, static_cast<long long>(done), static_cast<long long>(o.steps),
                 m.state_path.c_str(), resume_command(o).c_str());
    if (o.json)
      emit_json({{"version", REMAT_VERSION}, {"event", "stopped"}, {"signal", name}, {"step", done},
                 {"steps", o.steps}, {"state", m.state_path}, {"resume", resume_command(o)}});
  }
  return 128 + m.stopped_by;
}

int train(const TrainOptions& o, const DataParallel& dp) {
  if (o.threads > 0) set_num_threads(o.threads);
  const CheckedOptions checked = check_options(o, dp);
  REMAT_USAGE_CHECK(o.device == "cpu" || dp.micro_batches() == 1, "train: --device ", o.device,
                    " runs one micro-batch per step in one process (--accumulate and mpirun add gradients on the host)");
  const StateDirectoryLock lock = check_writable(o, dp);
  const Device device = select_device("train --device", o.device, o.backend_options);
  if (o.dtype != "f32") check_device_dtype("train --dtype", device, o.dtype == "bf16" ? DType::bf16 : DType::f16);
  Loaded l = load(o, device);
  schedule::ChainPlanOptions planning;
  planning.times_from_flops = o.plan_from_flops;
  if (o.progress) planning.progress = planning_progress("remat train: planning the budget");
  l.model->planner()->set_options(std::move(planning));
  if (o.eval_only) return evaluate_only(o, l);
  Optimization opt(o, dp, *l.model);
  RunMeasure restored = restore_state(o, dp, l, opt);
  check_room(o, dp, l);
  if (dp.world > 1) check_ranks_agree(o, l.tokens, *l.model);

  const Human say{o.progress};
  print_banner(say, o, dp, l);
  if (!o.resume_state.empty())
    say("resumed from %s: %lld of %lld steps done\n", o.resume_state.c_str(), static_cast<long long>(restored.start_step),
        static_cast<long long>(o.steps));
  if (const int64_t run = resumed_run_steps(o); run != o.steps)
    say("extended from %lld to %lld steps: the learning rate from step %lld on follows the schedule of a %lld-step run\n",
        static_cast<long long>(run), static_cast<long long>(o.steps), static_cast<long long>(restored.start_step + 1),
        static_cast<long long>(o.steps));
  std::optional<StateKeeper> keeper;
  if (!o.state_dir.empty()) keeper.emplace(o, dp, l, opt, restored.start_step);
  StepLoop loop(o, dp, checked.policy, checked.bucket_bytes, l, opt, std::move(restored), keeper ? &*keeper : nullptr);
  RunMeasure m;
  try {
    m = loop.run();
  } catch (const Error& e) {
    rethrow_with_dynamic_minimum(e, o, dp, checked.policy, l);
  }
  if (keeper) {
    if (m.stopped_by == 0) keeper->finish(o.steps, m);  // before --save: a failed --save leaves the weights here
    m.state_writes = keeper->writes();
    m.state_write_seconds = keeper->write_seconds();
    m.last_state_write_seconds = keeper->last_write_seconds();
    m.state_path = keeper->last_path().empty() ? o.resume_state : keeper->last_path();
    m.state_interval = keeper->interval();
  }
  if (m.stopped_by != 0) return stopped(o, dp, m);
  const RunSummary s = finish_run(o, dp, checked, opt.sharded, l, m);
  print_report(say, o, dp, checked.policy, m, s);
  if (o.json) emit_run_json(o, dp, checked.policy, m, s);
  return 0;
}

}  // namespace

int run_train(const TrainOptions& given) {
  TrainOptions o = given;
  apply_resume(o);  // the run's options from its state
  // before MPI starts its threads, which inherit the blocked signals (Note [stopping on a signal])
  std::optional<StopSignals> signals;
  if (!o.state_dir.empty() && !o.eval_only) signals.emplace();
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
      fit_world(o, dp);  // --resume of a state written by several ranks: the same global batch
      const int code = train(o, dp);
      distributed::finalize();
      return code;
    } catch (...) {
      distributed::finalize();
      throw;
    }
  }
  try {
    fit_world(o, dp);  // --resume of a state written by another number of ranks: the same global batch
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
