// The layer-norm and RMS-norm rows (src/autodiff/ops/norm.cpp).
#include "op_rows/builders.h"
namespace remat::test {

namespace {

OpCase layer_norm_case(bool weight, bool bias, Shape shape) {
  OpCase c;
  c.name = std::string("layer_norm_") + dims(shape) + (weight ? "_weight" : "") + (bias ? "_bias" : "") +
           (!weight && !bias ? "_plain" : "");
  int64_t ch = shape.back();
  c.make_inputs = [=](Rng& r) {
    Inputs in{floating("x", shape, r.uniform_vector(numel_of(shape), -2, 2))};
    if (weight) in.push_back(floating("weight", {ch}, r.uniform_vector(ch, 0.5, 1.5)));
    if (bias) in.push_back(floating("bias", {ch}, r.uniform_vector(ch, -1, 1)));
    return in;
  };
  c.apply = [=](const TensorList& in) {
    Tensor w = weight ? in[1] : Tensor();
    Tensor b = bias ? in[weight ? 2 : 1] : Tensor();
    return TensorList{layer_norm(in[0], w, b, 1e-5)};
  };
  c.reference = [=](const std::vector<Array>& a) {
    const Array* w = weight ? &a[1] : nullptr;
    const Array* b = bias ? &a[weight ? 2 : 1] : nullptr;
    return std::vector<Array>{ref::layer_norm(a[0], w, b, 1e-5)};
  };
  return c;
}

// {x + r, layer_norm(x + r)}: both outputs get a cotangent, so the backward runs the fused kernel.
OpCase add_layer_norm_case(bool weight, bool bias, Shape shape) {
  OpCase c;
  c.name = std::string("add_layer_norm_") + dims(shape) + (weight ? "_weight" : "") + (bias ? "_bias" : "") +
           (!weight && !bias ? "_plain" : "");
  int64_t ch = shape.back();
  c.make_inputs = [=](Rng& r) {
    Inputs in{floating("x", shape, r.uniform_vector(numel_of(shape), -2, 2)),
              floating("r", shape, r.uniform_vector(numel_of(shape), -1, 1))};
    if (weight) in.push_back(floating("weight", {ch}, r.uniform_vector(ch, 0.5, 1.5)));
    if (bias) in.push_back(floating("bias", {ch}, r.uniform_vector(ch, -1, 1)));
    return in;
  };
  c.apply = [=](const TensorList& in) {
    Tensor w = weight ? in[2] : Tensor();
    Tensor b = bias ? in[weight ? 3 : 2] : Tensor();
    return add_layer_norm(in[0], in[1], w, b, 1e-5);
  };
  c.reference = [=](const std::vector<Array>& a) {
    const Array* w = weight ? &a[2] : nullptr;
    const Array* b = bias ? &a[weight ? 3 : 2] : nullptr;
    Array s = ref::binary(a[0], a[1], [](double u, double v) { return u + v; });
    return std::vector<Array>{s, ref::layer_norm(s, w, b, 1e-5)};
  };
  return c;
}

OpCase rms_norm_case(Shape shape, bool weight = true) {
  OpCase c;
  c.name = "rms_norm_" + dims(shape) + (weight ? "" : "_plain");
  int64_t ch = shape.back();
  c.make_inputs = [=](Rng& r) {
    Inputs in{floating("x", shape, r.uniform_vector(numel_of(shape), -2, 2))};
    if (weight) in.push_back(floating("weight", {ch}, r.uniform_vector(ch, 0.5, 1.5)));
    return in;
  };
  c.apply = [=](const TensorList& in) { return TensorList{rms_norm(in[0], weight ? in[1] : Tensor(), 1e-6)}; };
  c.reference = [=](const std::vector<Array>& a) {
    return std::vector<Array>{ref::rms_norm(a[0], weight ? &a[1] : nullptr, 1e-6)};
  };
  return c;
}

}  // namespace

void add_norm_rows(std::vector<OpCase>& t) {
  t.push_back(layer_norm_case(true, true, {2, 3, 5}));
  t.push_back(layer_norm_case(false, false, {2, 3, 5}));
  t.push_back(layer_norm_case(true, false, {4, 6}));
  t.push_back(layer_norm_case(false, true, {4, 6}));
  t.push_back(rms_norm_case({2, 3, 5}));
  t.push_back(rms_norm_case({4, 6}));
  t.push_back(add_layer_norm_case(true, true, {2, 3, 5}));
  t.push_back(add_layer_norm_case(false, false, {4, 6}));
  t.push_back(add_layer_norm_case(true, false, {3, 19}));
  t.push_back(add_layer_norm_case(false, true, {2, 27}));
  t.push_back(add_layer_norm_case(true, true, {70, 5}));  // the parameter gradients over several row blocks
  {  // the norm's output alone used: the backward without a residual gradient
    Rng r(hash_name("add_layer_norm_norm_only"));
    t.push_back(two_input_case(
        "add_layer_norm_norm_only", floating("x", {3, 8}, r.uniform_vector(24, -2, 2)),
        floating("r", {3, 8}, r.uniform_vector(24, -1, 1)),
        [](const Tensor& x, const Tensor& res) { return add_layer_norm(x, res, Tensor(), Tensor(), 1e-5)[1]; },
        [](const Array& x, const Array& res) {
          return ref::layer_norm(ref::binary(x, res, [](double u, double v) { return u + v; }), nullptr, nullptr, 1e-5);
        }));
  }
  {  // the sum alone used: the backward passes s's gradient on to x and r
    Rng r(hash_name("add_layer_norm_sum_only"));
    t.push_back(two_input_case(
        "add_layer_norm_sum_only", floating("x", {3, 8}, r.uniform_vector(24, -2, 2)),
        floating("r", {3, 8}, r.uniform_vector(24, -1, 1)),
        [](const Tensor& x, const Tensor& res) { return mul(add_layer_norm(x, res, Tensor(), Tensor(), 1e-5)[0], x); },
        [](const Array& x, const Array& res) {
          Array s = ref::binary(x, res, [](double u, double v) { return u + v; });
          return ref::binary(s, x, [](double u, double v) { return u * v; });
        }));
  }
  t.push_back(view_case("add_layer_norm_of_transposed", {4, 7},
                        [](const Tensor& x) {
                          Tensor xt = x.transpose(0, 1);
                          return add_layer_norm(xt, xt, Tensor(), Tensor(), 1e-5)[1];
                        },
                        [](const Array& x) {
                          Array xt = ref::permute(x, {1, 0});
                          return ref::layer_norm(ref::binary(xt, xt, [](double u, double v) { return u + v; }), nullptr,
                                                 nullptr, 1e-5);
                        }));

  t.push_back(layer_norm_case(true, true, {3, 19}));
  t.push_back(layer_norm_case(false, false, {2, 27}));
  t.push_back(rms_norm_case({3, 19}));
  t.push_back(layer_norm_case(true, true, {2, 3, 16}));
  t.push_back(layer_norm_case(false, false, {4, 9}));
  t.push_back(layer_norm_case(true, true, {70, 5}));  // the parameter gradients over several row blocks
  t.push_back(rms_norm_case({2, 3, 16}));
  t.push_back(rms_norm_case({4, 7}, /*weight=*/false));
  t.push_back(view_case("rms_norm_plain_of_transposed", {4, 7},
                        [](const Tensor& x) { return rms_norm(x.transpose(0, 1), Tensor(), 1e-6); },
                        [](const Array& x) { return ref::rms_norm(ref::permute(x, {1, 0}), nullptr, 1e-6); }));
}

}  // namespace remat::test
