// gradcheck: the tape's gradient of sum(w * f(x)) against float64 central differences.
#include "remat/gradcheck.h"

#include <cmath>
#include <cstdio>

#include "autodiff/state.h"
#include "remat/autodiff.h"
#include "remat/ops.h"
#include "remat/random.h"

namespace remat {

namespace {

std::string number(double v) {
  char buffer[40];
  std::snprintf(buffer, sizeof buffer, "%.9g", v);
  return buffer;
}

std::string index_str(const std::vector<int64_t>& index) {
  std::string s = "[";
  for (size_t i = 0; i < index.size(); ++i) s += (i ? ", " : "") + std::to_string(index[i]);
  return s + "]";
}

std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return index;
}

// f(inputs), checked to be a defined floating tensor, as f64; f's errors name gradcheck.
Tensor evaluate(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs, const char* pass) {
  Tensor out;
  try {
    out = f(inputs);
  } catch (const Error& e) {
    throw Error(detail::concat("gradcheck: f threw during the ", pass, ": ", e.what()));
  }
  REMAT_CHECK(out.defined(), "gradcheck: f returned an undefined tensor");
  REMAT_CHECK(is_floating(out.dtype()), "gradcheck: f returned a tensor of dtype ", dtype_name(out.dtype()),
              "; it must return f32 or f64");
  return out.to(DType::f64);
}

void check_arguments(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
                     const GradcheckOptions& options) {
  REMAT_CHECK(static_cast<bool>(f), "gradcheck: f is empty");
  REMAT_CHECK(std::isfinite(options.eps) && options.eps > 0, "gradcheck: eps must be finite and > 0, got ",
              options.eps);
  REMAT_CHECK(std::isfinite(options.atol) && options.atol >= 0, "gradcheck: atol must be finite and >= 0, got ",
              options.atol);
  REMAT_CHECK(std::isfinite(options.rtol) && options.rtol >= 0, "gradcheck: rtol must be finite and >= 0, got ",
              options.rtol);
  bool any_floating = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    REMAT_CHECK(inputs[i].defined(), "gradcheck: input ", i, " is undefined");
    any_floating = any_floating || is_floating(inputs[i].dtype());
  }
  REMAT_CHECK(any_floating, "gradcheck: no f32 or f64 input to check");
}

// Working copies: float64 for the floating inputs (`work` for the numeric pass, `leaves` for the
// analytic one), the caller's tensor for the others.
struct WorkingCopies {
  TensorList work, leaves;
  std::vector<size_t> checked_inputs;  // the floating inputs
};

WorkingCopies working_copies(const TensorList& inputs) {
  WorkingCopies c;
  c.work.resize(inputs.size());
  c.leaves.resize(inputs.size());
  NoGradGuard no_grad;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!is_floating(inputs[i].dtype())) {
      c.work[i] = c.leaves[i] = inputs[i].detach();
      continue;
    }
    c.work[i] = inputs[i].detach().to(DType::f64).clone();
    c.leaves[i] = c.work[i].clone();
    c.checked_inputs.push_back(i);
  }
  return c;
}

// The analytic pass: d sum(w * f(x)) / dx by the tape, for random weights w in [0.5, 1.5).
struct Analytic {
  TensorList grads;  // per checked input; undefined: zero (f does not depend on that input)
  std::vector<double> weights;
  Shape out_shape;
};

Analytic analytic_pass(const std::function<Tensor(const TensorList&)>& f, WorkingCopies& c, uint64_t seed) {
  Analytic a;
  Tensor weights;
  {
    EnableGradGuard grad_on;
    TensorList grad_inputs;
    for (size_t i : c.checked_inputs) {
      c.leaves[i].requires_grad_();
      grad_inputs.push_back(c.leaves[i]);
    }
    Tensor out = evaluate(f, c.leaves, "analytic pass");
    a.out_shape = out.shape();
    weights = rand(a.out_shape, DType::f64, RngState{seed, 0}, 0.5, 1.5);
    a.grads.resize(grad_inputs.size());
    if (out.requires_grad()) {
      try {
        a.grads = grad({out}, grad_inputs, {weights});
      } catch (const Error& e) {
        throw Error(detail::concat("gradcheck: the backward pass threw: ", e.what()));
      }
    }
  }
  a.weights = weights.to_vector();
  return a;
}

