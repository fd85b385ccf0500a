// The plan report per value: `remat plan --json` ("plan_values") and `remat train --explain`
// list each stage's input boundary and record with its bytes, its decision (keep, offload,
// recompute) and the forward re-runs (runs, seconds, FLOPs) that make it again; the values add
// up to the plan's own figures and their decisions are the plan's schedule.
#include <fstream>
#include <map>

#include "cli_harness.h"
#include "remat/budget.h"
#include "remat/schedule.h"

namespace {

namespace rs = remat::schedule;

nlohmann::json last_json(const std::string& out) { return nlohmann::json::parse(lines_of(out).back()); }

// The values agree with the stages' rows of the same report: two values a stage, in order, with
// the stage's bytes and decisions; a stage's re-runs split between its record (with recording,
// and all of the last stage's) and the next stage's input (without); FLOPs are re-runs times the
// stage's forward FLOPs. The totals are the sums of the values.
void expect_values_match_stages(const nlohmann::json& j) {
  const nlohmann::json& stages = j["plan_stages"];
  const nlohmann::json& values = j["plan_values"];
  ASSERT_EQ(values.size(), 2 * stages.size()) << j.dump();
  std::map<std::string, size_t> bytes;
  int reruns = 0, forward_reruns = 0;
  double seconds = 0;
  for (size_t i = 0; i < stages.size(); ++i) {
    const nlohmann::json &s = stages[i], &input = values[2 * i], &record = values[2 * i + 1];
    EXPECT_EQ(input["stage"], s["stage"]);
    EXPECT_EQ(input["value"], "input");
    EXPECT_EQ(record["value"], "record");
    EXPECT_EQ(input["bytes"], s["input_bytes"]);
    EXPECT_EQ(record["bytes"], s["saved_bytes"]);
    EXPECT_EQ(input["decision"], s["input_offloaded"] ? "offload" : s["input_kept"] ? "keep" : "recompute") << s;
    EXPECT_EQ(record["decision"], s["decision"]) << s;
    const int runs = s["forward_runs"];
    EXPECT_GE(runs, 1) << s;
    forward_reruns += runs - 1;
    const int made_by_next = i + 1 < stages.size() ? values[2 * i + 2]["reruns"].get<int>() : 0;
    EXPECT_EQ(record["reruns"].get<int>() + made_by_next, runs - 1) << s;
    for (const nlohmann::json* v : {&input, &record}) {
      bytes[(*v)["decision"]] += (*v)["bytes"].get<size_t>();
      reruns += (*v)["reruns"].get<int>();
      seconds += (*v)["rerun_seconds"].get<double>();
    }
    if (!s["forward_flops"].is_null()) {
      EXPECT_EQ(record["flops_rerun"], record["reruns"].get<int>() * s["forward_flops"].get<double>()) << s;
      if (i + 1 < stages.size())
        EXPECT_EQ(values[2 * i + 2]["flops_rerun"], made_by_next * s["forward_flops"].get<double>()) << s;
    } else {
      EXPECT_TRUE(record["flops_rerun"].is_null()) << record;
    }
  }
  // the chain's input: kept, or in the target with stage 0's offloaded record where that holds it
  EXPECT_EQ(values[0]["decision"], stages[0]["input_offloaded"] && stages[0]["decision"] == "offload" ? "offload" : "keep");
  EXPECT_EQ(values[0]["reruns"], 0);
  const nlohmann::json& total = j["plan_values_total"];
  EXPECT_EQ(total["kept_bytes"], bytes["keep"]);
  EXPECT_EQ(total["offloaded_bytes"], bytes["offload"]);
  EXPECT_EQ(total["recomputed_bytes"], bytes["recompute"]);
  EXPECT_EQ(total["reruns"], reruns);
  EXPECT_EQ(reruns, forward_reruns);
  EXPECT_DOUBLE_EQ(total["rerun_seconds"].get<double>(), seconds);
}

}  // namespace

