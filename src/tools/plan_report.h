// src/tools/plan_report.h - what a budget plan decides for each stage (layer call) of its chain,
// as `remat plan` and `remat train --explain` / `--json` print it.
//
//   for (const StageDecision& d : stage_decisions(report.costs, report.plan)) ...
//   say("%s", decisions_text(decisions, report.stage_labels).c_str());
//   j["plan_stages"] = decisions_json(decisions, report.stage_labels);
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "remat/budget.h"
#include "remat/schedule.h"

namespace remat::tools {

// One stage's values and what the plan does with them. Its input boundary is kept from the
// forward pass to its backward when the stage starts a top-level node of the plan (else it is
// recomputed with the region over it); its record (saved_bytes) is kept when the stage runs with
// recording in the forward pass ("keep"), else made again in the backward pass ("recompute").
// An offloaded node's kept value (a stage's record, a region's input) is written to the offload
// target and read back instead ("offload"; transfer_bytes).
struct StageDecision {
  int stage = 0;
  size_t input_bytes = 0, saved_bytes = 0;
  bool input_kept = false;
  bool input_offloaded = false;  // kept, in the offload target
  bool keep = false;           // the record: keep or recompute
  bool offload = false;        // the record kept in the offload target
  size_t transfer_bytes = 0;   // written and read back per step
  double transfer_seconds = 0; // transfer_bytes x the plan's offload cost per byte
  int forward_runs = 0;        // the stage's forwards in the plan (1: never recomputed)
  double recompute_seconds = 0;  // (forward_runs - 1) x its measured forward time
};

std::vector<StageDecision> stage_decisions(const schedule::ChainCosts& costs, const schedule::Plan& plan);
// A table, one row per stage: "  stage  3 block2  input 64.0 KiB kept  record 256.0 KiB recompute x2 (+0.0012 s)"
// (an offloaded value: "offloaded" / "offload", with the transfer's bytes and seconds).
// `labels` may be empty.
std::string decisions_text(const std::vector<StageDecision>& decisions, const std::vector<std::string>& labels);
nlohmann::json decisions_json(const std::vector<StageDecision>& decisions, const std::vector<std::string>& labels);

// budget:auto: what the budget was derived from and which case the plan is, e.g. "budget:auto:
// the run may use 21.9 GiB (the host's available memory plus what remat holds) and holds 3.1 MiB
// besides saved values: budget 21.9 GiB; save-all's peak, 1.1 MiB, fits: save-all, no recomputation".
std::string auto_budget_text(const BudgetPlanner::Report& report);
nlohmann::json auto_budget_json(const BudgetPlanner::Report& report);

}  // namespace remat::tools
