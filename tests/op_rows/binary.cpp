// The binary elementwise rows with broadcasting, where and masked_fill (src/autodiff/ops/binary.cpp).
#include "op_rows/builders.h"
namespace remat::test {

void add_binary_rows(std::vector<OpCase>& t) {
  const std::vector<std::pair<Shape, Shape>> pairs = {
      {{2, 3}, {3}}, {{4, 1, 3}, {2, 1}}, {{}, {2, 3}}, {{2, 3}, {2, 3}}, {{2, 1}, {1, 3}}};
  for (Bin kind : {Bin::add, Bin::sub, Bin::mul, Bin::div, Bin::maximum, Bin::minimum})
    for (auto& [a, b] : pairs) t.push_back(binary_case(kind, a, b));
  for (Bin kind : {Bin::sub, Bin::div}) t.push_back(binary_case(kind, {2, 3}, {}));
  {
    OpCase c = view_case("mul_strided_operands", {4, 6},
                         [](const Tensor& x) { return mul(x.slice(1, 0, 6, 2), x.slice(0, 1, 4).transpose(0, 1).slice(0, 0, 4)); },
                         [](const Array& x) {
                           return ref::binary(ref::slice(x, 1, 0, 6, 2),
                                              ref::slice(ref::permute(ref::slice(x, 0, 1, 4, 1), {1, 0}), 0, 0, 4, 1),
                                              [](double a, double b) { return a * b; });
                         });
    t.push_back(c);
  }
  {
    OpCase c;
    c.name = "operators_add_sub_mul_div";
    c.make_inputs = [](Rng& r) {
      return Inputs{floating("a", {2, 3}, r.uniform_vector(6, -2, 2)), floating("b", {3}, r.away_from(3, -2, 2, {0.0}, 0.5))};
    };
    c.apply = [](const TensorList& in) { return TensorList{(in[0] + in[1]) * in[0] - in[1] + in[0] / in[1]}; };
    c.reference = [](const std::vector<Array>& a) {
      Array s = ref::binary(ref::binary(a[0], a[1], [](double x, double y) { return x + y; }), a[0],
                            [](double x, double y) { return x * y; });
      s = ref::binary(s, a[1], [](double x, double y) { return x - y; });
      Array q = ref::binary(a[0], a[1], [](double x, double y) { return x / y; });
      return std::vector<Array>{ref::binary(s, q, [](double x, double y) { return x + y; })};
    };
    t.push_back(c);
  }

  // ---- where and masked_fill
  {
    OpCase c;
    c.name = "where_i64cond_2x3_a2x3_b3";
    c.make_inputs = [](Rng& r) {
      return Inputs{index_input("cond", {2, 3}, {1, 0, 0, 1, 1, 0}), floating("a", {2, 3}, r.uniform_vector(6, -2, 2)),
                    floating("b", {3}, r.uniform_vector(3, -2, 2))};
    };
    c.apply = [](const TensorList& in) { return TensorList{where(in[0], in[1], in[2])}; };
    c.reference = [](const std::vector<Array>& a) { return std::vector<Array>{ref::where(a[0], a[1], a[2])}; };
    t.push_back(c);
  }
  {
    OpCase c;
    c.name = "where_floatcond_3_a2x1_bscalar";
    c.make_inputs = [](Rng& r) {
      return Inputs{constant("cond", {3}, {-2.5, 0.0, 1.0}), floating("a", {2, 1}, r.uniform_vector(2, -2, 2)),
                    floating("b", {}, r.uniform_vector(1, -2, 2))};
    };
    c.apply = [](const TensorList& in) { return TensorList{where(in[0], in[1], in[2])}; };
    c.reference = [](const std::vector<Array>& a) { return std::vector<Array>{ref::where(a[0], a[1], a[2])}; };
    t.push_back(c);
  }
  for (Shape mshape : {Shape{3}, Shape{2, 1}, Shape{2, 3}}) {
    OpCase c;
    c.name = "masked_fill_2x3_mask" + dims(mshape);
    std::vector<double> mask = mshape == Shape{3} ? std::vector<double>{1, 0, 1}
                               : mshape == Shape{2, 1} ? std::vector<double>{0, 1}
                                                       : std::vector<double>{0, 1, 1, 0, 0, 1};
    c.make_inputs = [=](Rng& r) {
      return Inputs{floating("x", {2, 3}, r.uniform_vector(6, -2, 2)), index_input("mask", mshape, mask)};
    };
    c.apply = [](const TensorList& in) { return TensorList{masked_fill(in[0], in[1], -7.5)}; };
    c.reference = [](const std::vector<Array>& a) {
      Array fill = make_array({}, -7.5);
      return std::vector<Array>{ref::where(a[1], fill, a[0])};
    };
    t.push_back(c);
  }
}

}  // namespace remat::test
