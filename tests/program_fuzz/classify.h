// Classifying a run under a policy against the same program's run under save-all.
//
//   ok             the same observations bit for bit, and the same error at the same point (or none)
//   refused        the policy raised a remat::Error where save-all did not (or earlier), naming a
//                  rule of accepted_rules() that the program breaks (or, for a budget or dynamic:
//                  policy, a budget below the smallest feasible one)
//   wrong          an observation differs (bits, requires_grad, a grad_fn, a list's length), or
//                  both raised at the same point but errors of different kinds
//   missing error  save-all raised and the policy did not (or later)
//   extra error    the policy raised a remat::Error where save-all did not, naming no rule the
//                  program breaks (a false reason), or claiming that save-all raises
//   crash          an exception that is not a remat::Error, an internal error (REMAT_ASSERT), or a
//                  signal (the runner's forked child died)
//   budget         a budget policy whose measured peak of saved bytes passed its budget in a step
//                  with no warning naming the budget, no bytes_over_plan and nothing in
//                  counters().budget
#pragma once

#include <string>
#include <vector>

#include "observe.h"
#include "program.h"

namespace remat::program_fuzz {

enum class VerdictKind { ok, refused, wrong, missing_error, extra_error, crash, budget };
inline constexpr int kVerdictCount = 7;
const char* verdict_name(VerdictKind kind);  // "ok", "refused", "wrong", "missing error", ...

struct Verdict {
  VerdictKind kind = VerdictKind::ok;
  std::string rule;    // refused: the rule named
  std::string detail;  // what differed, the error, the budget pass
};

// The one list of accepted refusals: the rules a program can break, and the phrase a remat::Error
// must contain to name each. docs/checkpointing.md mirrors it. `program_rule` is false for the
// configuration's own error (a budget below the smallest feasible one), accepted for budget and
// dynamic: policies whatever the program.
struct AcceptedRule {
  const char* name;                  // "deterministic", ...
  bool program_rule;
  std::vector<Rule> rules;           // program_rule: a program breaking any of them may be refused so
  std::vector<const char*> phrases;  // any of them, case-sensitive
};
const std::vector<AcceptedRule>& accepted_rules();
const char* rule_name(Rule rule);

struct ClassifyContext {
  std::vector<Rule> broken_rules;
  bool budget_policy = false;   // budget:... or dynamic:... (an infeasible budget is a refusal)
  size_t fixed_budget = 0;      // budget:BYTES (0: budget:auto reads the plan's, or no budget)
  bool check_budget = false;    // compare the steps' peaks with the budget
};

Verdict classify(const Record& save_all, const Record& got, const ClassifyContext& context);

// A verdict's likely cause, for grouping failures and for the minimiser (which keeps a smaller
// program only if its cause is the same): the verdict and the shape of its detail (which value
// differed, with steps, indices and numbers taken out; the kind of error; profiling or planned).
std::string cause_of(const Verdict& verdict);

// The kind of an error message, for comparing two errors ("in place", "freed graph", ...).
std::string error_kind(const ErrorRecord& error);

}  // namespace remat::program_fuzz
