// The reduction rows (src/autodiff/ops/reduce.cpp): sum, mean, max, argmax, sum_to.
#include "op_rows/builders.h"
namespace remat::test {

namespace {

OpCase reduce_case(ref::Reduce kind, Shape shape, std::vector<int64_t> axes, bool keepdim) {
  static const char* names[] = {"sum", "mean", "max", "argmax"};
  OpCase c;
  c.name = std::string(names[static_cast<int>(kind)]) + "_" + dims(shape);
  if (axes.empty()) c.name += "_all";
  for (auto a : axes) c.name += a < 0 ? "_m" + std::to_string(-a) : "_" + std::to_string(a);
  if (keepdim) c.name += "_keepdim";
  c.make_inputs = [=](Rng& r) {
    // distinct values 0.1 apart: no ties for max/argmax
    return Inputs{floating("x", shape, r.distinct(numel_of(shape), -1.2, 0.1))};
  };
  c.apply = [=](const TensorList& in) {
    switch (kind) {
      case ref::Reduce::sum: return TensorList{sum(in[0], axes, keepdim)};
      case ref::Reduce::mean: return TensorList{mean(in[0], axes, keepdim)};
      case ref::Reduce::max: return TensorList{max(in[0], axes, keepdim)};
      case ref::Reduce::argmax: return TensorList{argmax(in[0], axes.at(0), keepdim)};
    }
    return TensorList{};
  };
  c.reference = [=](const std::vector<Array>& a) { return std::vector<Array>{ref::reduce(a[0], axes, keepdim, kind)}; };
  c.differentiable = kind != ref::Reduce::argmax;
  return c;
}

}  // namespace

void add_reduce_rows(std::vector<OpCase>& t) {
  for (auto kind : {ref::Reduce::sum, ref::Reduce::mean, ref::Reduce::max}) {
    t.push_back(reduce_case(kind, {2, 3, 4}, {}, false));
    t.push_back(reduce_case(kind, {2, 3, 4}, {1}, false));
    t.push_back(reduce_case(kind, {2, 3, 4}, {1}, true));
    t.push_back(reduce_case(kind, {2, 3, 4}, {0, 2}, false));
    t.push_back(reduce_case(kind, {2, 3, 4}, {0, 2}, true));
    t.push_back(reduce_case(kind, {2, 3, 4}, {-1}, true));
    t.push_back(reduce_case(kind, {2, 3, 4}, {0}, false));
    t.push_back(reduce_case(kind, {2, 3, 4}, {}, true));
  }
  t.push_back(reduce_case(ref::Reduce::argmax, {2, 3, 4}, {1}, false));
  t.push_back(reduce_case(ref::Reduce::argmax, {2, 3, 4}, {-1}, true));
  t.push_back(reduce_case(ref::Reduce::argmax, {2, 3, 4}, {0}, false));
  t.push_back(view_case("sum_method", {3, 4}, [](const Tensor& x) { return x.sum(); },
                        [](const Array& x) { return ref::reduce(x, {}, false, ref::Reduce::sum); }));
  t.push_back(view_case("mean_method", {3, 4}, [](const Tensor& x) { return x.mean(); },
                        [](const Array& x) { return ref::reduce(x, {}, false, ref::Reduce::mean); }));
  t.push_back(view_case("sum_of_transposed_axis0", {3, 4}, [](const Tensor& x) { return sum(x.transpose(0, 1), {0}); },
                        [](const Array& x) { return ref::reduce(ref::permute(x, {1, 0}), {0}, false, ref::Reduce::sum); }));
  t.push_back(view_case("sum_to_2x1", {2, 3}, [](const Tensor& x) { return sum_to(x, {2, 1}); },
                        [](const Array& x) { return ref::reduce(x, {1}, true, ref::Reduce::sum); }));
  t.push_back(view_case("sum_to_3_from_4x2x3", {4, 2, 3}, [](const Tensor& x) { return sum_to(x, {3}); },
                        [](const Array& x) { return ref::reduce(x, {0, 1}, false, ref::Reduce::sum); }));
}

}  // namespace remat::test