// --costs: the decisions are the schedule of the plan the planner makes for these costs at that
// budget (kept inputs: the top-level nodes' first stages; kept records: its top-level stages),
// the re-runs its recomputed forwards, their seconds its predicted time less one forward and
// backward a stage; no FLOPs are known (null).
TEST_F(Cli, PlanJsonListsEachValueWithItsDecision) {
  rs::ChainCosts costs;
  std::string text = "[";
  for (int i = 0; i < 8; ++i) {
    costs.forward_time.push_back(1 + i % 2);
    costs.backward_time.push_back(2);
    costs.boundary_bytes.push_back(static_cast<size_t>(16 + 8 * (i % 3)));
    costs.saved_bytes.push_back(static_cast<size_t>(64 + 32 * (i % 4)));
    text += std::string(i ? "," : "") + R"({"forward_seconds": )" + std::to_string(1 + i % 2) +
            R"(, "backward_seconds": 2, "boundary_bytes": )" + std::to_string(costs.boundary_bytes.back()) +
            R"(, "saved_bytes": )" + std::to_string(costs.saved_bytes.back()) + "}";
  }
  costs.boundary_bytes.push_back(costs.boundary_bytes.back());
  std::ofstream(path("values.json")) << text << "]";
  const rs::ChainPlanner planner(costs);  // the one chain planner, as `remat plan --costs` plans
  const size_t smallest = planner.smallest_limit();
  for (const size_t budget : {smallest, smallest + 64, rs::plan_save_all(costs).predicted_peak_bytes}) {
    const Result r = run("plan --json --budget " + std::to_string(budget) + " --costs " + path("values.json"));
    ASSERT_EQ(r.code, 0) << r.output;
    const nlohmann::json j = last_json(r.output);
    expect_values_match_stages(j);
    const rs::Plan plan = planner.plan(budget).plan;
    ASSERT_EQ(j["plan"]["tree"], rs::format_tree(plan.tree));
    std::vector<std::string> input(8, "recompute"), record(8, "recompute");
    for (const rs::PlanNode& n : plan.tree) {
      input[static_cast<size_t>(n.first)] = n.offloaded && n.kind == rs::PlanNode::Kind::region ? "offload" : "keep";
      if (n.kind == rs::PlanNode::Kind::stage) record[static_cast<size_t>(n.first)] = n.offloaded ? "offload" : "keep";
    }
    double base = 0;
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(j["plan_values"][2 * i]["decision"], input[static_cast<size_t>(i)]) << i;
      EXPECT_EQ(j["plan_values"][2 * i + 1]["decision"], record[static_cast<size_t>(i)]) << i;
      EXPECT_EQ(j["plan_values"][2 * i]["name"], "stage " + std::to_string(i) + ".input");
      base += costs.forward_time[static_cast<size_t>(i)] + costs.backward_time[static_cast<size_t>(i)];
    }
    const rs::SimResult sim = rs::simulate(costs, plan);
    EXPECT_EQ(j["plan_values_total"]["reruns"], sim.recomputed_forwards);
    EXPECT_DOUBLE_EQ(j["plan_values_total"]["rerun_seconds"].get<double>(), j["predicted_seconds"].get<double>() - base);
    EXPECT_TRUE(j["plan_values_total"]["flops_rerun"].is_null());
    if (budget == smallest) EXPECT_GT(sim.recomputed_forwards, 0);
    if (budget > smallest + 64) EXPECT_EQ(j["plan_values_total"]["recomputed_values"], 0);  // save-all's peak
  }
  // the text report: one line a value, then the totals
  const Result r = run("plan --budget " + std::to_string(smallest) + " --costs " + path("values.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("\n  stage   0 stage 0.input "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" recompute  re-run x"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("FLOPs unknown"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\n  in all: kept "), std::string::npos) << r.output;
}

