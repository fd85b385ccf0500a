// src/tools/plan_report.h - what a budget plan decides for each stage (layer call) of its chain,
// as `remat plan` and `remat train --explain` / `--json` print it.
//
//   auto decisions = stage_decisions(report.costs, report.plan, report.stage_forward_flops);
//   std::vector<ValueDecision> values = value_decisions(decisions, report.stage_labels);
//   say("%s", values_text(values).c_str());           // one line a value, then the totals
//   j["plan_values"] = values_json(values);            // [{"stage": 0, "name": ..., "decision": ...}, ...]
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
  size_t streamed_bytes = 0;   // of saved_bytes, the most in memory at once while offloaded (streamed)
  bool input_kept = false;
  bool input_offloaded = false;  // kept, in the offload target (a region's, or with its stage's offloaded record)
  bool keep = false;           // the record: keep or recompute
  bool offload = false;        // the record kept in the offload target
  size_t transfer_bytes = 0;   // written and read back per step
  double transfer_seconds = 0; // what its transfer adds to the step: its read's stall and its part of the writes' stall
  int forward_runs = 0;        // the stage's forwards in the plan (1: never recomputed)
  int reruns_recording = 0;    // of the forwards after its first, those with recording (they make the record)
  double recompute_seconds = 0;  // (forward_runs - 1) x its measured forward time
  double forward_flops = -1;   // one forward's FLOP estimate (profiled); negative: unknown (--costs)
};

// `forward_flops`: each stage's FLOP estimate, or empty where none was measured.
std::vector<StageDecision> stage_decisions(const schedule::ChainCosts& costs, const schedule::Plan& plan,
                                           const std::vector<double>& forward_flops = {});

// One value the plan decides on: a stage's input boundary ("input") or its record ("record"),
// its bytes, "keep", "offload" or "recompute", and the forward re-runs that make it again in the
// backward pass: a stage's re-runs with recording make its record, those without make its output,
// the next stage's input (the last stage's count with its record). So the re-runs of all values
// add up to the plan's: sum of (forward_runs - 1) over the stages, in runs, seconds and FLOPs.
// The chain's input (stage 0's) is always kept; it is listed, and its own re-runs are none.
struct ValueDecision {
  int stage = 0;
  std::string name;   // "<layer call>.input" / ".record", or "stage N.input" without labels
  std::string value;  // "input" or "record"
  size_t bytes = 0;
  std::string decision;  // "keep", "offload" or "recompute"
  int reruns = 0;
  double rerun_seconds = 0;
  double flops_rerun = -1;  // reruns x the stage's FLOPs; negative: unknown
  double transfer_seconds = 0;  // offload: what writing it out and reading it back adds to the step, predicted
};
std::vector<ValueDecision> value_decisions(const std::vector<StageDecision>& decisions,
                                           const std::vector<std::string>& labels);
// The totals per decision: bytes and values, and the re-runs' seconds and FLOPs.
struct ValueTotals {
  size_t kept_bytes = 0, offloaded_bytes = 0, recomputed_bytes = 0;
  int kept = 0, offloaded = 0, recomputed = 0, reruns = 0;
  double rerun_seconds = 0, flops_rerun = 0;  // flops_rerun negative: unknown
  double transfer_seconds = 0;
};
ValueTotals value_totals(const std::vector<ValueDecision>& values);
// One line a value, e.g. "  stage   2 blocks.0.record   121.50 KiB recompute  re-run x1, 1.69M FLOP, +0.0013 s",
// then the totals.
std::string values_text(const std::vector<ValueDecision>& values);
nlohmann::json values_json(const std::vector<ValueDecision>& values);  // an array, one object a value
nlohmann::json totals_json(const ValueTotals& totals);
// A budget plan's values, with its labels and profiled FLOPs.
std::vector<ValueDecision> plan_values(const BudgetPlanner::Report& report);
// The stages' rows of --json ("plan_stages"). `labels` may be empty.
nlohmann::json decisions_json(const std::vector<StageDecision>& decisions, const std::vector<std::string>& labels);

// budget:auto: what the budget was derived from and which case the plan is, e.g. "budget:auto:
// the run may use 21.9 GiB (the host's available memory plus what remat holds) and holds 3.1 MiB
// besides saved values: budget 21.9 GiB; save-all's peak, 1.1 MiB, fits: save-all, no recomputation".
std::string auto_budget_text(const BudgetPlanner::Report& report);
nlohmann::json auto_budget_json(const BudgetPlanner::Report& report);

}  // namespace remat::tools
