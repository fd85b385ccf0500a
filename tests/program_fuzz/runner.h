// Running many programs under many policies and counting the verdicts.
//
//   FuzzOptions o;
//   o.first_seed = 0, o.last_seed = 159;           // 160 programs
//   Tally t = fuzz(o);                              // each under every policy of policy_names()
//   std::cout << summary_table(t);
//
// With `fork` (the default), programs run in a child process, so a signal (a use-after-free, an
// abort) is counted as a crash of the pair that was running and the run goes on with the next
// program in a new child; a pair running past `timeout_seconds` counts as a crash too. The parent
// runs no tensor code (a child forked from a process that ran OpenMP work could hang).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "classify.h"

namespace remat::program_fuzz {

struct Failure {
  uint64_t seed = 0;
  std::string policy;  // the name
  Verdict verdict;
};

struct Tally {
  uint64_t programs = 0, pairs = 0;
  std::map<std::string, std::array<uint64_t, kVerdictCount>> by_policy;  // counts per verdict
  std::map<std::string, uint64_t> refusals_by_rule;
  std::vector<Failure> failures;  // every pair that is not ok or refused
  double seconds = 0;
  uint64_t count(VerdictKind kind) const;
  uint64_t failed() const;  // wrong + missing + extra + crash + budget
};

struct FuzzOptions {
  uint64_t first_seed = 0, last_seed = 0;  // inclusive
  std::vector<std::string> policies;       // empty: policy_names()
  bool fork = true;
  int timeout_seconds = 120;               // per program (all its policies)
  std::function<void(const Failure&)> on_failure;  // as each failure comes in
};

Tally fuzz(const FuzzOptions& options);

// A failure's likely cause (classify.h), for grouping.
std::string cause_of(const Failure& failure);
std::string summary_table(const Tally& tally);

}  // namespace remat::program_fuzz
