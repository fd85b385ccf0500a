// The dropout rows (src/autodiff/ops/dropout.cpp).
#include "op_rows/builders.h"
namespace remat::test {

namespace {

OpCase dropout_case(Shape shape, double p, RngState state) {
  OpCase c;
  c.name = "dropout_" + dims(shape) + "_p" + std::to_string(static_cast<int>(p * 100));
  c.make_inputs = [=](Rng& r) {
    if (!ref::dropout_mask_is_unambiguous(numel_of(shape), p, state))
      throw std::logic_error("dropout case: pick another state (f32/f64 masks could differ)");
    return Inputs{floating("x", shape, r.uniform_vector(numel_of(shape), -2, 2))};
  };
  c.apply = [=](const TensorList& in) { return TensorList{dropout(in[0], p, state)}; };
  c.reference = [=](const std::vector<Array>& a) { return std::vector<Array>{ref::dropout(a[0], p, state)}; };
  return c;
}

}  // namespace

void add_dropout_rows(std::vector<OpCase>& t) {
  t.push_back(dropout_case({4, 8}, 0.3, {1234, 8}));
  t.push_back(dropout_case({2, 3, 5}, 0.5, {77, 0}));
}

}  // namespace remat::test
