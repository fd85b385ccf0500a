#include "plan_report.h"

#include <cstdio>

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
    out[static_cast<size_t>(node.first)].input_kept = true;
    if (node.kind == rs::PlanNode::Kind::stage) out[static_cast<size_t>(node.first)].keep = true;
  }
  for (const rs::Action& a : plan.actions)
    if (a.kind == rs::ActionKind::forward_no_save || a.kind == rs::ActionKind::forward_save_all)
      ++out[static_cast<size_t>(a.index)].forward_runs;
  for (StageDecision& d : out)
    d.recompute_seconds = (d.forward_runs > 1 ? d.forward_runs - 1 : 0) * costs.forward_time[static_cast<size_t>(d.stage)];
  return out;
}

std::string decisions_text(const std::vector<StageDecision>& decisions, const std::vector<std::string>& labels) {
  std::string text;
  char line[512];
  for (const StageDecision& d : decisions) {
    const std::string label = static_cast<size_t>(d.stage) < labels.size() ? labels[static_cast<size_t>(d.stage)] : "";
    std::snprintf(line, sizeof line, "  stage %3d %-12s input %10s %-10s record %10s %s", d.stage, label.c_str(),
                  memory::format_bytes(static_cast<double>(d.input_bytes)).c_str(),
                  d.input_kept ? "kept" : "recomputed", memory::format_bytes(static_cast<double>(d.saved_bytes)).c_str(),
                  d.keep ? "keep" : "recompute");
    text += line;
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
                    {"saved_bytes", d.saved_bytes},
                    {"decision", d.keep ? "keep" : "recompute"},
                    {"forward_runs", d.forward_runs},
                    {"recompute_seconds", d.recompute_seconds}});
  return rows;
}

}  // namespace remat::tools
