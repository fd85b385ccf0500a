// Gradient checking for the nn tests: the analytic gradient of <f(inputs), R> (R a fixed random
// tensor) from remat's backward pass against float64 central differences.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "remat/remat.h"

namespace remat::nn_test {

struct GradcheckOptions {
  double step = 1e-6;
  double atol = 1e-7;
  double rtol = 1e-5;
  int64_t max_elements_per_input = 64;  // checks a strided subset of larger inputs
};

// f: computes the output from the (captured) inputs; inputs: contiguous f64 leaves requiring grad
// that f reads. Names label failures.
inline void expect_gradients_match(const std::function<Tensor()>& f, const TensorList& inputs,
                                   const std::vector<std::string>& names = {}, GradcheckOptions options = {}) {
  Tensor out = f();
  Tensor weights = randn(out.shape(), DType::f64, RngState{987, 0});
  auto objective = [&](const Tensor& y) { return sum(mul(y, weights)); };
  TensorList analytic = remat::grad({objective(out)}, inputs);
  ASSERT_EQ(analytic.size(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    const std::string label = i < names.size() ? names[i] : "input " + std::to_string(i);
    ASSERT_EQ(x.dtype(), DType::f64) << label;
    ASSERT_TRUE(x.is_contiguous()) << label;
    ASSERT_TRUE(analytic[i].defined()) << label;
    std::vector<double> g = analytic[i].to_vector();
    const int64_t n = x.numel();
    const int64_t stride = std::max<int64_t>(1, n / options.max_elements_per_input);
    double* data = x.data<double>();
    for (int64_t j = 0; j < n; j += stride) {
      const double saved = data[j];
      double plus, minus;
      {
        NoGradGuard no_grad;
        data[j] = saved + options.step;
        plus = objective(f()).item();
        data[j] = saved - options.step;
        minus = objective(f()).item();
        data[j] = saved;
      }
      const double numeric = (plus - minus) / (2 * options.step);
      EXPECT_NEAR(g[static_cast<size_t>(j)], numeric, options.atol + options.rtol * std::abs(numeric))
          << label << " element " << j;
    }
  }
}

}  // namespace remat::nn_test
