// The program fuzzer's ctest: the instrument's self-tests (a one-ulp gradient difference is
// caught, the classes are told apart, the minimiser shrinks, the generator covers the issue's
// constructs), then a fixed set of seeds under every policy of the acceptance list, which must
// give 0 wrong, 0 missing errors, 0 extra errors, 0 crashes and 0 silent budget passes.
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <set>

#include "minimise.h"
#include "run.h"
#include "runner.h"

using namespace remat::program_fuzz;

namespace {

// The fixed seeds of the ctest: 320 programs under the 13 policies (4,160 pairs).
constexpr uint64_t kFixedSeeds = 320;

// The smallest model: a root calling one layer, linear then tanh.
Program tiny_program() {
  Program p;
  p.seed = 5;
  p.width = 3;
  ModuleSpec root;
  root.children = {1};
  Stmt call;
  call.op = Op::call, call.child = 0, call.args = {0};
  root.body = {call};
  root.returns = {1};
  ModuleSpec layer;
  Stmt lin;
  lin.op = Op::linear, lin.module = 1, lin.args = {0};
  Stmt t;
  t.op = Op::unary, t.kind = static_cast<int>(Unary::tanh), t.args = {1};
  layer.body = {lin, t};
  layer.returns = {2};
  p.modules = {root, layer};
  p.driver.steps = 1;
  p.driver.batch = {3};
  p.driver.data_seed = 11;
  EXPECT_TRUE(check(p));
  return p;
}

Record record_with(std::vector<Observation> obs) {
  Record r;
  r.obs = std::move(obs);
  return r;
}

ErrorRecord error_at(int step, const std::string& phase, int seq, const std::string& message,
                     const std::string& type = "remat::Error") {
  return ErrorRecord{step, phase, seq, type, message};
}

}  // namespace

TEST(ProgramFuzzSelfTest, APerturbedGradientIsClassifiedWrong) {
  const Program p = tiny_program();
  const MatrixResult clean = run_program_matrix(p, {"every-layer"});
  ASSERT_EQ(clean.pairs.size(), 1u);
  EXPECT_EQ(clean.pairs[0].verdict.kind, VerdictKind::ok) << describe(clean.pairs[0]);
  MatrixOptions o;
  o.policies = {"every-layer"};
  BodyOptions perturb;
  perturb.perturb = true;
  const MatrixResult nudged = run_program_matrix(p, o, perturb);
  ASSERT_EQ(nudged.pairs.size(), 1u);
  EXPECT_EQ(nudged.pairs[0].verdict.kind, VerdictKind::wrong) << describe(nudged.pairs[0]);
  EXPECT_NE(nudged.pairs[0].verdict.detail.find(".grad."), std::string::npos) << nudged.pairs[0].verdict.detail;
}

