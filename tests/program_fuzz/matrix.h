// The policy matrix: a program body run under save-all and then under every policy and
// composition of the acceptance list, each run classified against save-all's.
//
//   MatrixResult m = run_matrix([](Recorder& rec) { ...the program, under the scoped policy... });
//   for (const PairResult& p : m.pairs) EXPECT_EQ(p.verdict.kind, Verdict::ok) << describe(p);
//
// The body runs every step of its program under the policy in force (a ScopedPolicy the matrix
// sets), records what it reaches through the Recorder and may throw: the first exception ends
// the run. Budgets are sized from save-all's run: the budget:large run (save-all's measured peak
// of saved bytes) profiles the model, whose planner's feasible range then gives budget:small (the
// smallest feasible budget) and budget:medium (half way); dynamic:B gets half of save-all's peak.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "classify.h"
#include "observe.h"

namespace remat::program_fuzz {

using Body = std::function<void(Recorder&)>;

// The policies of the acceptance list, by name: "every-layer", "every-k:2", "every-k:3",
// "selective:matmul", "budget:small", "budget:medium", "budget:large", "budget:auto", "dynamic",
// "offload", "every-layer+offload", "budget+offload", "every-k:2+offload".
const std::vector<std::string>& policy_names();

struct Sizes {
  size_t small = 0, medium = 0, large = 0, dynamic = 0;
};
// The policy text for a name of policy_names() (or any policy text, returned as it is), with the
// budgets of `sizes` and the offload directory `dir` (threshold=0: the fuzzer's tensors are tiny).
std::string policy_text(const std::string& name, const Sizes& sizes, const std::string& dir);
bool is_budget_policy(const std::string& name);

// Runs `body` under one policy text, with its warnings, the budget check's memory and the first
// exception recorded.
Record run_under(const std::string& policy_text, const Body& body);

struct PairResult {
  std::string policy;  // the name
  std::string text;    // what ran
  Verdict verdict;
  Record record;
};
struct MatrixResult {
  Record save_all;
  Sizes sizes;
  std::vector<PairResult> pairs;
};
struct MatrixOptions {
  std::vector<std::string> policies = policy_names();
  std::vector<Rule> broken_rules;  // the rules the program breaks knowingly
  std::string offload_dir;         // "" : a temporary directory made once per process
  // Called before each run (save-all's too) and after each pair (the fuzzer's runner streams
  // results through them, so that a crash is known to belong to the pair that was running).
  std::function<void(const std::string& name)> on_start;
  std::function<void(const PairResult&)> on_pair;
};
MatrixResult run_matrix(const Body& body, const MatrixOptions& options = {});

// A scratch directory for offload: targets, made once per process and removed at exit.
const std::string& scratch_directory();

// One line per pair that is not ok, for a test's failure message.
std::string describe(const PairResult& pair);

}  // namespace remat::program_fuzz
