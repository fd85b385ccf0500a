// Running a program (program.h): its model built from the spec, trained for the driver's steps,
// with everything the program can reach recorded (observe.h).
//
//   Program program = generate(source);
//   MatrixResult m = run_program_matrix(program, policy_names());   // save-all, then each policy
//
// A run builds the model afresh from the program (same seed, same weights), trains it for the
// driver's steps under the policy in force, and records as observations: the loss, each returned
// value and each stashed value (bits, requires_grad, whether it has a grad_fn) before and after
// the backward pass, the stashes' count, every parameter's gradient, the results of remat::grad,
// buffers, side-effect counters, and the parameters after the optimizer. The first exception
// ends the run and is recorded with the step and phase it came from.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "matrix.h"
#include "program.h"

namespace remat::program_fuzz {

struct BodyOptions {
  bool perturb = false;  // self-test: one ulp added to the first gradient of the first step
};

// The program as a body for the policy matrix.
Body program_body(const Program& program, const BodyOptions& options = {});

// `options.broken_rules` is set from the program.
MatrixResult run_program_matrix(const Program& program, MatrixOptions options, const BodyOptions& body = {});
MatrixResult run_program_matrix(const Program& program, const std::vector<std::string>& policies);

}  // namespace remat::program_fuzz