TEST(ProgramFuzzSelfTest, TheClassesAreToldApart) {
  const Observation a{"s0.loss", "bits-a", "1"}, b{"s0.loss", "bits-b", "2"};
  ClassifyContext none;
  EXPECT_EQ(classify(record_with({a}), record_with({a}), none).kind, VerdictKind::ok);
  EXPECT_EQ(classify(record_with({a}), record_with({b}), none).kind, VerdictKind::wrong);
  EXPECT_EQ(classify(record_with({a}), record_with({a, a}), none).kind, VerdictKind::wrong);

  Record raised = record_with({a});
  raised.error = error_at(0, "backward", 3, "backward: a tensor saved for the backward pass was modified in place");
  EXPECT_EQ(classify(raised, record_with({a}), none).kind, VerdictKind::missing_error);
  EXPECT_EQ(classify(raised, raised, none).kind, VerdictKind::ok);
  Record later = record_with({a, a});
  later.error = error_at(0, "optimizer", 5, "backward: modified in place");
  EXPECT_EQ(classify(raised, later, none).kind, VerdictKind::missing_error);
  Record other_kind = raised;
  other_kind.error->message = "backward: the graph ... already freed";
  EXPECT_EQ(classify(raised, other_kind, none).kind, VerdictKind::wrong);

  // A refusal counts only naming a rule the program breaks.
  Record refused = record_with({a});
  refused.error = error_at(0, "backward", 3, "checkpoint segment 'c0', op custom:x: ... is not a pure function of its inputs");
  EXPECT_EQ(classify(record_with({a}), refused, none).kind, VerdictKind::extra_error);
  ClassifyContext breaks;
  breaks.broken_rules = {Rule::deterministic};
  const Verdict v = classify(record_with({a}), refused, breaks);
  EXPECT_EQ(v.kind, VerdictKind::refused);
  EXPECT_EQ(v.rule, "deterministic");
  Record infeasible = record_with({});
  infeasible.error = error_at(0, "forward", 2, "budget:10 is below the smallest feasible budget for M0");
  EXPECT_EQ(classify(record_with({a}), infeasible, none).kind, VerdictKind::extra_error);
  ClassifyContext budget;
  budget.budget_policy = true;
  EXPECT_EQ(classify(record_with({a}), infeasible, budget).kind, VerdictKind::refused);

  // Crashes: internal errors and other exception types.
  Record internal = record_with({a});
  internal.error = error_at(0, "backward", 3, "internal error at src/x.cpp:1: y failed");
  EXPECT_EQ(classify(record_with({a}), internal, none).kind, VerdictKind::crash);
  Record foreign = record_with({a});
  foreign.error = error_at(0, "backward", 3, "bad_alloc", "std::exception");
  EXPECT_EQ(classify(raised, foreign, none).kind, VerdictKind::crash);

  // Budgets: a pass is silent without a warning, without bytes_over_plan and without the budget counter.
  Record over = record_with({a});
  over.steps = {StepMemory{2, 5000, 0, false, 0, false}};
  ClassifyContext b1000;
  b1000.check_budget = true, b1000.fixed_budget = 1000;
  EXPECT_EQ(classify(record_with({a}), over, b1000).kind, VerdictKind::budget);
  over.steps[0].warned = true;
  EXPECT_EQ(classify(record_with({a}), over, b1000).kind, VerdictKind::ok);
  over.steps[0].warned = false, over.steps[0].bytes_over_plan = 4000;
  EXPECT_EQ(classify(record_with({a}), over, b1000).kind, VerdictKind::ok);
  over.steps[0].bytes_over_plan = 0, over.steps[0].budget_over = 4000;
  EXPECT_EQ(classify(record_with({a}), over, b1000).kind, VerdictKind::ok);
}

TEST(ProgramFuzzSelfTest, TheMinimiserShrinksToTheStatementThatMatters) {
  // A judge that calls a program wrong while it has a custom op anywhere it runs.
  auto has_custom = [](const Program& p) {
    for (int m : reachable_modules(p))
      for (const Stmt& s : p.modules[m].body)
        if (s.op == Op::custom) return true;
    return false;
  };
  const Judge judge = [&](const Program& p) {
    return has_custom(p) ? Verdict{VerdictKind::wrong, "", "custom"} : Verdict{VerdictKind::ok, "", ""};
  };
  Program start;
  bool found = false;
  for (uint64_t seed = 0; seed < 200 && !found; ++seed) {
    Source s = Source::from_seed(seed);
    start = generate(s, seed);
    size_t statements = 0;
    for (int m : reachable_modules(start)) statements += start.modules[m].body.size();
    found = has_custom(start) && statements >= 8;
  }
  ASSERT_TRUE(found);
  const MinimiseResult r = minimise_with(judge, start, Verdict{VerdictKind::wrong, "", "custom"});
  EXPECT_EQ(r.verdict.kind, VerdictKind::wrong);
  size_t statements = 0;
  for (int m : reachable_modules(r.program)) statements += r.program.modules[m].body.size();
  EXPECT_LE(statements, 2u) << to_pseudo_code(r.program);  // the custom op, and a call to reach it
  EXPECT_EQ(r.program.driver.steps, 1);
  EXPECT_NE(to_pseudo_code(r.program).find("cube"), std::string::npos);
}

