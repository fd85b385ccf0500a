// Shrinking a failing program: statements dropped, children replaced by plain layers or dropped,
// the driver simplified (fewer steps, no optimizer, plain backward, f32), width lowered, as long
// as the (program, policy) pair keeps its verdict. The result prints with to_pseudo_code.
//
//   MinimiseResult r = minimise(program, "every-k:2", failure.verdict);
//   std::cout << to_pseudo_code(r.program) << r.verdict.detail;
#pragma once

#include <functional>
#include <string>

#include "classify.h"
#include "program.h"

namespace remat::program_fuzz {

struct MinimiseResult {
  Program program;
  Verdict verdict;  // of the shrunk program
  int runs = 0;     // candidate programs tried
};

// A candidate is kept when its verdict has the cause of `target` (cause_of, classify.h).
// `max_runs` bounds the candidates tried (each runs save-all and the policy, and budget:large
// first for the budgets it sizes).
MinimiseResult minimise(const Program& program, const std::string& policy, const Verdict& target, int max_runs = 1500);

// The same with any judge of a program (the minimiser's own test uses one).
using Judge = std::function<Verdict(const Program&)>;
MinimiseResult minimise_with(const Judge& judge, const Program& program, const Verdict& target, int max_runs = 1500);

// The verdict of one pair (with the runs it needs: save-all, and budget:large for the sizes).
Verdict verdict_of(const Program& program, const std::string& policy);

}  // namespace remat::program_fuzz
