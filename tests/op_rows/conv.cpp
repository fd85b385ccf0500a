// The convolution rows (src/autodiff/ops/conv.cpp): conv2d (tests/op_rows/conv.h) and conv1d,
// against the float64 references of op_reference_conv.h.
#include "op_rows/builders.h"
#include "op_reference_conv.h"
#include "op_rows/conv.h"

namespace remat::test {

OpCase conv2d_case(const ConvRow& r) {
  OpCase c;
  c.name = "conv2d_" + r.variant + "_" + dims(r.x) + "_w" + dims(r.w);
  c.make_inputs = [r](Rng& rng) {
    Inputs in{floating("x", r.x, rng.uniform_vector(numel_of(r.x), -1, 1)),
              floating("weight", r.w, rng.uniform_vector(numel_of(r.w), -1, 1))};
    if (r.bias) in.push_back(floating("bias", {r.w[0]}, rng.uniform_vector(r.w[0], -1, 1)));
    return in;
  };
  c.apply = [r](const TensorList& in) {
    return TensorList{conv2d(in[0], in[1], r.bias ? in[2] : Tensor(), r.stride, r.padding, r.dilation, r.groups)};
  };
  c.reference = [r](const std::vector<Array>& a) {
    return std::vector<Array>{ref::conv2d(a[0], a[1], r.bias ? &a[2] : nullptr, r.stride, r.padding, r.dilation,
                                          r.groups)};
  };
  return c;
}

std::vector<ConvRow> conv2d_rows() {
  return {
      {"3x3_pad1_bias", {2, 3, 5, 5}, {4, 3, 3, 3}, true, {1, 1}, {1, 1}},
      {"stride2_pad1", {2, 2, 7, 6}, {3, 2, 3, 3}, false, {2, 2}, {1, 1}},
      {"dilation2_pad2", {1, 2, 7, 7}, {2, 2, 3, 3}, true, {1, 1}, {2, 2}, {2, 2}},
      {"groups2_stride2x1", {2, 4, 5, 5}, {6, 2, 3, 3}, true, {2, 1}, {1, 0}, {1, 1}, 2},
      {"depthwise", {1, 3, 5, 5}, {3, 1, 3, 3}, false, {1, 1}, {1, 1}, {1, 1}, 3},
      {"pointwise_bias", {2, 3, 4, 4}, {5, 3, 1, 1}, true},
      {"pointwise_stride2", {2, 3, 5, 5}, {4, 3, 1, 1}, false, {2, 2}},
      {"rect_2x3_pad0x2", {1, 2, 4, 5}, {3, 2, 2, 3}, true, {1, 2}, {0, 2}},
  };
}


void add_conv_rows(std::vector<OpCase>& t) {
  for (const auto& r : conv2d_rows()) t.push_back(conv2d_case(r));
  {
    OpCase c;
    c.name = "conv1d_stride2_pad1_bias_2x3x9_w4x3x3";
    c.make_inputs = [](Rng& rng) {
      return Inputs{floating("x", {2, 3, 9}, rng.uniform_vector(54, -1, 1)),
                    floating("weight", {4, 3, 3}, rng.uniform_vector(36, -1, 1)),
                    floating("bias", {4}, rng.uniform_vector(4, -1, 1))};
    };
    c.apply = [](const TensorList& in) { return TensorList{conv1d(in[0], in[1], in[2], 2, 1)}; };
    c.reference = [](const std::vector<Array>& a) {
      // conv1d is conv2d over height-1 images
      Array x = ref::reshape(a[0], {2, 3, 1, 9}), w = ref::reshape(a[1], {4, 3, 1, 3});
      Array y = ref::conv2d(x, w, &a[2], {1, 2}, {0, 1}, {1, 1}, 1);
      return std::vector<Array>{ref::reshape(y, {2, 4, y.shape[3]})};
    };
    t.push_back(c);
  }
}

}  // namespace remat::test
