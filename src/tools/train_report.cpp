// The text report and the JSON line of a `remat train` run (train_report.h).
#include "train_report.h"

#include <algorithm>

#include "plan_report.h"
#include "remat/cpu_features.h"
#include "progress.h"

namespace remat::tools {

void emit_json(const nlohmann::json& j) {
  std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  std::fflush(stdout);
}

namespace {

// The CPU kernels' level and the features found (remat/cpu_features.h).
nlohmann::json cpu_json() {
  const CpuFeatures& f = cpu_features();
  return {{"level", cpu_level_name(f.level)},
          {"widest", cpu_level_name(f.widest)},
          {"forced", f.forced},
          {"bf16_products", f.bf16_products ? "bf16" : "float32"},
          {"features", f.features}};
}

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
                       {"recomputations", r.recomputations},
                       {"recomputed_flops", r.recomputed_flops},
                       {"skipped_flops", r.skipped_flops}});
  return regions;
}

// Losses, the probe against save-all, and the budget plan's prediction against the measurement.
void print_summary(const Human& say, const TrainOptions& o, const RunMeasure& m, const RunSummary& s) {
  const StepMeasure& chosen = s.chosen;
  say("\nreport (%lld steps in %s)\n", static_cast<long long>(o.steps), human_duration(m.train_seconds).c_str());
  say("  device: %s\n", s.device_text.c_str());
  say("  cpu kernels: %s\n", cpu_features().text().c_str());
  say("  loss: first %.3f, final %.3f (mean of last %zu steps), validation %.3f\n", m.first_loss, s.final_loss,
      s.tail, m.last_val_loss);
  say("  weights digest %s\n", s.weights_digest.c_str());
  say("  %-14s %12s %12s\n", "policy", "peak saved", "step time");
  say("  %-14s %12s %10.1f ms   (whole run: peak saved %s, median step %.1f ms)\n", o.policy.c_str(),
      bytes_text(chosen.peak_saved).c_str(), chosen.seconds * 1e3, bytes_text(m.peak_saved).c_str(), s.step_median * 1e3);
  say("  %-14s %12s %10.1f ms\n", "save-all", bytes_text(s.save_all.peak_saved).c_str(), s.save_all.seconds * 1e3);
  say("  %-14s %12.3f %12.3f   (%s / save-all, median of %d steps each in turns, same batch)\n", "ratio",
      static_cast<double>(chosen.peak_saved) / static_cast<double>(std::max<size_t>(1, s.save_all.peak_saved)),
      chosen.seconds / s.save_all.seconds, o.policy.c_str(), kProbeSteps);
  if (s.plan) {
    if (s.plan->automatic) say("  %s\n", auto_budget_text(*s.plan).c_str());
    say("  budget plan %s\n", s.plan->tree.c_str());
    if (!s.plan->offload_target.empty())
      say("  offload target %s: priced at the %s's measured write %s/s, read %s/s%s; the plan offloads %s a step "
          "(+o nodes)\n",
          s.plan->offload_target.c_str(), s.plan->offload_priced_as.c_str(),
          bytes_text(static_cast<size_t>(s.plan->offload_write_bytes_per_second)).c_str(),
          bytes_text(static_cast<size_t>(s.plan->offload_read_bytes_per_second)).c_str(),
          s.plan->offload_in_full ? ", charged in full (the step's threads take every core)" : "",
          bytes_text(s.plan->predicted_offloaded_bytes).c_str());
    say("  predicted: peak saved %s, step %.1f ms; measured: peak saved %s, step %.1f ms (median of the run %.1f ms)\n",
        bytes_text(s.plan->predicted_peak_bytes).c_str(), s.predicted_step_seconds * 1e3,
        bytes_text(chosen.peak_saved).c_str(), chosen.seconds * 1e3, s.step_median * 1e3);
    if (o.explain)
      say("  per value of the plan (%s; each layer call's input boundary and record): bytes, kept, offloaded or "
          "recomputed, and the forward re-runs that make it again:\n%s",
          s.plan->planner.c_str(), values_text(plan_values(*s.plan)).c_str());
  }
}