TEST(ProgramFuzzSelfTest, TheGeneratorIsDeterministicAndCoversTheIssuesConstructs) {
  std::set<Op> ops;
  std::set<BackwardKind> backwards;
  bool depth3 = false, tying = false, shapes = false, bf16 = false, twice = false, optimizer = false, layer_role = false,
       sequential = false, returns_param = false, returns_view = false, returns_input = false, several_returns = false;
  for (uint64_t seed = 0; seed < kFixedSeeds; ++seed) {
    Source s1 = Source::from_seed(seed), s2 = Source::from_seed(seed);
    const Program p = generate(s1, seed);
    ASSERT_EQ(to_pseudo_code(p), to_pseudo_code(generate(s2, seed)));
    Program copy = p;
    ASSERT_TRUE(check(copy));
    for (int m : reachable_modules(p)) {
      const ModuleSpec& spec = p.modules[m];
      std::map<int, int> calls;
      for (const Stmt& s : spec.body) {
        ops.insert(s.op);
        if (s.op == Op::call) ++calls[s.child];
      }
      for (const auto& [child, n] : calls) twice |= n >= 2;
      for (int c : spec.children) depth3 |= m != 0 && !p.modules[c].body.empty();
      tying |= spec.tie_to >= 0;
      layer_role |= spec.role == Role::layer;
      sequential |= spec.kind == ModuleKind::sequential;
      several_returns |= spec.returns.size() > 1;
      if (m != 0 && spec.kind == ModuleKind::prog && !spec.returns.empty()) {
        const int r = spec.returns[0];
        returns_input |= r == 0;
        const int at = r - spec.n_in;
        if (at >= 0 && at < static_cast<int>(spec.body.size())) {
          returns_param |= spec.body[at].op == Op::param;
          returns_view |= spec.body[at].op == Op::view && spec.body[at].args[0] == 0;
        }
      }
    }
    backwards.insert(p.driver.backward);
    shapes |= std::set<int>(p.driver.batch.begin(), p.driver.batch.end()).size() > 1;
    bf16 |= p.driver.bf16;
    optimizer |= p.driver.optimizer > 0;
  }
  EXPECT_EQ(ops.size(), static_cast<size_t>(kOpCount));
  EXPECT_EQ(backwards.size(), 4u);
  EXPECT_TRUE(depth3 && tying && shapes && bf16 && twice && optimizer && layer_role && sequential);
  EXPECT_TRUE(returns_param && returns_view && returns_input && several_returns);
  // Bytes drive it too, and the empty input is the smallest program.
  Source empty = Source::from_bytes(nullptr, 0);
  Program tiny = generate(empty);
  EXPECT_TRUE(check(tiny));
}

// The instrument is deterministic: save-all run twice gives the same bits.
TEST(ProgramFuzzSelfTest, SaveAllRunTwiceIsOk) {
  FuzzOptions o;
  o.first_seed = 0, o.last_seed = 99;
  o.policies = {"save-all"};
  const Tally t = fuzz(o);
  EXPECT_EQ(t.count(VerdictKind::ok), 100u) << summary_table(t);
}

// The fixed seeds under the 13 policies of the acceptance list.
TEST(ProgramFuzz, FixedSeedsUnderEveryPolicyMatchSaveAll) {
  FuzzOptions o;
  o.first_seed = 0, o.last_seed = kFixedSeeds - 1;
  o.timeout_seconds = 120;
  const Tally t = fuzz(o);
  std::cout << summary_table(t);
  EXPECT_GE(t.pairs, 4000u);
  for (size_t i = 0; i < t.failures.size() && i < 40; ++i) {
    const Failure& f = t.failures[i];
    ADD_FAILURE() << "seed " << f.seed << ", " << f.policy << ": " << verdict_name(f.verdict.kind) << ": "
                  << f.verdict.detail << "  (remat_program_fuzz --seed " << f.seed << " --policies " << f.policy
                  << " --minimise 1)";
  }
  EXPECT_EQ(t.count(VerdictKind::wrong), 0u);
  EXPECT_EQ(t.count(VerdictKind::missing_error), 0u);
  EXPECT_EQ(t.count(VerdictKind::extra_error), 0u);
  EXPECT_EQ(t.count(VerdictKind::crash), 0u);
  EXPECT_EQ(t.count(VerdictKind::budget), 0u);
}
