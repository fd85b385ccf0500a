// `remat plan`: the schedule the budget policy would run, with its predicted peak and time, next
// to uniform segments and every-layer at the same memory.
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "usage.h"
#include "corpus.h"
#include "costs.h"
#include "footprint.h"
#include "plan_report.h"
#include "progress.h"
#include "remat/budget.h"
#include "remat/dynamic.h"
#include "remat/nn.h"
#include "remat/offload.h"
#include "remat/remat.h"
#include "remat/schedule.h"

namespace remat::tools {

namespace rs = remat::schedule;

namespace {

// What profiling a model gives: the costs of its blocks, the saved bytes outside them, and the
// feasible budgets of budget: and dynamic:.
struct ModelProfile {
  rs::ChainCosts costs;
  size_t outside = 0;      // saved before the chain
  size_t after_chain = 0;  // saved after it, up to the loss (counted with the chain's output)
  std::optional<BudgetPlanner::FeasibleRange> budget_range;
  std::optional<DynamicRange> dynamic_range;
  std::vector<std::string> labels;  // the layer call of each stage (a model)
  std::vector<double> flops;         // each stage's forward FLOPs (a model; --costs: none)
  // --offload DIR: the target, its measured bandwidth and the smallest budget with it
  std::string offload_target;
  OffloadPrice price;     // as a budget plan prices it (offload_price), or as --costs gives it
  std::string priced_as;  // "page cache", "disk" or "the costs file"
  bool in_full = false;   // each transfer charged in full (offload_copies_share_the_cores)
  std::optional<size_t> offload_smallest;
  // A model: its budget planner, holding the profile; `remat plan` asks it for the plan a budget
  // policy would run (BudgetPlanner::plan_for). --costs: none; the chain planner plans the file's
  // chain (`planner`, made once).
  std::shared_ptr<BudgetPlanner> model_planner;
  std::shared_ptr<const rs::ChainPlanner> planner;
  // A model: its costs as the allocator counts saved bytes (ChainCosts::boundaries_counted_when_held,
  // swept_values, gap_saved), with which a budget plan in memory is predicted; `costs` is what the
  // planners plan with, as the budget policy's own check and plan do.
  std::optional<rs::ChainCosts> held;
};

// Profiles the GPT of `remat train` with these options, as its steps run (a forward and backward
// on one batch): under budget: for the costs, then under dynamic: budgets for that range.
ModelProfile profile_model(const PlanOptions& o) {
  REMAT_CHECK(o.train.width % o.train.heads == 0, "plan: --width ", o.train.width, " is not a multiple of --heads ",
              o.train.heads);
  REMAT_CHECK(o.train.dropout >= 0 && o.train.dropout < 1, "plan: --dropout must be in [0, 1), got ", o.train.dropout);
  Corpus corpus = load_corpus(o.train.data.empty() ? kDefaultCorpus : o.train.data);
  CharTokenizer tokenizer = CharTokenizer::from_text(corpus.text);
  std::vector<int64_t> tokens = tokenizer.encode(corpus.text);
  nn::GPTConfig config{.vocab = tokenizer.vocab_size(), .layers = o.train.layers, .width = o.train.width,
                       .heads = o.train.heads, .seq = o.train.seq, .dropout = o.train.dropout, .dtype = DType::f32,
                       .seed = o.train.seed};
  check_footprint(config, o.train.batch, Use::profile,
                  detail::concat("plan --layers ", o.train.layers, " --width ", o.train.width, " --heads ", o.train.heads,
                                 " --seq ", o.train.seq, " --batch ", o.train.batch));
  nn::GPT model(config);
  rs::ChainPlanOptions options;
  options.progress = planning_progress("remat plan: planning " + std::to_string(o.train.layers) + " layers (profile)");
  options.times_from_flops = o.train.plan_from_flops;
  model.planner()->set_options(options);
  Batch batch = sample_batch(tokens, o.train.batch, config.seq, o.train.seed, 0);
  Policy probe = Policy::budget(size_t(1) << 50);  // any budget: we only want the measured costs
  for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) {
    model.zero_grad();
    memory::reset_peaks();
    backward([&] { return model.loss(batch.inputs, batch.targets); }, GradOptions{probe});
  }
  {
    ScopedPolicy scoped(probe);
    model.loss(batch.inputs, batch.targets);  // plans: the report holds the measured costs
  }
  auto report = model.planner()->report();
  REMAT_CHECK(report.has_value(), "plan: profiling the model produced no costs");
  rs::ChainCosts planned = report->costs;
  planned.boundaries_counted_when_held = false;
  planned.swept_values.clear();
  planned.gap_saved.clear();
  ModelProfile profile{planned, report->outside_bytes, report->after_chain_bytes,
                       model.planner()->feasible_range(), std::nullopt,
                       report->stage_labels, report->stage_forward_flops};
  if (report->costs.boundaries_counted_when_held) profile.held = report->costs;
  profile.model_planner = model.planner();
  profile.dynamic_range = dynamic_feasible_range([&] {
    model.zero_grad();
    manual_seed(o.train.seed);
    backward([&] { return model.loss(batch.inputs, batch.targets); }, GradOptions{});
  });
  model.zero_grad();
  return profile;
}

std::string bytes_both(size_t bytes) {
  return std::to_string(bytes) + " bytes (" + memory::format_bytes(static_cast<double>(bytes)) + ")";
}

std::string describe(const std::vector<rs::PlanNode>& tree) {
  std::string kept = "a0", internals, order;
  for (size_t i = 0; i < tree.size(); ++i) {
    const auto& n = tree[i];
    if (i > 0) kept += " a" + std::to_string(n.first);
    if (n.kind == rs::PlanNode::Kind::stage) internals += (internals.empty() ? "" : " ") + std::to_string(n.first);
  }
  for (size_t i = tree.size(); i-- > 0;)
    if (tree[i].kind == rs::PlanNode::Kind::region)
      order += (order.empty() ? "" : ", ") + rs::format_tree({tree[i]});
  return "  kept boundaries (stage inputs): " + kept + "\n  stages keeping their internals: " +
         (internals.empty() ? "none" : internals) + "\n  recomputed in the backward pass, in this order: " +
         (order.empty() ? "nothing" : order) + "\n";
}

nlohmann::json plan_json(const std::string& name, const rs::Plan& plan, size_t outside, size_t budget) {
  return {{"name", name},
          {"tree", rs::format_tree(plan.tree)},
          {"predicted_peak_bytes", plan.predicted_peak_bytes + outside},
          {"predicted_seconds", plan.predicted_time},
          {"fits_budget", plan.predicted_peak_bytes + outside <= budget}};
}

// The feasible budgets, e.g. "feasible budgets: budget: from ... to ... (save-all's peak)".
std::string feasible_text(const ModelProfile& p) {
  std::string text = "feasible budgets (smallest that runs; save-all's peak, at or above which nothing is recomputed):\n";
  if (p.budget_range)
    text += "  budget:  from " + bytes_both(p.budget_range->smallest_budget_bytes) + ", save-all's peak " +
            bytes_both(p.budget_range->save_all_peak_bytes) + "\n";
  if (p.offload_smallest)
    text += "  budget:+" + p.offload_target + ":  from " + bytes_both(*p.offload_smallest) +
            " (kept values may live in the target: written at " +
            memory::format_bytes(p.price.write_bytes_per_second) + "/s, read at " +
            memory::format_bytes(p.price.read_bytes_per_second) + "/s, " + p.priced_as +
            (p.in_full ? ", charged in full" : "") + ")\n";
  if (p.dynamic_range)
    text += "  dynamic: from " + bytes_both(p.dynamic_range->smallest_budget_bytes) + ", save-all's peak " +
            bytes_both(p.dynamic_range->save_all_peak_bytes) + " (" + std::to_string(p.dynamic_range->runs) +
            " profiling runs)\n";
  else
    text += "  dynamic: needs a model to run (not --costs)\n";
  return text;
}

nlohmann::json feasible_json(const ModelProfile& p) {
  nlohmann::json j = nlohmann::json::object();
  if (p.budget_range)
    j["budget"] = {{"smallest_bytes", p.budget_range->smallest_budget_bytes},
                   {"save_all_peak_bytes", p.budget_range->save_all_peak_bytes}};
  if (p.offload_smallest)
    j["budget_offload"] = {{"target", p.offload_target},
                           {"smallest_bytes", *p.offload_smallest},
                           {"write_bytes_per_second", p.price.write_bytes_per_second},
                           {"read_bytes_per_second", p.price.read_bytes_per_second},
                           {"priced_as", p.priced_as},
                           {"charged_in_full", p.in_full}};
  if (p.dynamic_range)
    j["dynamic"] = {{"smallest_bytes", p.dynamic_range->smallest_budget_bytes},
                    {"save_all_peak_bytes", p.dynamic_range->save_all_peak_bytes},
                    {"profiling_runs", p.dynamic_range->runs}};
  return j;
}

// The segment counts to compare: all of them for short chains, about 200 spread ones for long.
std::vector<int> segment_counts(int stages) {
  std::vector<int> counts;
  if (stages <= 2000) {
    for (int k = 1; k <= stages; ++k) counts.push_back(k);
    return counts;
  }
  for (double k = 1; k <= stages; k = std::max(k + 1, k * 1.05)) counts.push_back(static_cast<int>(k));
  if (counts.back() != stages) counts.push_back(stages);
  return counts;
}

}  // namespace

