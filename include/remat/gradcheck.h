// remat/gradcheck.h - check a function's gradient against float64 central differences.
//
// For people who write custom ops (remat::CustomOp) or compose their own functions: gradcheck
// runs `f` in float64, back-propagates a fixed random weighting of its output through the tape,
// and compares every input element's gradient with a central difference of the same weighted
// output. The result names the worst element.
//
//   using namespace remat;
//   Tensor x = randn({3, 4}, DType::f64, RngState{1, 0});
//   GradcheckResult r = gradcheck([](const TensorList& in) { return my_op({in[0]})[0]; }, {x});
//   if (!r.ok) std::fprintf(stderr, "%s\n", r.report.c_str());
//   // or: gradcheck(f, {x}, {.throw_on_failure = true});  throws remat::Error with the report
//
// How it works. Floating inputs are copied to float64 leaves (the caller's tensors are never
// touched); i64 inputs (indices) are passed through unchanged and not checked. With
// L(x) = sum(w * f(x)), w a fixed random tensor in [0.5, 1.5) (seeded), the analytic gradient
// dL/dx comes from one backward pass and the numeric one from (L(x + h e_i) - L(x - h e_i)) / 2h,
// evaluated without recording, for every element i of every checked input. An element passes when
//   |analytic - numeric| <= atol + rtol * |numeric|.
// A gradient the backward leaves undefined counts as zero. A random weighting catches a wrong
// gradient in any output element (unless errors cancel exactly, which a random w makes unlikely)
// at the cost of one backward pass instead of one per output element.
//
// Cost: 2 evaluations of f per checked input element; use small inputs. `f` must return a defined
// floating tensor; it is called several times and must be deterministic (no fresh random numbers
// per call: pass a fixed seed). An input that is undefined, or an f that throws, is reported as a
// remat::Error.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "remat/tensor.h"

namespace remat {

struct GradcheckOptions {
  double eps = 1e-6;    // step h of the central differences
  double atol = 1e-5;   // absolute tolerance
  double rtol = 1e-3;   // relative tolerance (of |numeric|)
  uint64_t seed = 0;    // seed of the output weighting w
  bool throw_on_failure = false;  // throw remat::Error(report) instead of returning ok = false
};

struct GradcheckResult {
  bool ok = true;
  int64_t checked = 0;  // input elements compared
  // The element with the largest |analytic - numeric| / (atol + rtol |numeric|) (the first one
  // checked if none differs): its input, its index in that input, both gradients and the error.
  size_t input = 0;
  std::vector<int64_t> index;
  double analytic = 0, numeric = 0, abs_error = 0;
  // One line when ok ("gradcheck: ok, 24 elements of 1 input, worst |analytic - numeric| = ...");
  // otherwise names the failing count and the worst element with both values.
  std::string report;
};

GradcheckResult gradcheck(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
                          const GradcheckOptions& options = {});

}  // namespace remat