// The dynamic: and offload: counters over the run, and (--explain) the probe step's regions.
void print_policy_counters(const Human& say, const TrainOptions& o, const Policy& policy, const RunMeasure& m,
                           const RunSummary& s) {
  const DynamicCounters& dynamic = m.dynamic;
  if (policy.saved.dynamic_bytes > 0) {
    say("  dynamic: %llu evictions, %llu rematerializations (%s FLOP, %.3f s) over the run; the largest need seen: "
        "%s (a lower bound of the smallest feasible budget; remat plan measures it)\n",
        static_cast<unsigned long long>(dynamic.evictions), static_cast<unsigned long long>(dynamic.rematerializations),
        human_count(dynamic.remat_flops).c_str(), dynamic.remat_seconds,
        bytes_text(dynamic.smallest_feasible_bytes).c_str());
  }
  if (policy.saved.offload) {
    say("  offload: %llu values (%s) written, %s read ahead, %s read on demand (%s of those read as the file's "
        "mapped pages, without a copy), %.3f s stalled over the run\n",
        static_cast<unsigned long long>(dynamic.offloaded), bytes_text(dynamic.bytes_offloaded).c_str(),
        bytes_text(dynamic.bytes_prefetched).c_str(), bytes_text(dynamic.bytes_read_on_demand).c_str(),
        bytes_text(dynamic.bytes_mapped).c_str(), dynamic.stall_seconds);
    if (dynamic.bytes_over_plan > 0)
      say("  offload: warning: the saved bytes went %s above the budget plan's prediction, with no write left to "
          "wait for (the plan's model of this step did not hold)\n",
          bytes_text(dynamic.bytes_over_plan).c_str());
  }
  if (m.budget.steps_over > 0)
    say("  budget: %llu of %llu steps held more saved bytes than the budget, by at most %s (remat::counters().budget)\n",
        static_cast<unsigned long long>(m.budget.steps_over), static_cast<unsigned long long>(m.budget.steps),
        bytes_text(m.budget.most_over_bytes).c_str());
  if (o.explain) {
    say("\nregions of one step under %s (the probe step above; times in milliseconds):\n%s", o.policy.c_str(),
        memory_report(s.chosen.counters, s.save_all.peak_saved).c_str());
  }
}

// Under mpirun: the communication and every rank's memory.
void print_data_parallel(const Human& say, const DataParallel& dp, const RunMeasure& m, const RunSummary& s) {
  const double communication_seconds = m.communication_seconds, hidden_seconds = m.hidden_seconds;
  if (m.bucketed)
    say("  data parallel: %d ranks, %s sum in %zu buckets of up to %s (buffers %s per rank); communication %.3f s "
        "over the run, of which %.3f s (%.0f%%) in flight while the backward ran and %.3f s waited for after it\n",
        dp.world, distributed::to_string(dp.reduction), m.buckets, bytes_text(s.bucket_bytes).c_str(),
        bytes_text(m.bucket_buffer_bytes).c_str(),
        communication_seconds, hidden_seconds,
        communication_seconds > 0 ? 100.0 * hidden_seconds / communication_seconds : 0.0,
        communication_seconds - hidden_seconds);
  else
    say("  data parallel: %d ranks, %s sum; communication %.3f s over the run (after the backward: --bucket-bytes 0)\n",
        dp.world, distributed::to_string(dp.reduction), communication_seconds);
  for (int rank = 0; rank < dp.world; ++rank) {
    const size_t i = static_cast<size_t>(rank);
    say("  rank %d: peak saved %s, peak total %s, optimizer state %s%s\n", rank,
        bytes_text(static_cast<size_t>(s.rank_peak_saved[i])).c_str(),
        bytes_text(static_cast<size_t>(s.rank_peak_total[i])).c_str(),
        bytes_text(static_cast<size_t>(s.rank_optimizer_bytes[i])).c_str(), s.sharded ? " (sharded)" : "");
  }
}

}  // namespace

void print_report(const Human& say, const TrainOptions& o, const DataParallel& dp, const Policy& policy,
                  const RunMeasure& m, const RunSummary& s) {
  print_summary(say, o, m, s);
  print_policy_counters(say, o, policy, m, s);
  if (dp.world > 1) print_data_parallel(say, dp, m, s);
  if (m.state_writes > 0 || m.start_step > 0)
    say("  training state: %lld written to %s (%s), %.3f s in all (the last %.3f s; median step %.3f s)%s\n",
        static_cast<long long>(m.state_writes), o.state_dir.c_str(),
        m.state_interval > 0 ? ("every " + std::to_string(m.state_interval) + " steps").c_str() : "every ~1% of the time",
        m.state_write_seconds, m.last_state_write_seconds, s.step_median,
        m.start_step > 0 ? (", resumed at step " + std::to_string(m.start_step)).c_str() : "");
  if (!o.save.empty()) say("  weights saved to %s\n", o.save.c_str());
}