namespace {

// The plans `remat plan` compares at one budget.
struct Plans {
  rs::Plan best, every_layer, save_all, uniform;
  int uniform_segments = 0;
  rs::RotorMethod method = rs::RotorMethod::exact;
  std::string planner;
};

Plans make_plans(const ModelProfile& profile, size_t budget, const std::string& offload) {
  const rs::ChainCosts& costs = profile.costs;
  const size_t outside = profile.outside;
  const int stages = costs.num_stages();
  const size_t limit = budget > outside ? budget - outside : 0;
  Plans plans;
  const std::optional<size_t> smallest =
      profile.offload_smallest ? profile.offload_smallest
                               : (profile.budget_range ? std::optional(profile.budget_range->smallest_budget_bytes) : std::nullopt);
  const auto below = [&](size_t least) {
    return Error(detail::concat("plan: budget ", budget, " bytes (", memory::format_bytes(static_cast<double>(budget)),
                                ") is below the smallest feasible budget, ", least, " bytes (",
                                memory::format_bytes(static_cast<double>(least)), ")"));
  };
  if (smallest && budget < *smallest) throw below(*smallest);
  if (profile.model_planner) {  // a model: the plan its budget policy would run, made by the library
    Policy policy = Policy::budget(budget);
    if (!offload.empty()) policy = policy.with_offload(OffloadTarget{offload});
    const std::optional<BudgetPlanner::Report> report = profile.model_planner->plan_for(policy);
    REMAT_CHECK(report.has_value(), "plan: the model's profile is not complete");
    plans.best = report->plan;
    plans.method = report->method;
    plans.planner = report->planner;
  } else {  // a --costs chain: the chain planner's plan
    try {
      rs::ChainPlan chosen = profile.planner->plan(limit);
      plans.best = std::move(chosen.plan);
      plans.method = chosen.method;
      plans.planner = chosen.describe();
    } catch (const rs::InfeasibleError& e) {
      throw below(e.min_feasible_bytes + outside);
    }
  }
  plans.every_layer = rs::plan_every_layer(costs);
  plans.save_all = rs::plan_save_all(costs);
  // uniform segments: the fastest segment count that fits, else the one with the least peak
  std::optional<rs::Plan> uniform;
  for (int k : segment_counts(stages)) {
    rs::Plan p = rs::plan_uniform_segments(costs, k);
    bool fits = p.predicted_peak_bytes <= limit;
    bool better = !uniform || (fits && (uniform->predicted_peak_bytes > limit || p.predicted_time < uniform->predicted_time)) ||
                  (!fits && uniform->predicted_peak_bytes > limit && p.predicted_peak_bytes < uniform->predicted_peak_bytes);
    if (better) {
      uniform = p;
      plans.uniform_segments = k;
    }
  }
  plans.uniform = *uniform;
  return plans;
}

void print_plans_json(const ModelProfile& profile, const Plans& plans, size_t budget) {
  const size_t outside = profile.outside;
  const std::vector<StageDecision> decisions = stage_decisions(profile.costs, plans.best, profile.flops);
  const std::vector<ValueDecision> values = value_decisions(decisions, profile.labels);
  nlohmann::json j = {{"version", REMAT_VERSION},
                      {"budget_bytes", budget},
                      {"outside_bytes", outside},
                      {"after_chain_bytes", profile.after_chain},
                      {"stages", profile.costs.num_stages()},
                      {"planner", plans.planner},
                      {"plan", plan_json("budget", plans.best, outside, budget)},
                      {"actions", rs::format_actions(plans.best.actions)},
                      {"plan_stages", decisions_json(decisions, profile.labels)},
                      {"plan_values", values_json(values)},
                      {"plan_values_total", totals_json(value_totals(values))},
                      {"uniform_segments", plan_json("uniform:" + std::to_string(plans.uniform_segments), plans.uniform,
                                                     outside, budget)},
                      {"every_layer", plan_json("every-layer", plans.every_layer, outside, budget)},
                      {"save_all", plan_json("save-all", plans.save_all, outside, budget)},
                      {"feasible", feasible_json(profile)},
                      {"predicted_peak_bytes", plans.best.predicted_peak_bytes + outside},
                      {"predicted_seconds", plans.best.predicted_time}};
  std::printf("%s\n", j.dump().c_str());
}

// The header, the feasible range and the stages' costs (all `remat plan` prints without --budget).
void print_profile_text(const ModelProfile& profile, std::optional<size_t> budget) {
  const rs::ChainCosts& costs = profile.costs;
  const size_t outside = profile.outside;
  std::printf("remat plan: %d stages%s%s%s%s\n", costs.num_stages(), budget ? ", budget " : "",
              budget ? memory::format_bytes(static_cast<double>(*budget)).c_str() : "",
              outside ? (", " + memory::format_bytes(static_cast<double>(outside)) + " saved before the chain").c_str() : "",
              profile.after_chain ? (", " + memory::format_bytes(static_cast<double>(profile.after_chain)) +
                                     " saved after the chain until its backward (counted with its output)").c_str()
                                  : "");
  std::printf("%s", feasible_text(profile).c_str());
  for (int i = 0; i < costs.num_stages(); ++i) {
    const size_t at = static_cast<size_t>(i);
    const std::string streamed = costs.streamed(at) < costs.saved_bytes[at]  // Note [a streamed record]
                                     ? ", " + memory::format_bytes(static_cast<double>(costs.streamed(at))) + " at once offloaded"
                                     : "";
    std::printf("  stage %2d: forward %.4f s, backward %.4f s, input %s, saves %s%s\n", i, costs.forward_time[i],
                costs.backward_time[i], memory::format_bytes(static_cast<double>(costs.boundary_bytes[i])).c_str(),
                memory::format_bytes(static_cast<double>(costs.saved_bytes[i])).c_str(), streamed.c_str());
  }
}

void print_plans_text(const ModelProfile& profile, const Plans& plans, size_t budget) {
  print_profile_text(profile, budget);
  const rs::Plan& best = plans.best;
  std::printf("planner: %s%s\n", plans.planner.c_str(),
              plans.method == rs::RotorMethod::grouped ? " (the exact programme is too slow for this chain; docs/planners.md)" : "");
  std::printf("plan (S = stage run with recording, R[a..b](...) = region re-run in the backward pass):\n  %s\n",
              rs::format_tree(best.tree).c_str());
  std::printf("%s", describe(best.tree).c_str());
  std::printf("per value (each stage's input boundary and record): its bytes, kept, offloaded or recomputed, and the "
              "forward re-runs that make it again in the backward pass (FLOPs, measured forward time):\n%s",
              values_text(value_decisions(stage_decisions(profile.costs, best, profile.flops), profile.labels)).c_str());
  std::printf("actions (Fn i / Fa i = stage i's forward without / with recording, L = the loss, B i = stage i's "
              "backward, D i = free boundary value i):\n  %s\n",
              rs::format_actions(best.actions).c_str());
  std::printf("\n%-22s %20s %14s %6s\n", "plan", "predicted peak", "predicted s", "fits");
  auto row = [&](const std::string& name, const rs::Plan& p) {
    size_t peak = p.predicted_peak_bytes + profile.outside;
    std::printf("%-22s %20s %14.4f %6s\n", name.c_str(), memory::format_bytes(static_cast<double>(peak)).c_str(),
                p.predicted_time, peak <= budget ? "yes" : "no");
  };
  row("budget (rotor)", best);
  row("uniform, " + std::to_string(plans.uniform_segments) + " segments", plans.uniform);
  row("every-layer", plans.every_layer);
  row("save-all", plans.save_all);
}

}  // namespace

