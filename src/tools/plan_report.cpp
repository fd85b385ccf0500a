#include "plan_report.h"

#include <algorithm>
#include <cstdio>

#include "remat/error.h"
#include "remat/memory.h"

namespace remat::tools {

namespace rs = remat::schedule;

std::vector<StageDecision> stage_decisions(const rs::ChainCosts& costs, const rs::Plan& plan) {
  const int stages = costs.num_stages();
  std::vector<StageDecision> out(static_cast<size_t>(stages));
  for (int i = 0; i < stages; ++i) {
    StageDecision& d = out[static_cast<size_t>(i)];
    d.stage = i;
    d.input_bytes = costs.boundary_bytes[static_cast<size_t>(i)];
    d.saved_bytes = costs.saved_bytes[static_cast<size_t>(i)];
  }
  for (const rs::PlanNode& node : plan.tree) {
    StageDecision& d = out[static_cast<size_t>(node.first)];
    d.input_kept = true;
    const bool stage = node.kind == rs::PlanNode::Kind::stage;
    d.keep = stage && !node.offloaded;
    d.offload = stage && node.offloaded;
    d.input_offloaded = !stage && node.offloaded;
    if (node.offloaded) {
      d.transfer_bytes = stage ? d.saved_bytes : d.input_bytes;
      d.transfer_seconds = static_cast<double>(d.transfer_bytes) * std::max(0.0, costs.offload_seconds_per_byte);
    }
  }
  for (const rs::Action& a : plan.actions)
    if (a.kind == rs::ActionKind::forward_no_save || a.kind == rs::ActionKind::forward_save_all)
      ++out[static_cast<size_t>(a.index)].forward_runs;
  for (StageDecision& d : out)
    d.recompute_seconds = (d.forward_runs > 1 ? d.forward_runs - 1 : 0) * costs.forward_time[static_cast<size_t>(d.stage)];
  return out;
}

namespace {
const char* record_decision(const StageDecision& d) { return d.offload ? "offload" : d.keep ? "keep" : "recompute"; }
}  // namespace

std::string decisions_text(const std::vector<StageDecision>& decisions, const std::vector<std::string>& labels) {
  std::string text;
  char line[512];
  for (const StageDecision& d : decisions) {
    const std::string label = static_cast<size_t>(d.stage) < labels.size() ? labels[static_cast<size_t>(d.stage)] : "";
    std::snprintf(line, sizeof line, "  stage %3d %-12s input %10s %-10s record %10s %s", d.stage, label.c_str(),
                  memory::format_bytes(static_cast<double>(d.input_bytes)).c_str(),
                  d.input_offloaded ? "offloaded" : d.input_kept ? "kept" : "recomputed",
                  memory::format_bytes(static_cast<double>(d.saved_bytes)).c_str(), record_decision(d));
    text += line;
    if (d.transfer_bytes > 0) {
      std::snprintf(line, sizeof line, " (transfer %s, +%.4f s)",
                    memory::format_bytes(static_cast<double>(d.transfer_bytes)).c_str(), d.transfer_seconds);
      text += line;
    }
    if (d.forward_runs > 1) {
      std::snprintf(line, sizeof line, " (forward x%d, +%.4f s)", d.forward_runs, d.recompute_seconds);
      text += line;
    }
    text += "\n";
  }
  return text;
}

nlohmann::json decisions_json(const std::vector<StageDecision>& decisions, const std::vector<std::string>& labels) {
  nlohmann::json rows = nlohmann::json::array();
  for (const StageDecision& d : decisions)
    rows.push_back({{"stage", d.stage},
                    {"label", static_cast<size_t>(d.stage) < labels.size() ? labels[static_cast<size_t>(d.stage)] : ""},
                    {"input_bytes", d.input_bytes},
                    {"input_kept", d.input_kept},
                    {"input_offloaded", d.input_offloaded},
                    {"saved_bytes", d.saved_bytes},
                    {"decision", record_decision(d)},
                    {"forward_runs", d.forward_runs},
                    {"recompute_seconds", d.recompute_seconds},
                    {"transfer_bytes", d.transfer_bytes},
                    {"transfer_seconds", d.transfer_seconds}});
  return rows;
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
