// The diagonal rows (src/autodiff/ops/diagonal.cpp).
#include "op_rows/builders.h"
#include "op_reference_conv.h"

namespace remat::test {

namespace {

OpCase diagonal_case(Shape x, int64_t a, int64_t b) {
  OpCase c;
  c.name = "diagonal_" + dims(x) + "_axes" + (a < 0 ? "m" + std::to_string(-a) : std::to_string(a)) + "_" +
           (b < 0 ? "m" + std::to_string(-b) : std::to_string(b));
  c.make_inputs = [x](Rng& rng) { return Inputs{floating("x", x, rng.uniform_vector(numel_of(x), -2, 2))}; };
  c.apply = [a, b](const TensorList& in) { return TensorList{diagonal(in[0], a, b)}; };
  c.reference = [a, b](const std::vector<Array>& arr) { return std::vector<Array>{ref::diagonal(arr[0], a, b)}; };
  return c;
}

}  // namespace

void add_diagonal_rows(std::vector<OpCase>& t) {
  t.push_back(diagonal_case({3, 3}, 0, 1));
  t.push_back(diagonal_case({2, 3, 4}, 0, 2));
  t.push_back(diagonal_case({3, 2, 3}, -1, 0));
}

}  // namespace remat::test
