// tests/op_rows_conv.h - the op-table rows of issue 17: conv2d / conv1d, max / avg / adaptive
// pooling, batch_norm, diagonal and the general einsum (nn::einsum), each against the float64
// references of op_reference_conv.h and by finite differences, in f32 and f64 (test_ops.cpp adds
// them to its table). Shapes are small: every input element is perturbed twice.
#pragma once

#include "op_harness.h"
#include "op_reference_conv.h"
#include "remat/backend.h"
#include "remat/nn/einsum.h"

namespace remat::test {

inline std::string size2_text(Size2 s) { return std::to_string(s[0]) + "x" + std::to_string(s[1]); }
inline std::string shape_dims(const Shape& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "x" : "") + std::to_string(s[i]);
  return out.empty() ? "s" : out;
}

struct ConvRow {
  std::string variant;
  Shape x, w;
  bool bias = false;
  Size2 stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
};

inline OpCase conv2d_case(const ConvRow& r) {
  OpCase c;
  c.name = "conv2d_" + r.variant + "_" + shape_dims(r.x) + "_w" + shape_dims(r.w);
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

// The conv2d rows (also run under every f32 ConvAlgorithm by test_ops.cpp).
inline std::vector<ConvRow> conv2d_rows() {
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

struct PoolRow {
  std::string kind;  // max, avg
  Shape x;
  Size2 kernel, stride, padding{0, 0}, dilation{1, 1};
  bool ceil_mode = false, count_include_pad = true;
};

inline OpCase pool_case(const PoolRow& r) {
  OpCase c;
  c.name = r.kind + "_pool2d_k" + size2_text(r.kernel) + "_s" + size2_text(r.stride) + "_p" + size2_text(r.padding) +
           (r.dilation[0] > 1 || r.dilation[1] > 1 ? "_d" + size2_text(r.dilation) : "") +
           (r.ceil_mode ? "_ceil" : "") + (!r.count_include_pad ? "_exclude_pad" : "") + "_" + shape_dims(r.x);
  // distinct values 0.05 apart: no ties in a max window
  c.make_inputs = [r](Rng& rng) { return Inputs{floating("x", r.x, rng.distinct(numel_of(r.x), -2.0, 0.05))}; };
  c.apply = [r](const TensorList& in) {
    if (r.kind == "max") return TensorList{max_pool2d(in[0], r.kernel, r.stride, r.padding, r.dilation, r.ceil_mode)};
    return TensorList{avg_pool2d(in[0], r.kernel, r.stride, r.padding, r.ceil_mode, r.count_include_pad)};
  };
  c.reference = [r](const std::vector<Array>& a) {
    if (r.kind == "max")
      return std::vector<Array>{ref::max_pool2d(a[0], r.kernel, r.stride, r.padding, r.dilation, r.ceil_mode)};
    return std::vector<Array>{ref::avg_pool2d(a[0], r.kernel, r.stride, r.padding, r.ceil_mode, r.count_include_pad)};
  };
  return c;
}

inline OpCase adaptive_case(Shape x, Size2 out) {
  OpCase c;
  c.name = "adaptive_avg_pool2d_" + shape_dims(x) + "_to_" + size2_text(out);
  c.make_inputs = [x](Rng& rng) { return Inputs{floating("x", x, rng.uniform_vector(numel_of(x), -2, 2))}; };
  c.apply = [out](const TensorList& in) { return TensorList{adaptive_avg_pool2d(in[0], out)}; };
  c.reference = [out](const std::vector<Array>& a) { return std::vector<Array>{ref::adaptive_avg_pool2d(a[0], out)}; };
  return c;
}

// Training mode (batch statistics) with or without the affine parameters; running statistics are
// checked elsewhere (test_nn_conv.cpp), since they carry no gradient.
inline OpCase batch_norm_train_case(Shape x, bool affine) {
  OpCase c;
  c.name = "batch_norm_train_" + shape_dims(x) + (affine ? "_affine" : "_plain");
  const int64_t ch = x[1];
  c.make_inputs = [=](Rng& rng) {
    Inputs in{floating("x", x, rng.uniform_vector(numel_of(x), -2, 2))};
    if (affine) {
      in.push_back(floating("weight", {ch}, rng.uniform_vector(ch, 0.5, 1.5)));
      in.push_back(floating("bias", {ch}, rng.uniform_vector(ch, -1, 1)));
    }
    return in;
  };
  c.apply = [=](const TensorList& in) {
    return TensorList{batch_norm(in[0], affine ? in[1] : Tensor(), affine ? in[2] : Tensor(), Tensor(), Tensor(),
                                 /*training=*/true, 0.1, 1e-5)};
  };
  c.reference = [=](const std::vector<Array>& a) {
    return std::vector<Array>{ref::batch_norm_train(a[0], affine ? &a[1] : nullptr, affine ? &a[2] : nullptr, 1e-5)};
  };
  return c;
}

// Evaluation mode: the running statistics (constants) normalise.
inline OpCase batch_norm_eval_case(Shape x) {
  OpCase c;
  c.name = "batch_norm_eval_" + shape_dims(x) + "_affine";
  const int64_t ch = x[1];
  c.make_inputs = [=](Rng& rng) {
    return Inputs{floating("x", x, rng.uniform_vector(numel_of(x), -2, 2)),
                  floating("weight", {ch}, rng.uniform_vector(ch, 0.5, 1.5)),
                  floating("bias", {ch}, rng.uniform_vector(ch, -1, 1)),
                  constant("running_mean", {ch}, rng.uniform_vector(ch, -0.5, 0.5)),
                  constant("running_var", {ch}, rng.uniform_vector(ch, 0.5, 2.0))};
  };
  c.apply = [](const TensorList& in) {
    return TensorList{batch_norm(in[0], in[1], in[2], in[3], in[4], /*training=*/false, 0.1, 1e-5)};
  };
  c.reference = [](const std::vector<Array>& a) {
    return std::vector<Array>{ref::batch_norm_with(a[0], a[3].v, a[4].v, &a[1], &a[2], 1e-5)};
  };
  return c;
}

inline OpCase diagonal_case(Shape x, int64_t a, int64_t b) {
  OpCase c;
  c.name = "diagonal_" + shape_dims(x) + "_axes" + (a < 0 ? "m" + std::to_string(-a) : std::to_string(a)) + "_" +
           (b < 0 ? "m" + std::to_string(-b) : std::to_string(b));
  c.make_inputs = [x](Rng& rng) { return Inputs{floating("x", x, rng.uniform_vector(numel_of(x), -2, 2))}; };
  c.apply = [a, b](const TensorList& in) { return TensorList{diagonal(in[0], a, b)}; };
  c.reference = [a, b](const std::vector<Array>& arr) { return std::vector<Array>{ref::diagonal(arr[0], a, b)}; };
  return c;
}

inline OpCase einsum_case(const std::string& variant, const std::string& spec, std::vector<Shape> shapes) {
  OpCase c;
  c.name = "einsum_" + variant;
  c.make_inputs = [shapes](Rng& rng) {
    Inputs in;
    for (size_t k = 0; k < shapes.size(); ++k)
      in.push_back(floating("op" + std::to_string(k), shapes[k], rng.uniform_vector(numel_of(shapes[k]), -1, 1)));
    return in;
  };
  c.apply = [spec](const TensorList& in) { return TensorList{nn::einsum(spec, in)}; };
  c.reference = [spec](const std::vector<Array>& a) { return std::vector<Array>{ref::einsum(spec, a)}; };
  return c;
}

inline std::vector<OpCase> conv_pool_norm_einsum_rows() {
  std::vector<OpCase> t;
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
  for (const PoolRow& r : std::vector<PoolRow>{
           {"max", {2, 2, 4, 6}, {2, 2}, {2, 2}},
           {"max", {1, 2, 7, 7}, {3, 3}, {2, 2}, {1, 1}},
           {"max", {1, 2, 7, 8}, {2, 2}, {2, 2}, {0, 0}, {2, 2}, true},
           {"avg", {2, 2, 4, 6}, {2, 2}, {2, 2}},
           {"avg", {1, 2, 6, 7}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true, true},
           {"avg", {1, 2, 6, 7}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true, false},
       })
    t.push_back(pool_case(r));
  t.push_back(adaptive_case({2, 2, 5, 7}, {1, 1}));
  t.push_back(adaptive_case({1, 2, 5, 7}, {2, 3}));
  t.push_back(batch_norm_train_case({3, 2, 2, 3}, true));
  t.push_back(batch_norm_train_case({4, 3}, false));
  t.push_back(batch_norm_train_case({3, 2, 4}, true));
  t.push_back(batch_norm_eval_case({2, 3, 2, 2}));
  t.push_back(diagonal_case({3, 3}, 0, 1));
  t.push_back(diagonal_case({2, 3, 4}, 0, 2));
  t.push_back(diagonal_case({3, 2, 3}, -1, 0));
  t.push_back(einsum_case("chain3", "ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 2}}));
  t.push_back(einsum_case("cycle4", "abc,cd,de,ea->b", {{2, 3, 2}, {2, 3}, {3, 2}, {2, 2}}));
  t.push_back(einsum_case("trace", "ii->", {{3, 3}}));
  t.push_back(einsum_case("diagonal", "ii->i", {{3, 3}}));
  t.push_back(einsum_case("batch_diagonal_sum", "bii,bj->bj", {{2, 3, 3}, {2, 4}}));
  t.push_back(einsum_case("diagonal_times_matrix", "iij,jk->ik", {{2, 2, 3}, {3, 4}}));
  t.push_back(einsum_case("ellipsis_broadcast", "...ij,...jk->...ik", {{2, 1, 3, 4}, {5, 4, 2}}));
  t.push_back(einsum_case("ellipsis_implicit", "...i,i", {{2, 3, 4}, {4}}));
  t.push_back(einsum_case("sum_single_index", "ij,k->i", {{2, 3}, {4}}));
  t.push_back(einsum_case("three_way_product", "i,i,i->", {{5}, {5}, {5}}));
  t.push_back(einsum_case("bilinear", "bi,ijk,bj->bk", {{2, 3}, {3, 4, 2}, {2, 4}}));
  return t;
}

}  // namespace remat::test