void emit_run_json(const TrainOptions& o, const DataParallel& dp, const Policy& policy, const RunMeasure& m,
                   const RunSummary& s) {
  const DynamicCounters& dynamic = m.dynamic;
  const StepMeasure &chosen = s.chosen, &save_all = s.save_all;
  const std::vector<ValueDecision> values = s.plan ? plan_values(*s.plan) : std::vector<ValueDecision>{};
  nlohmann::json j = {{"version", REMAT_VERSION},
                      {"policy", policy.to_string()},
                      {"dtype", o.dtype},
                      {"device", s.device},
                      {"cpu", cpu_json()},
                      {"steps", o.steps},
                      {"first_loss", m.first_loss},
                      {"final_loss", s.final_loss},
                      {"val_loss", m.last_val_loss},
                      {"tokens_per_second", s.tokens_per_second},
                      {"step_seconds_median", s.step_median},
                      {"train_seconds", m.train_seconds},
                      {"peak_saved_bytes", m.peak_saved},
                      {"peak_total_bytes", m.peak_total},
                      {"recomputed_flops", m.recomputed_flops},
                      {"evictions", dynamic.evictions},
                      {"rematerializations", dynamic.rematerializations},
                      {"remat_flops", dynamic.remat_flops},
                      {"remat_seconds", dynamic.remat_seconds},
                      {"smallest_feasible_bytes", dynamic.smallest_feasible_bytes},
                      {"values_offloaded", dynamic.offloaded},
                      {"bytes_offloaded", dynamic.bytes_offloaded},
                      {"bytes_prefetched", dynamic.bytes_prefetched},
                      {"bytes_read_on_demand", dynamic.bytes_read_on_demand},
                      {"bytes_mapped", dynamic.bytes_mapped},
                      {"stall_seconds", dynamic.stall_seconds},
                      {"bytes_over_plan", dynamic.bytes_over_plan},
                      {"budget_steps_checked", m.budget.steps},
                      {"budget_steps_over", m.budget.steps_over},
                      {"budget_most_over_bytes", m.budget.most_over_bytes},
                      {"weights_digest", s.weights_digest},
                      {"resumed_from_step", m.start_step},
                      {"state_writes", m.state_writes},
                      {"state_write_seconds", m.state_write_seconds},
                      {"last_state_write_seconds", m.last_state_write_seconds},
                      {"state", m.state_path},
                      {"grad_digest", m.digest},
                      {"grad_digest_step", m.digest_step},
                      {"grad_digest_under_plan", m.digest_under_plan},
                      {"probe_steps", kProbeSteps},
                      {"probe_step_seconds", chosen.seconds},
                      {"probe_peak_saved_bytes", chosen.peak_saved},
                      {"save_all_step_seconds", save_all.seconds},
                      {"save_all_peak_saved_bytes", save_all.peak_saved},
                      {"saved_bytes_ratio", static_cast<double>(chosen.peak_saved) /
                                                static_cast<double>(std::max<size_t>(1, save_all.peak_saved))},
                      {"step_time_ratio", chosen.seconds / save_all.seconds},
                      {"parameters", s.parameters},
                      {"budget_bytes", s.plan ? s.plan->budget_bytes : policy.keep.kind == Policy::Kind::budget ? policy.keep.budget_bytes : 0},
                      {"budget_auto", s.plan && s.plan->automatic ? auto_budget_json(*s.plan) : nlohmann::json(nullptr)},
                      {"predicted_peak_saved_bytes", s.plan ? s.plan->predicted_peak_bytes : 0},
                      {"predicted_step_seconds", s.predicted_step_seconds},
                      {"plan", s.plan ? s.plan->tree : ""},
                      {"planner", s.plan ? s.plan->planner : ""},
                      {"plan_offload", s.plan && !s.plan->offload_target.empty()
                                           ? nlohmann::json{{"target", s.plan->offload_target},
                                                            {"priced_as", s.plan->offload_priced_as},
                                                            {"charged_in_full", s.plan->offload_in_full},
                                                            {"write_bytes_per_second", s.plan->offload_write_bytes_per_second},
                                                            {"read_bytes_per_second", s.plan->offload_read_bytes_per_second},
                                                            {"to_host_bytes_per_second", s.plan->offload_to_host_bytes_per_second},
                                                            {"from_host_bytes_per_second", s.plan->offload_from_host_bytes_per_second},
                                                            {"predicted_offloaded_bytes", s.plan->predicted_offloaded_bytes}}
                                           : nlohmann::json(nullptr)},
                      {"plan_stages", s.plan ? decisions_json(stage_decisions(s.plan->costs, s.plan->plan,
                                                                              s.plan->stage_forward_flops),
                                                             s.plan->stage_labels)
                                             : nlohmann::json::array()},
                      {"plan_values", values_json(values)},
                      {"plan_values_total", s.plan ? totals_json(value_totals(values)) : nlohmann::json(nullptr)},
                      {"layer_calls", chosen.counters.layer_calls},
                      {"regions_created", chosen.counters.regions_created},
                      {"regions", regions_json(chosen.counters)},
                      {"vocab", s.vocab},
                      {"accumulate", o.accumulate},
                      {"world_size", dp.world},
                      {"global_batch", o.batch * dp.micro_batches()},
                      {"reduction", distributed::to_string(dp.reduction)},
                      {"communication_seconds", m.communication_seconds},
                      {"communication_hidden_seconds", m.hidden_seconds},
                      {"bucket_bytes", dp.world > 1 ? s.bucket_bytes : 0},
                      {"buckets", m.bucketed ? m.buckets : 0},
                      {"bucket_buffer_bytes", m.bucketed ? m.bucket_buffer_bytes : 0},
                      {"fuse_optimizer", o.fuse_optimizer},
                      {"clip", o.clip},
                      {"rank_peak_saved_bytes", s.rank_peak_saved},
                      {"rank_peak_total_bytes", s.rank_peak_total},
                      {"shard_optimizer", s.sharded},
                      {"optimizer_state_bytes", m.optimizer_state_bytes},
                      {"rank_optimizer_state_bytes", s.rank_optimizer_bytes}};
  emit_json(j);
}

}  // namespace remat::tools
