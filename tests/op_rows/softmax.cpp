// The softmax and log-softmax rows (src/autodiff/ops/softmax.cpp), over every axis, rows wider than a
// vector, and strided operands.
#include "op_rows/builders.h"
namespace remat::test {

namespace {

OpCase softmax_case(bool log, Shape shape, int64_t axis) {
  OpCase c;
  c.name = std::string(log ? "log_softmax_" : "softmax_") + dims(shape) + "_axis" +
           (axis < 0 ? "m" + std::to_string(-axis) : std::to_string(axis));
  c.make_inputs = [=](Rng& r) { return Inputs{floating("x", shape, r.uniform_vector(numel_of(shape), -3, 3))}; };
  c.apply = [=](const TensorList& in) { return TensorList{log ? log_softmax(in[0], axis) : softmax(in[0], axis)}; };
  c.reference = [=](const std::vector<Array>& a) { return std::vector<Array>{ref::softmax(a[0], axis, log)}; };
  return c;
}

}  // namespace

void add_softmax_rows(std::vector<OpCase>& t) {
  for (bool log : {false, true}) {
    t.push_back(softmax_case(log, {2, 3, 4}, -1));
    t.push_back(softmax_case(log, {2, 3, 4}, 1));
    t.push_back(softmax_case(log, {2, 3, 4}, 0));
    t.push_back(softmax_case(log, {5}, 0));
  }

  for (bool log : {false, true}) t.push_back(softmax_case(log, {3, 21}, -1));
  for (bool log : {false, true}) {
    t.push_back(softmax_case(log, {2, 3, 4}, -2));
    t.push_back(softmax_case(log, {2, 3, 33}, -1));
  }
  // a non-contiguous input and a non-contiguous incoming gradient
  t.push_back(view_case("softmax_of_transposed_noncontiguous_grad", {3, 4, 5},
                        [](const Tensor& x) { return softmax(x.transpose(0, 2)).transpose(0, 1); },
                        [](const Array& x) { return ref::permute(ref::softmax(ref::permute(x, {2, 1, 0}), -1, false), {1, 0, 2}); }));
}

}  // namespace remat::test