// sum(w * out) for an output of the numeric pass.
double weighted_sum(const Analytic& a, const Tensor& out) {
  REMAT_CHECK(out.shape() == a.out_shape, "gradcheck: f returned shape ", shape_str(out.shape()),
              " in the numeric pass but ", shape_str(a.out_shape), " in the analytic pass (is f deterministic?)");
  std::vector<double> v = out.to_vector();
  double total = 0;
  for (size_t k = 0; k < v.size(); ++k) total += a.weights[k] * v[k];
  return total;
}

// The comparison so far: the result's worst element, and how many failed.
struct Comparison {
  GradcheckResult result;
  double worst_ratio = -1;
  int64_t failing = 0;
};

// Element k of input i: the analytic against the numeric gradient.
void compare(Comparison& c, const GradcheckOptions& options, size_t i, int64_t k, const Shape& shape,
             double analytic_k, double numeric) {
  double error = std::fabs(analytic_k - numeric);
  double allowed = options.atol + options.rtol * std::fabs(numeric);
  // NaN on either side fails
  bool pass = error <= allowed;
  double ratio = allowed > 0 ? error / allowed : (error > 0 ? HUGE_VAL : 0.0);
  if (!pass) {
    ++c.failing;
    if (!std::isfinite(ratio)) ratio = HUGE_VAL;
  }
  GradcheckResult& result = c.result;
  ++result.checked;
  if (ratio > c.worst_ratio) {
    c.worst_ratio = ratio;
    result.input = i;
    result.index = unravel(k, shape);
    result.analytic = analytic_k;
    result.numeric = numeric;
    result.abs_error = error;
  }
}

// The numeric pass: central differences, one element at a time, without recording, each compared
// with the analytic gradient.
Comparison numeric_pass(const std::function<Tensor(const TensorList&)>& f, WorkingCopies& copies,
                        const Analytic& analytic, const GradcheckOptions& options) {
  Comparison comparison;
  NoGradGuard no_grad;
  for (size_t c = 0; c < copies.checked_inputs.size(); ++c) {
    size_t i = copies.checked_inputs[c];
    Tensor& x = copies.work[i];
    double* p = x.contiguous_data<double>();
    std::vector<double> a = analytic.grads[c].defined() ? analytic.grads[c].to(DType::f64).to_vector()
                                                        : std::vector<double>(static_cast<size_t>(x.numel()), 0.0);
    for (int64_t k = 0; k < x.numel(); ++k) {
      const double original = p[k];
      p[k] = original + options.eps;
      x.storage()->bump_version();
      double plus = weighted_sum(analytic, evaluate(f, copies.work, "numeric pass"));
      p[k] = original - options.eps;
      x.storage()->bump_version();
      double minus = weighted_sum(analytic, evaluate(f, copies.work, "numeric pass"));
      p[k] = original;
      x.storage()->bump_version();
      double numeric = (plus - minus) / (2 * options.eps);
      compare(comparison, options, i, k, x.shape(), a[static_cast<size_t>(k)], numeric);
    }
  }
  return comparison;
}

// The result's ok and report (and, when asked, the failure thrown).
void finish(GradcheckResult& result, int64_t failing, size_t checked_inputs, const GradcheckOptions& options) {
  result.ok = failing == 0;
  std::string worst = "input " + std::to_string(result.input) + " " + index_str(result.index) + ": analytic " +
                      number(result.analytic) + ", numeric " + number(result.numeric) + ", |diff| " +
                      number(result.abs_error);
  if (result.ok) {
    result.report = "gradcheck: ok, " + std::to_string(result.checked) + " elements of " +
                    std::to_string(checked_inputs) + " input(s) within atol " + number(options.atol) +
                    " + rtol " + number(options.rtol) + " * |numeric|; worst " + worst;
  } else {
    result.report = "gradcheck: " + std::to_string(failing) + " of " + std::to_string(result.checked) +
                    " elements differ beyond atol " + number(options.atol) + " + rtol " + number(options.rtol) +
                    " * |numeric|; worst " + worst;
    if (options.throw_on_failure) throw Error(result.report);
  }
}

}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
                          const GradcheckOptions& options) {
  check_arguments(f, inputs, options);
  WorkingCopies copies = working_copies(inputs);

  // gradcheck asks for no recomputation: its backward passes never warn that none happened
  struct Quiet {
    Quiet() { ++autodiff::thread_state().quiet_backward; }
    ~Quiet() { --autodiff::thread_state().quiet_backward; }
  } quiet;

  const Analytic analytic = analytic_pass(f, copies, options.seed);
  Comparison comparison = numeric_pass(f, copies, analytic, options);
  finish(comparison.result, comparison.failing, copies.checked_inputs.size(), options);
  return comparison.result;
}

}  // namespace remat
