// tests/op_rows/builders.h - what the op test's rows files share: row names from shapes, input
// generators, and the builders of rows that several families use (one input through a function,
// unary and binary elementwise rows, two fixed inputs).
#pragma once

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "op_harness.h"

namespace remat::test {

inline constexpr double kPi = 3.14159265358979323846;

// "2x3x4" for a shape, "s" for a scalar's.
inline std::string dims(const Shape& s) {
  if (s.empty()) return "s";
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "x" : "") + std::to_string(s[i]);
  return out;
}
inline std::string axis_text(int64_t axis) { return axis < 0 ? "m" + std::to_string(-axis) : std::to_string(axis); }

using Gen = std::function<std::vector<double>(Rng&, int64_t)>;
inline Gen uniform_gen(double lo, double hi) {
  return [=](Rng& r, int64_t n) { return r.uniform_vector(n, lo, hi); };
}
inline Gen away_gen(double lo, double hi, std::vector<double> kinks, double margin) {
  return [=](Rng& r, int64_t n) { return r.away_from(n, lo, hi, kinks, margin); };
}

inline double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// ---- row builders

inline OpCase unary_case(const std::string& name, std::function<Tensor(const Tensor&)> op,
                         std::function<double(double)> f, Gen gen = uniform_gen(-2, 2), Shape shape = {3, 4}) {
  OpCase c;
  c.name = name;
  c.make_inputs = [=](Rng& r) { return Inputs{floating("x", shape, gen(r, numel_of(shape)))}; };
  c.apply = [=](const TensorList& in) { return TensorList{op(in[0])}; };
  c.reference = [=](const std::vector<Array>& a) { return std::vector<Array>{ref::map(a[0], f)}; };
  return c;
}


enum class Bin { add, sub, mul, div, maximum, minimum };

inline OpCase binary_case(Bin kind, Shape sa, Shape sb) {
  static const char* names[] = {"add", "sub", "mul", "div", "maximum", "minimum"};
  OpCase c;
  c.name = std::string(names[static_cast<int>(kind)]) + "_" + dims(sa) + "_by_" + dims(sb);
  c.make_inputs = [=](Rng& r) {
    std::vector<double> a, b;
    if (kind == Bin::maximum || kind == Bin::minimum) {
      // no pair that meets under broadcasting may be closer than 0.1 (keeps away from the kink)
      Shape out = ref_broadcast(sa, sb);
      for (;;) {
        a = r.uniform_vector(numel_of(sa), -2, 2);
        b = r.uniform_vector(numel_of(sb), -2, 2);
        bool ok = true;
        for (int64_t i = 0; i < numel_of(out) && ok; ++i) {
          auto idx = unravel(i, out);
          ok = std::abs(a[bcast_index(sa, idx)] - b[bcast_index(sb, idx)]) > 0.1;
        }
        if (ok) break;
      }
    } else if (kind == Bin::div) {
      a = r.uniform_vector(numel_of(sa), -2, 2);
      b = r.away_from(numel_of(sb), -2, 2, {0.0}, 0.5);
    } else {
      a = r.uniform_vector(numel_of(sa), -2, 2);
      b = r.uniform_vector(numel_of(sb), -2, 2);
    }
    return Inputs{floating("a", sa, a), floating("b", sb, b)};
  };
  c.apply = [=](const TensorList& in) {
    switch (kind) {
      case Bin::add: return TensorList{add(in[0], in[1])};
      case Bin::sub: return TensorList{sub(in[0], in[1])};
      case Bin::mul: return TensorList{mul(in[0], in[1])};
      case Bin::div: return TensorList{div(in[0], in[1])};
      case Bin::maximum: return TensorList{maximum(in[0], in[1])};
      case Bin::minimum: return TensorList{minimum(in[0], in[1])};
    }
    return TensorList{};
  };
  c.reference = [=](const std::vector<Array>& a) {
    auto f = [kind](double x, double y) {
      switch (kind) {
        case Bin::add: return x + y;
        case Bin::sub: return x - y;
        case Bin::mul: return x * y;
        case Bin::div: return x / y;
        // NaN propagates (remat's convention, as PyTorch's); the inputs here are never NaN
        case Bin::maximum: return std::isnan(x) || std::isnan(y) ? std::nan("") : std::max(x, y);
        case Bin::minimum: return std::isnan(x) || std::isnan(y) ? std::nan("") : std::min(x, y);
      }
      return 0.0;
    };
    return std::vector<Array>{ref::binary(a[0], a[1], f)};
  };
  return c;
}

// A one-input view, copy or any function of one input, with its reference.
inline OpCase view_case(const std::string& name, Shape shape, std::function<Tensor(const Tensor&)> op,
                        std::function<Array(const Array&)> reference) {
  OpCase c;
  c.name = name;
  c.make_inputs = [=](Rng& r) { return Inputs{floating("x", shape, r.uniform_vector(numel_of(shape), -2, 2))}; };
  c.apply = [=](const TensorList& in) { return TensorList{op(in[0])}; };
  c.reference = [=](const std::vector<Array>& a) { return std::vector<Array>{reference(a[0])}; };
  return c;
}

// A row of two fixed inputs (made once, not drawn) through a function of both.
inline OpCase two_input_case(const std::string& name, Input a, Input b,
                             std::function<Tensor(const Tensor&, const Tensor&)> op,
                             std::function<Array(const Array&, const Array&)> reference) {
  OpCase c;
  c.name = name;
  c.make_inputs = [=](Rng&) { return Inputs{a, b}; };
  c.apply = [=](const TensorList& in) { return TensorList{op(in[0], in[1])}; };
  c.reference = [=](const std::vector<Array>& x) { return std::vector<Array>{reference(x[0], x[1])}; };
  return c;
}

// The rows of each op family (tests/op_rows/<family>.cpp), declared from the op list: a family
// of REMAT_OP_KINDS without a rows file does not link.
#define REMAT_DECLARE_ROWS(kind, family, ...) void add_##family##_rows(std::vector<OpCase>& rows);
REMAT_OP_KINDS(REMAT_DECLARE_ROWS)
#undef REMAT_DECLARE_ROWS
void add_einsum_rows(std::vector<OpCase>& rows);  // nn::einsum, built of the ops above

}  // namespace remat::test