int run_plan(const PlanOptions& o) {
  if (o.train.threads > 0) set_num_threads(o.train.threads);
  REMAT_USAGE_CHECK(o.costs.empty() || !o.train.architecture_given, "plan: --layers, --width, --heads and --seq describe a "
              "model to profile; they cannot be combined with --costs");
  std::optional<size_t> budget;  // checked before anything is profiled
  if (!o.budget.empty()) budget = parse_bytes_option("plan --budget", o.budget);
  ModelProfile profile;
  if (!o.costs.empty()) {
    profile.costs = read_costs(o.costs);
    REMAT_USAGE_CHECK(!profile.costs.can_offload() || !o.offload.empty(), "plan: --costs ", o.costs,
                      " gives an offload target's costs (offload_write_seconds_per_byte, offload_read_seconds_per_byte); "
                      "name the target with --offload DIR");
    rs::ChainPlanOptions least;
    least.progress = planning_progress("remat plan: the smallest feasible budget of " +
                                       std::to_string(profile.costs.num_stages()) + " stages");
    rs::ChainCosts in_memory = profile.costs;  // the first minimum: without the offload target
    in_memory.offload_seconds_per_byte = -1;
    in_memory.offload_write_seconds_per_byte = 0;
    profile.planner = std::make_shared<const rs::ChainPlanner>(in_memory, least);
    profile.budget_range = BudgetPlanner::FeasibleRange{profile.planner->smallest_limit(),
                                                        rs::plan_save_all(in_memory).predicted_peak_bytes};
    least.progress(-1);
  } else {
    profile = profile_model(o);
  }
  if (!o.offload.empty()) {  // the same chain with its kept values allowed in the target
    profile.offload_target = OffloadTarget{o.offload}.to_string();
    if (profile.costs.can_offload()) {  // the --costs file's costs of the target
      profile.price.write_bytes_per_second = 1.0 / profile.costs.offload_write_seconds_per_byte;
      profile.price.read_bytes_per_second =
          1.0 / (profile.costs.offload_seconds_per_byte - profile.costs.offload_write_seconds_per_byte);
      profile.priced_as = "the costs file";
      profile.costs.reads_ahead = true;  // as budget plans read back (Note [reads ahead within the peak])
    } else {  // as a budget plan of the profile's CPU step prices it
      const OffloadCharge charge = charge_offload(o.offload, Device{}, profile.costs);
      profile.price = charge.price;
      profile.priced_as = charge.price.page_cache ? "page cache" : "disk";
      profile.in_full = charge.in_full;
    }
    rs::ChainPlanOptions least;
    least.progress = planning_progress("remat plan: planning " + std::to_string(profile.costs.num_stages()) +
                                       " stages with offload");
    // as a budget plan with the target is made: with it, and below its smallest budget in memory
    rs::ChainPlanner with_target(profile.costs, profile.held.value_or(profile.costs), least);
    profile.offload_smallest = with_target.smallest_limit() + profile.outside;
    least.progress(-1);
    if (!profile.model_planner) profile.planner = std::make_shared<const rs::ChainPlanner>(std::move(with_target));
  }
  if (!budget) {  // the feasible range alone
    if (o.train.json)
      std::printf("%s\n", nlohmann::json{{"version", REMAT_VERSION},
                                         {"stages", profile.costs.num_stages()},
                                         {"outside_bytes", profile.outside},
                                         {"after_chain_bytes", profile.after_chain},
                                         {"feasible", feasible_json(profile)}}.dump().c_str());
    else
      print_profile_text(profile, std::nullopt);
    return 0;
  }
  const Plans plans = make_plans(profile, *budget, o.offload);
  if (o.train.json)
    print_plans_json(profile, plans, *budget);
  else
    print_plans_text(profile, plans, *budget);
  return 0;
}

}  // namespace remat::tools
