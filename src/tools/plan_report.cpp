#include "plan_report.h"

#include <algorithm>
#include <cstdio>

#include "remat/error.h"
#include "remat/memory.h"
#include "progress.h"

namespace remat::tools {

namespace rs = remat::schedule;

namespace {

// Each offloaded value's part of what the plan's transfers add to the step, as simulate() charges
// them: its read's stall (all of the read when it starts at its node), and, of the queued writes'
// stall (what they run past the forward pass), the part of the last writes in the queue, the
// latest first. The parts add up to the transfers' whole charge.
void charge_transfers(const rs::ChainCosts& costs, const rs::Plan& plan, std::vector<StageDecision>& out) {
  if (!costs.can_offload() || plan.tree.empty()) return;
  const rs::SimResult sim = rs::simulate(costs, plan);
  for (const rs::ReadAhead& read : sim.reads) out[static_cast<size_t>(read.index)].transfer_seconds += read.stall;
  double stall = sim.write_stall_time;
  for (auto node = plan.tree.rbegin(); node != plan.tree.rend() && stall > 0; ++node) {
    if (!node->offloaded) continue;
    StageDecision& d = out[static_cast<size_t>(node->first)];
    const double part = std::min(stall, costs.offload_write_seconds_per_byte * static_cast<double>(d.transfer_bytes));
    d.transfer_seconds += part;
    stall -= part;
  }
}

}  // namespace

std::vector<StageDecision> stage_decisions(const rs::ChainCosts& costs, const rs::Plan& plan,
                                           const std::vector<double>& forward_flops) {
  const int stages = costs.num_stages();
  std::vector<StageDecision> out(static_cast<size_t>(stages));
  for (int i = 0; i < stages; ++i) {
    StageDecision& d = out[static_cast<size_t>(i)];
    d.stage = i;
    d.input_bytes = costs.boundary_bytes[static_cast<size_t>(i)];
    d.saved_bytes = costs.saved_bytes[static_cast<size_t>(i)];
    d.streamed_bytes = costs.streamed(static_cast<size_t>(i));
    if (forward_flops.size() == static_cast<size_t>(stages)) d.forward_flops = forward_flops[static_cast<size_t>(i)];
  }
  for (const rs::PlanNode& node : plan.tree) {
    StageDecision& d = out[static_cast<size_t>(node.first)];
    d.input_kept = true;
    const bool stage = node.kind == rs::PlanNode::Kind::stage;
    d.keep = stage && !node.offloaded;
    d.offload = stage && node.offloaded;
    // an offloaded record that holds its whole input takes it along: the input is in the target too
    const size_t sent = d.offload ? costs.input_sent_with_record(static_cast<size_t>(node.first)) : 0;
    d.input_offloaded = (!stage && node.offloaded) || (sent > 0 && sent >= d.input_bytes);
    if (node.offloaded) d.transfer_bytes = stage ? d.saved_bytes + std::min(sent, d.input_bytes) : d.input_bytes;
  }
  charge_transfers(costs, plan, out);
  for (const rs::Action& a : plan.actions)
    if (a.kind == rs::ActionKind::forward_no_save || a.kind == rs::ActionKind::forward_save_all) {
      StageDecision& d = out[static_cast<size_t>(a.index)];
      d.reruns_recording += d.forward_runs > 0 && a.kind == rs::ActionKind::forward_save_all;
      ++d.forward_runs;
    }
  for (StageDecision& d : out)
    d.recompute_seconds = (d.forward_runs > 1 ? d.forward_runs - 1 : 0) * costs.forward_time[static_cast<size_t>(d.stage)];
  return out;
}

namespace {
const char* record_decision(const StageDecision& d) { return d.offload ? "offload" : d.keep ? "keep" : "recompute"; }
}  // namespace

nlohmann::json decisions_json(const std::vector<StageDecision>& decisions, const std::vector<std::string>& labels) {
  nlohmann::json rows = nlohmann::json::array();
  for (const StageDecision& d : decisions)
    rows.push_back({{"stage", d.stage},
                    {"label", static_cast<size_t>(d.stage) < labels.size() ? labels[static_cast<size_t>(d.stage)] : ""},
                    {"input_bytes", d.input_bytes},
                    {"input_kept", d.input_kept},
                    {"input_offloaded", d.input_offloaded},
                    {"saved_bytes", d.saved_bytes},
                    {"streamed_bytes", d.streamed_bytes},
                    {"decision", record_decision(d)},
                    {"forward_runs", d.forward_runs},
                    {"forward_flops", d.forward_flops < 0 ? nlohmann::json(nullptr) : nlohmann::json(d.forward_flops)},
                    {"recompute_seconds", d.recompute_seconds},
                    {"transfer_bytes", d.transfer_bytes},
                    {"transfer_seconds", d.transfer_seconds}});
  return rows;
}

std::vector<ValueDecision> value_decisions(const std::vector<StageDecision>& decisions,
                                           const std::vector<std::string>& labels) {
  std::vector<ValueDecision> values;
  auto name = [&](size_t i, const char* value) {
    return (i < labels.size() && !labels[i].empty() ? labels[i] : "stage " + std::to_string(i)) + "." + value;
  };
  auto reran = [](ValueDecision& v, const StageDecision& by, int runs) {
    v.reruns = runs;
    v.rerun_seconds = runs > 0 ? by.recompute_seconds * runs / (by.forward_runs - 1) : 0;
    v.flops_rerun = by.forward_flops < 0 ? -1 : runs * by.forward_flops;
  };
  for (size_t i = 0; i < decisions.size(); ++i) {
    const StageDecision& d = decisions[i];
    const bool last = i + 1 == decisions.size();
    const int reruns = std::max(0, d.forward_runs - 1);
    ValueDecision input{d.stage, name(i, "input"), "input", d.input_bytes,
                        d.input_offloaded ? "offload" : d.input_kept ? "keep" : "recompute"};
    if (i > 0) {  // made again by the previous stage's re-runs without recording
      const StageDecision& before = decisions[i - 1];
      reran(input, before, std::max(0, before.forward_runs - 1) - before.reruns_recording);
    } else {
      input.flops_rerun = d.forward_flops < 0 ? -1 : 0;
    }
    if (d.input_offloaded && !d.offload) input.transfer_seconds = d.transfer_seconds;  // else on the record
    values.push_back(std::move(input));
    ValueDecision record{d.stage, name(i, "record"), "record", d.saved_bytes, record_decision(d)};
    reran(record, d, last ? reruns : d.reruns_recording);
    if (d.offload) record.transfer_seconds = d.transfer_seconds;
    values.push_back(std::move(record));
  }
  return values;
}

std::vector<ValueDecision> plan_values(const BudgetPlanner::Report& report) {
  return value_decisions(stage_decisions(report.costs, report.plan, report.stage_forward_flops), report.stage_labels);
}

ValueTotals value_totals(const std::vector<ValueDecision>& values) {
  ValueTotals t;
  for (const ValueDecision& v : values) {
    if (v.decision == "keep") t.kept_bytes += v.bytes, ++t.kept;
    else if (v.decision == "offload") t.offloaded_bytes += v.bytes, ++t.offloaded;
    else t.recomputed_bytes += v.bytes, ++t.recomputed;
    t.reruns += v.reruns;
    t.rerun_seconds += v.rerun_seconds;
    t.transfer_seconds += v.transfer_seconds;
    t.flops_rerun = t.flops_rerun < 0 || v.flops_rerun < 0 ? -1 : t.flops_rerun + v.flops_rerun;
  }
  return t;
}

namespace {
std::string flops_text(double flops) { return flops < 0 ? "FLOPs unknown" : human_count(flops) + " FLOP"; }
std::string bytes_text(size_t b) { return memory::format_bytes(static_cast<double>(b)); }
}  // namespace

std::string values_text(const std::vector<ValueDecision>& values) {
  std::string text;
  char line[512];
  for (const ValueDecision& v : values) {
    std::snprintf(line, sizeof line, "  stage %3d %-24s %10s %-9s", v.stage, v.name.c_str(), bytes_text(v.bytes).c_str(),
                  v.decision.c_str());
    text += line;
    if (v.reruns > 0) {
      std::snprintf(line, sizeof line, "  re-run x%d, %s, +%.4f s", v.reruns, flops_text(v.flops_rerun).c_str(),
                    v.rerun_seconds);
      text += line;
    }
    if (v.decision == "offload") {
      std::snprintf(line, sizeof line, "  written and read back, +%.4f s", v.transfer_seconds);
      text += line;
    }
    text.erase(text.find_last_not_of(' ') + 1);
    text += "\n";
  }
  const ValueTotals t = value_totals(values);
  std::snprintf(line, sizeof line,
                "  in all: kept %s (%d values), offloaded %s (%d), recomputed %s (%d); %d forward re-runs, %s, +%.4f s; "
                "transfers +%.4f s\n",
                bytes_text(t.kept_bytes).c_str(), t.kept, bytes_text(t.offloaded_bytes).c_str(), t.offloaded,
                bytes_text(t.recomputed_bytes).c_str(), t.recomputed, t.reruns, flops_text(t.flops_rerun).c_str(),
                t.rerun_seconds, t.transfer_seconds);
  return text + line;
}

nlohmann::json values_json(const std::vector<ValueDecision>& values) {
  nlohmann::json rows = nlohmann::json::array();
  for (const ValueDecision& v : values)
    rows.push_back({{"stage", v.stage},
                    {"name", v.name},
                    {"value", v.value},
                    {"bytes", v.bytes},
                    {"decision", v.decision},
                    {"reruns", v.reruns},
                    {"rerun_seconds", v.rerun_seconds},
                    {"flops_rerun", v.flops_rerun < 0 ? nlohmann::json(nullptr) : nlohmann::json(v.flops_rerun)},
                    {"transfer_seconds", v.transfer_seconds}});
  return rows;
}

nlohmann::json totals_json(const ValueTotals& t) {
  return {{"kept_bytes", t.kept_bytes},           {"kept_values", t.kept},
          {"offloaded_bytes", t.offloaded_bytes}, {"offloaded_values", t.offloaded},
          {"recomputed_bytes", t.recomputed_bytes}, {"recomputed_values", t.recomputed},
          {"reruns", t.reruns},                   {"rerun_seconds", t.rerun_seconds},
          {"transfer_seconds", t.transfer_seconds},
          {"flops_rerun", t.flops_rerun < 0 ? nlohmann::json(nullptr) : nlohmann::json(t.flops_rerun)}};
}

namespace {
size_t save_all_peak(const BudgetPlanner::Report& report) {
  return schedule::plan_save_all(report.costs).predicted_peak_bytes + report.outside_bytes;
}
}  // namespace

std::string auto_budget_text(const BudgetPlanner::Report& report) {
  auto bytes = [](size_t b) { return memory::format_bytes(static_cast<double>(b)); };
  const size_t save_all = save_all_peak(report);
  const bool fits = save_all <= report.budget_bytes;
  return detail::concat(report.policy, ": the run may use ", bytes(report.memory_capacity_bytes), " (",
                        report.capacity_source, ") and holds ", bytes(report.held_besides_saved_bytes),
                        " besides saved values: budget ", bytes(report.budget_bytes), "; save-all's peak, ", bytes(save_all),
                        fits ? ", fits: save-all, no recomputation" : ", does not fit: the least recomputation that fits");
}

nlohmann::json auto_budget_json(const BudgetPlanner::Report& report) {
  const size_t save_all = save_all_peak(report);
  return {{"memory_capacity_bytes", report.memory_capacity_bytes},
          {"capacity_source", report.capacity_source},
          {"held_besides_saved_bytes", report.held_besides_saved_bytes},
          {"budget_bytes", report.budget_bytes},
          {"save_all_peak_bytes", save_all},
          {"save_all_fits", save_all <= report.budget_bytes}};
}

}  // namespace remat::tools
