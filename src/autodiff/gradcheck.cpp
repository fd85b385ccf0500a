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

}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
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

  // Working copies: float64 for the floating inputs, the caller's tensor for the others.
  TensorList work(inputs.size()), leaves(inputs.size());
  std::vector<size_t> checked_inputs;
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!is_floating(inputs[i].dtype())) {
        work[i] = leaves[i] = inputs[i].detach();
        continue;
      }
      work[i] = inputs[i].detach().to(DType::f64).clone();
      leaves[i] = work[i].clone();
      checked_inputs.push_back(i);
    }
  }

  // gradcheck asks for no recomputation: its backward passes never warn that none happened
  struct Quiet {
    Quiet() { ++autodiff::thread_state().quiet_backward; }
    ~Quiet() { --autodiff::thread_state().quiet_backward; }
  } quiet;

  // Analytic: d sum(w * f(x)) / dx by the tape.
  TensorList analytic;
  Tensor weights;
  Shape out_shape;
  {
    EnableGradGuard grad_on;
    TensorList grad_inputs;
    for (size_t i : checked_inputs) {
      leaves[i].requires_grad_();
      grad_inputs.push_back(leaves[i]);
    }
    Tensor out = evaluate(f, leaves, "analytic pass");
    out_shape = out.shape();
    weights = rand(out_shape, DType::f64, RngState{options.seed, 0}, 0.5, 1.5);
    analytic.resize(grad_inputs.size());  // undefined: zero (f does not depend on that input)
    if (out.requires_grad()) {
      try {
        analytic = grad({out}, grad_inputs, {weights});
      } catch (const Error& e) {
        throw Error(detail::concat("gradcheck: the backward pass threw: ", e.what()));
      }
    }
  }
  const std::vector<double> w = weights.to_vector();
  auto weighted_sum = [&](const Tensor& out) {
    REMAT_CHECK(out.shape() == out_shape, "gradcheck: f returned shape ", shape_str(out.shape()),
                " in the numeric pass but ", shape_str(out_shape), " in the analytic pass (is f deterministic?)");
    std::vector<double> v = out.to_vector();
    double total = 0;
    for (size_t k = 0; k < v.size(); ++k) total += w[k] * v[k];
    return total;
  };

  // Numeric: central differences, one element at a time, without recording.
  GradcheckResult result;
  NoGradGuard no_grad;
  double worst_ratio = -1;
  int64_t failing = 0;
  for (size_t c = 0; c < checked_inputs.size(); ++c) {
    size_t i = checked_inputs[c];
    Tensor& x = work[i];
    double* p = x.contiguous_data<double>();
    std::vector<double> a = analytic[c].defined() ? analytic[c].to(DType::f64).to_vector()
                                                  : std::vector<double>(static_cast<size_t>(x.numel()), 0.0);
    for (int64_t k = 0; k < x.numel(); ++k) {
      const double original = p[k];
      p[k] = original + options.eps;
      x.storage()->bump_version();
      double plus = weighted_sum(evaluate(f, work, "numeric pass"));
      p[k] = original - options.eps;
      x.storage()->bump_version();
      double minus = weighted_sum(evaluate(f, work, "numeric pass"));
      p[k] = original;
      x.storage()->bump_version();
      double numeric = (plus - minus) / (2 * options.eps);
      double analytic_k = a[static_cast<size_t>(k)];
      double error = std::fabs(analytic_k - numeric);
      double allowed = options.atol + options.rtol * std::fabs(numeric);
      // NaN on either side fails
      bool pass = error <= allowed;
      double ratio = allowed > 0 ? error / allowed : (error > 0 ? HUGE_VAL : 0.0);
      if (!pass) {
        ++failing;
        if (!std::isfinite(ratio)) ratio = HUGE_VAL;
      }
      ++result.checked;
      if (ratio > worst_ratio) {
        worst_ratio = ratio;
        result.input = i;
        result.index = unravel(k, x.shape());
        result.analytic = analytic_k;
        result.numeric = numeric;
        result.abs_error = error;
      }
    }
  }
  result.ok = failing == 0;
  std::string worst = "input " + std::to_string(result.input) + " " + index_str(result.index) + ": analytic " +
                      number(result.analytic) + ", numeric " + number(result.numeric) + ", |diff| " +
                      number(result.abs_error);
  if (result.ok) {
    result.report = "gradcheck: ok, " + std::to_string(result.checked) + " elements of " +
                    std::to_string(checked_inputs.size()) + " input(s) within atol " + number(options.atol) +
                    " + rtol " + number(options.rtol) + " * |numeric|; worst " + worst;
  } else {
    result.report = "gradcheck: " + std::to_string(failing) + " of " + std::to_string(result.checked) +
                    " elements differ beyond atol " + number(options.atol) + " + rtol " + number(options.rtol) +
                    " * |numeric|; worst " + worst;
    if (options.throw_on_failure) throw Error(result.report);
  }
  return result;
}

}  // namespace remat