// --costs with an offload target's costs (and --offload naming it): each offloaded value's
// transfer_seconds is what its transfer adds to the step as the plan is charged (its read, its
// part of the queued writes' stall), and they add up to the predicted time less the compute and
// re-runs. Offload costs without --offload are a usage error naming them.
TEST_F(Cli, PlanValuesChargeTheirTransfersAsThePlanIs) {
  // Reads of 2.5 s a record: the planners hide one behind a 2 s backward only in part.
  rs::ChainCosts costs = rs::ChainCosts::uniform(4, 1.0, 2.0, 10, 100);
  costs.offload_seconds_per_byte = 0.033;
  costs.offload_write_seconds_per_byte = 0.008;
  costs.reads_ahead = true;  // as budget plans read back
  std::string text = R"({"offload_write_seconds_per_byte": 0.008, "offload_read_seconds_per_byte": 0.025, "stages": [)";
  for (int i = 0; i < 4; ++i)
    text += std::string(i ? "," : "") +
            R"({"forward_seconds": 1, "backward_seconds": 2, "boundary_bytes": 10, "saved_bytes": 100})";
  std::ofstream(path("offload.json")) << text << "]}";
  const size_t budget = rs::plan_save_all(costs).predicted_peak_bytes - 100;  // one record too many
  const Result r = run("plan --json --budget " + std::to_string(budget) + " --costs " + path("offload.json") +
                       " --offload " + path(""));
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json j = last_json(r.output);
  expect_values_match_stages(j);
  const rs::Plan plan = rs::ChainPlanner(costs).plan(budget).plan;
  ASSERT_EQ(j["plan"]["tree"], rs::format_tree(plan.tree));
  ASSERT_NE(rs::format_tree(plan.tree).find("+o"), std::string::npos);
  const rs::SimResult sim = rs::simulate(costs, plan);
  double transfers = 0;
  for (const nlohmann::json& v : j["plan_values"]) {
    if (v["decision"] != "offload") EXPECT_EQ(v["transfer_seconds"], 0.0) << v;
    transfers += v["transfer_seconds"].get<double>();
  }
  EXPECT_NEAR(transfers, sim.read_time + sim.write_stall_time, 1e-12);
  EXPECT_LT(transfers, static_cast<double>(sim.offloaded_bytes) * costs.offload_seconds_per_byte);  // not serial
  EXPECT_GT(transfers, 0.0);
  EXPECT_NEAR(j["plan_values_total"]["transfer_seconds"].get<double>(), transfers, 1e-12);
  EXPECT_NEAR(j["predicted_seconds"].get<double>(),
              12.0 + j["plan_values_total"]["rerun_seconds"].get<double>() + transfers, 1e-9);
  const Result no_target = run("plan --budget " + std::to_string(budget) + " --costs " + path("offload.json"));
  EXPECT_EQ(no_target.code, 2) << no_target.output;
  EXPECT_NE(no_target.output.find("offload_write_seconds_per_byte"), std::string::npos) << no_target.output;
  EXPECT_NE(no_target.output.find("--offload DIR"), std::string::npos) << no_target.output;
}

