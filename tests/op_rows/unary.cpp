// The unary elementwise rows (src/autodiff/ops/unary.cpp).
#include "op_rows/builders.h"
namespace remat::test {

namespace {

double gelu_d(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh_d(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x)));
}

}  // namespace

void add_unary_rows(std::vector<OpCase>& t) {
  t.push_back(unary_case("neg", [](const Tensor& x) { return neg(x); }, [](double x) { return -x; }));
  t.push_back(unary_case("neg_operator", [](const Tensor& x) { return -x; }, [](double x) { return -x; }));
  t.push_back(unary_case("exp", [](const Tensor& x) { return exp(x); }, [](double x) { return std::exp(x); }));
  t.push_back(unary_case("exp_method", [](const Tensor& x) { return x.exp(); }, [](double x) { return std::exp(x); }));
  t.push_back(unary_case("log", [](const Tensor& x) { return log(x); }, [](double x) { return std::log(x); },
                         uniform_gen(0.2, 3)));
  t.push_back(unary_case("sqrt", [](const Tensor& x) { return sqrt(x); }, [](double x) { return std::sqrt(x); },
                         uniform_gen(0.2, 3)));
  t.push_back(unary_case("abs", [](const Tensor& x) { return abs(x); }, [](double x) { return std::abs(x); },
                         away_gen(-2, 2, {0.0}, 0.1)));
  t.push_back(unary_case("tanh", [](const Tensor& x) { return tanh(x); }, [](double x) { return std::tanh(x); }));
  t.push_back(unary_case("sigmoid", [](const Tensor& x) { return sigmoid(x); }, sigmoid_d, uniform_gen(-4, 4)));
  t.push_back(unary_case("relu", [](const Tensor& x) { return relu(x); }, [](double x) { return x > 0 || std::isnan(x) ? x : 0.0; },
                         away_gen(-2, 2, {0.0}, 0.1)));
  t.push_back(unary_case("gelu", [](const Tensor& x) { return gelu(x); }, gelu_d, uniform_gen(-3, 3)));
  t.push_back(unary_case("gelu_tanh", [](const Tensor& x) { return gelu(x, true); }, gelu_tanh_d, uniform_gen(-3, 3)));
  t.push_back(unary_case("silu", [](const Tensor& x) { return silu(x); }, [](double x) { return x * sigmoid_d(x); },
                         uniform_gen(-4, 4)));
  t.push_back(unary_case("pow_2_5", [](const Tensor& x) { return pow(x, 2.5); },
                         [](double x) { return std::pow(x, 2.5); }, uniform_gen(0.2, 2)));
  t.push_back(unary_case("pow_3_signed", [](const Tensor& x) { return pow(x, 3.0); },
                         [](double x) { return x * x * x; }));
  t.push_back(unary_case("pow_m1_5", [](const Tensor& x) { return pow(x, -1.5); },
                         [](double x) { return std::pow(x, -1.5); }, uniform_gen(0.5, 2)));
  t.push_back(unary_case("square", [](const Tensor& x) { return square(x); }, [](double x) { return x * x; }));
  t.push_back(unary_case("add_scalar", [](const Tensor& x) { return add_scalar(x, 1.75); },
                         [](double x) { return x + 1.75; }));
  t.push_back(unary_case("add_scalar_operators", [](const Tensor& x) { return (x + 2.0) - 0.5; },
                         [](double x) { return x + 1.5; }));
  t.push_back(unary_case("mul_scalar", [](const Tensor& x) { return mul_scalar(x, -2.5); },
                         [](double x) { return x * -2.5; }));
  t.push_back(unary_case("mul_scalar_operators", [](const Tensor& x) { return (x * 3.0) / 4.0; },
                         [](double x) { return x * 0.75; }));
  // strided (non-contiguous) inputs go through the kernels' general path
  t.push_back(view_case("tanh_of_transposed", {3, 4}, [](const Tensor& x) { return tanh(x.transpose(0, 1)); },
                        [](const Array& x) { return ref::map(ref::permute(x, {1, 0}), [](double v) { return std::tanh(v); }); }));
  t.push_back(view_case("exp_of_strided_slice", {4, 6}, [](const Tensor& x) { return exp(x.slice(1, 1, 6, 2)); },
                        [](const Array& x) { return ref::map(ref::slice(x, 1, 1, 6, 2), [](double v) { return std::exp(v); }); }));

  t.push_back(unary_case("gelu_wide", [](const Tensor& x) { return gelu(x); }, gelu_d, uniform_gen(-4, 4), {5, 9}));
}

}  // namespace remat::test
