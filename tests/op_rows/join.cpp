// The concat and split rows (src/autodiff/ops/join.cpp).
#include "op_rows/builders.h"
namespace remat::test {

namespace {

OpCase concat_case(std::vector<Shape> shapes, int64_t axis) {
  OpCase c;
  c.name = "concat";
  for (auto& s : shapes) c.name += "_" + dims(s);
  c.name += "_axis" + (axis < 0 ? "m" + std::to_string(-axis) : std::to_string(axis));
  c.make_inputs = [=](Rng& r) {
    Inputs in;
    for (size_t i = 0; i < shapes.size(); ++i)
      in.push_back(floating("x" + std::to_string(i), shapes[i], r.uniform_vector(numel_of(shapes[i]), -2, 2)));
    return in;
  };
  c.apply = [=](const TensorList& in) { return TensorList{concat(in, axis)}; };
  c.reference = [=](const std::vector<Array>& a) { return std::vector<Array>{ref::concat(a, axis)}; };
  return c;
}

OpCase split_case(Shape shape, std::vector<int64_t> sizes, int64_t axis) {
  OpCase c;
  c.name = "split_" + dims(shape) + "_sizes";
  for (auto s : sizes) c.name += "_" + std::to_string(s);
  c.name += "_axis" + (axis < 0 ? "m" + std::to_string(-axis) : std::to_string(axis));
  c.make_inputs = [=](Rng& r) { return Inputs{floating("x", shape, r.uniform_vector(numel_of(shape), -2, 2))}; };
  c.apply = [=](const TensorList& in) { return split(in[0], sizes, axis); };
  c.reference = [=](const std::vector<Array>& a) { return ref::split(a[0], sizes, axis); };
  return c;
}

}  // namespace

void add_join_rows(std::vector<OpCase>& t) {
  t.push_back(concat_case({{2, 3}, {2, 2}}, 1));
  t.push_back(concat_case({{1, 3}, {2, 3}}, 0));
  t.push_back(concat_case({{2, 1, 2}, {2, 3, 2}, {2, 2, 2}}, -2));
  t.push_back(split_case({2, 5}, {2, 3}, 1));
  t.push_back(split_case({4, 3}, {1, 3}, 0));
  t.push_back(split_case({2, 6}, {1, 2, 3}, -1));
  t.push_back(concat_case({{2, 3}, {2, 2}}, -1));
  {  // one input used twice
    Rng r(hash_name("concat_repeated_input_axis0"));
    t.push_back(two_input_case(
        "concat_repeated_input_axis0", floating("x0", {2, 3}, r.uniform_vector(6, -2, 2)),
        floating("x1", {1, 3}, r.uniform_vector(3, -2, 2)),
        [](const Tensor& a, const Tensor& b) { return concat({a, b, a}, 0); },
        [](const Array& a, const Array& b) { return ref::concat({a, b, a}, 0); }));
  }
  {  // a transposed input and an empty part
    Rng r(hash_name("concat_transposed_with_empty_part"));
    t.push_back(two_input_case(
        "concat_transposed_with_empty_part", floating("x", {2, 3, 4}, r.uniform_vector(24, -2, 2)),
        constant("empty", {4, 0, 2}, {}),
        [](const Tensor& x, const Tensor& empty) { return concat({x.transpose(0, 2), empty, x.transpose(0, 2)}, 1); },
        [](const Array& x, const Array& empty) {
          Array xt = ref::permute(x, {2, 1, 0});
          return ref::concat({xt, empty, xt}, 1);
        }));
  }
  t.push_back(view_case("split_mul_tanh_concat", {3, 5},
                        [](const Tensor& x) {
                          TensorList p = split(x, {1, 3, 1}, 1);
                          return concat({mul(p[2], p[0]), p[1].tanh()}, 1);
                        },
                        [](const Array& x) {
                          std::vector<Array> p = ref::split(x, {1, 3, 1}, 1);
                          return ref::concat({ref::binary(p[2], p[0], [](double u, double v) { return u * v; }),
                                              ref::map(p[1], [](double v) { return std::tanh(v); })},
                                             1);
                        }));
  t.push_back(split_case({4, 6, 2}, {3, 0, 3}, 1));  // an empty part
}

}  // namespace remat::test