// A GPT: `remat plan --json` names each value by its layer call with its profiled FLOPs re-run;
// `remat train --explain` at the same budget lists the plan it ran the same way (the same values,
// bytes and stage FLOPs: shapes decide them, not timings), and under budget:...+offload:DIR the
// values it offloads add up to the bytes the plan offloads a step ("plan_offload").
TEST_F(Cli, PlanAndTrainExplainListEachValueOfAModel) {
  const std::string model = " --threads 2 --layers 2 --width 32 --heads 2 --seq 16 --batch 4";
  Result r = run("plan --json" + model);
  ASSERT_EQ(r.code, 0) << r.output;
  const size_t smallest = last_json(r.output)["feasible"]["budget"]["smallest_bytes"];
  r = run("plan --json --budget " + std::to_string(smallest) + model);
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json planned = last_json(r.output);
  expect_values_match_stages(planned);
  ASSERT_FALSE(planned["plan_values_total"]["flops_rerun"].is_null()) << r.output;
  EXPECT_GT(planned["plan_values_total"]["flops_rerun"].get<double>(), 0) << r.output;
  EXPECT_GT(planned["plan_values_total"]["recomputed_values"].get<int>(), 0) << r.output;
  bool block_input = false;  // named by its layer call
  for (const auto& v : planned["plan_values"]) block_input |= v["name"] == "blocks.0.input";
  EXPECT_TRUE(block_input) << r.output;

  const std::string train = "train --json --explain --steps " + std::to_string(BudgetPlanner::kProfilingSteps + 1) + model;
  const Streams t = run_streams(train + " --policy budget:" + std::to_string(smallest));
  ASSERT_EQ(t.code, 0) << t.out << t.err;
  const nlohmann::json ran = last_json(t.out);
  expect_values_match_stages(ran);
  ASSERT_EQ(ran["plan_values"].size(), planned["plan_values"].size()) << t.out;
  for (size_t i = 0; i < ran["plan_values"].size(); ++i) {
    EXPECT_EQ(ran["plan_values"][i]["name"], planned["plan_values"][i]["name"]);
    EXPECT_EQ(ran["plan_values"][i]["bytes"], planned["plan_values"][i]["bytes"]);
  }
  for (size_t i = 0; i < ran["plan_stages"].size(); ++i)
    EXPECT_EQ(ran["plan_stages"][i]["forward_flops"], planned["plan_stages"][i]["forward_flops"]);
  EXPECT_NE(t.err.find("per value of the plan"), std::string::npos) << t.err;
  EXPECT_NE(t.err.find(" blocks.0.input "), std::string::npos) << t.err;
  EXPECT_NE(t.err.find("\n  in all: kept "), std::string::npos) << t.err;

  fs::create_directories(path("plan_target"));
  const Streams o = run_streams(train + " --policy budget:" + std::to_string(smallest) + "+offload:" + path("plan_target") +
                                ",threshold=0");
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  const nlohmann::json offloading = last_json(o.out);
  expect_values_match_stages(offloading);
  ASSERT_TRUE(offloading["plan_offload"].is_object()) << o.out;
  EXPECT_EQ(offloading["plan_values_total"]["offloaded_bytes"], offloading["plan_offload"]["predicted_offloaded_bytes"])
      << o.out;

  // dynamic: a run prints the largest need it saw as what it is, a lower bound, not as the minimum
  const Streams d = run_streams("train --steps 1" + model + " --policy dynamic:1GiB");
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_NE(d.err.find("the largest need seen: "), std::string::npos) << d.err;
  EXPECT_NE(d.err.find("(a lower bound of the smallest feasible budget; remat plan measures it)"), std::string::npos) << d.err;
  EXPECT_EQ(d.err.find("smallest feasible budget seen"), std::string::npos) << d.err;
}

// `remat plan --budget B` prints the plan `remat train --policy budget:B` runs: both are made by
// the budget policy from its profile (BudgetPlanner::plan_for), and --plan-from-flops on both
// prices each layer call by its FLOPs, so the two profiles plan alike whatever the timings. The
// same tree, predicted peak and planner, for the default model and a 120-layer one, at the
// smallest budget and halfway to save-all's peak.
TEST_F(Cli, PlanPrintsThePlanTrainRuns) {
  const std::string steps = " --steps " + std::to_string(BudgetPlanner::kProfilingSteps + 1);
  for (const std::string model : {std::string(" --threads 2 --plan-from-flops"),
                                  std::string(" --threads 2 --plan-from-flops --layers 120 --width 32 --heads 2 "
                                              "--seq 16 --batch 2")}) {
    SCOPED_TRACE(model);
    Result r = run("plan --json" + model);
    ASSERT_EQ(r.code, 0) << r.output;
    const nlohmann::json feasible = last_json(r.output)["feasible"]["budget"];
    const size_t smallest = feasible["smallest_bytes"], save_all = feasible["save_all_peak_bytes"];
    ASSERT_LT(smallest, save_all) << r.output;
    for (const size_t budget : {smallest, smallest + (save_all - smallest) / 2}) {
      SCOPED_TRACE(::testing::Message() << "budget " << budget);
      r = run("plan --json --budget " + std::to_string(budget) + model);
      ASSERT_EQ(r.code, 0) << r.output;
      const nlohmann::json planned = last_json(r.output);
      const Streams t = run_streams("train --json --explain" + steps + model + " --policy budget:" + std::to_string(budget));
      ASSERT_EQ(t.code, 0) << t.out << t.err;
      const nlohmann::json ran = last_json(t.out);
      EXPECT_EQ(ran["plan"], planned["plan"]["tree"]);
      EXPECT_EQ(ran["predicted_peak_saved_bytes"], planned["plan"]["predicted_peak_bytes"]);
      EXPECT_EQ(ran["planner"], planned["planner"]);
      if (budget == smallest) EXPECT_NE(ran["plan"].get<std::string>().find('R'), std::string::npos) << t.out;
    }
  }
}
