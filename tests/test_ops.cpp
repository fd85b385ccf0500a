// Table-driven tests of every op in remat/ops.h (see op_harness.h): for every row and for both f32
// and f64, (a) the forward value against a float64 plain-loop reference and (b) the gradient from
// remat's backward against central finite differences of that reference.
//
// Test names read "Ops/OpTest.ForwardAndGradient/<row>_<dtype>", e.g. .../matmul_tn_4x3T_by_4x5_f32.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <optional>
#include <set>

#include "emulated_backend.h"
#include "op_harness.h"
#include "op_rows_conv.h"  // issue 17: conv, pooling, batch_norm, diagonal, einsum
#include "remat/devices.h"

using namespace remat;
using namespace remat::test;
using remat::testing::emulated_device;

namespace {

constexpr double kPi = 3.14159265358979323846;

std::string dims(const Shape& s) {
  if (s.empty()) return "s";
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "x" : "") + std::to_string(s[i]);
  return out;
}

using Gen = std::function<std::vector<double>(Rng&, int64_t)>;
Gen uniform_gen(double lo, double hi) {
  return [=](Rng& r, int64_t n) { return r.uniform_vector(n, lo, hi); };
}
Gen away_gen(double lo, double hi, std::vector<double> kinks, double margin) {
  return [=](Rng& r, int64_t n) { return r.away_from(n, lo, hi, kinks, margin); };
}

double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double gelu_d(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh_d(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x)));
}

// ---- row builders

OpCase unary_case(const std::string& name, std::function<Tensor(const Tensor&)> op, std::function<double(double)> f,
                  Gen gen = uniform_gen(-2, 2), Shape shape = {3, 4}) {
  OpCase c;
  c.name = name;
  c.make_inputs = [=](Rng& r) { return Inputs{floating("x", shape, gen(r, numel_of(shape)))}; };
  c.apply = [=](const TensorList& in) { return TensorList{op(in[0])}; };
  c.reference = [=](const std::vector<Array>& a) { return std::vector<Array>{ref::map(a[0], f)}; };
  return c;
}

enum class Bin { add, sub, mul, div, maximum, minimum };

OpCase binary_case(Bin kind, Shape sa, Shape sb) {
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

OpCase matmul_case(const std::string& variant, Shape sa, Shape sb, bool ta, bool tb) {
  OpCase c;
  c.name = "matmul_" + variant + "_" + dims(sa) + (ta ? "T" : "") + "_by_" + dims(sb) + (tb ? "T" : "");
  c.make_inputs = [=](Rng& r) {
    return Inputs{floating("a", sa, r.uniform_vector(numel_of(sa), -1, 1)),
                  floating("b", sb, r.uniform_vector(numel_of(sb), -1, 1))};
  };
  c.apply = [=](const TensorList& in) { return TensorList{matmul(in[0], in[1], ta, tb)}; };
  c.reference = [=](const std::vector<Array>& a) { return std::vector<Array>{ref::matmul(a[0], a[1], ta, tb)}; };
  return c;
}

OpCase softmax_case(bool log, Shape shape, int64_t axis) {
  OpCase c;
  c.name = std::string(log ? "log_softmax_" : "softmax_") + dims(shape) + "_axis" +
           (axis < 0 ? "m" + std::to_string(-axis) : std::to_string(axis));
  c.make_inputs = [=](Rng& r) { return Inputs{floating("x", shape, r.uniform_vector(numel_of(shape), -3, 3))}; };
  c.apply = [=](const TensorList& in) { return TensorList{log ? log_softmax(in[0], axis) : softmax(in[0], axis)}; };
  c.reference = [=](const std::vector<Array>& a) { return std::vector<Array>{ref::softmax(a[0], axis, log)}; };
  return c;
}

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

OpCase embedding_case(Shape table, Shape ids_shape, std::vector<double> ids) {
  OpCase c;
  c.name = "embedding_" + dims(table) + "_ids" + dims(ids_shape);
  c.make_inputs = [=](Rng& r) {
    return Inputs{floating("table", table, r.uniform_vector(numel_of(table), -1, 1)),
                  index_input("ids", ids_shape, ids)};
  };
  c.apply = [](const TensorList& in) { return TensorList{embedding(in[0], in[1])}; };
  c.reference = [](const std::vector<Array>& a) { return std::vector<Array>{ref::embedding(a[0], a[1])}; };
  return c;
}

OpCase cross_entropy_case(const std::string& variant, Shape logits, std::vector<double> targets, double smoothing,
                          int64_t ignore_index) {
  OpCase c;
  c.name = "cross_entropy_" + variant + "_" + dims(logits);
  c.make_inputs = [=](Rng& r) {
    return Inputs{floating("logits", logits, r.uniform_vector(numel_of(logits), -2, 2)),
                  index_input("targets", {logits[0]}, targets)};
  };
  c.apply = [=](const TensorList& in) {
    return TensorList{cross_entropy(in[0], in[1], smoothing, ignore_index)};
  };
  c.reference = [=](const std::vector<Array>& a) {
    return std::vector<Array>{ref::cross_entropy(a[0], a[1], smoothing, ignore_index)};
  };
  return c;
}

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

// A one-input view/copy op with its reference.
OpCase view_case(const std::string& name, Shape shape, std::function<Tensor(const Tensor&)> op,
                 std::function<Array(const Array&)> reference) {
  OpCase c;
  c.name = name;
  c.make_inputs = [=](Rng& r) { return Inputs{floating("x", shape, r.uniform_vector(numel_of(shape), -2, 2))}; };
  c.apply = [=](const TensorList& in) { return TensorList{op(in[0])}; };
  c.reference = [=](const std::vector<Array>& a) { return std::vector<Array>{reference(a[0])}; };
  return c;
}


// ---- fused attention (issue 14) -------------------------------------------------------------
// Reference: softmax(q k^T * scale, causal mask) with the dropout mask of ref::dropout on the
// [B, H, Tq, Tk] probabilities, then @ v; q [N.., Tq, D], k [N.., Tk, D], v [N.., Tk, Dv].
Array ref_attention(const Array& q, const Array& k, const Array& v, bool causal, double scale, double p,
                    RngState state) {
  const size_t r = q.shape.size();
  const int64_t tq = q.shape[r - 2], d = q.shape[r - 1], tk = k.shape[r - 2], dv = v.shape[r - 1];
  const int64_t heads = numel_of(q.shape) / (tq * d);
  Shape oshape = q.shape;
  oshape[r - 1] = dv;
  Array out = make_array(oshape);
  std::vector<bool> keep = p > 0 ? ref::dropout_mask(heads * tq * tk, p, state) : std::vector<bool>();
  for (int64_t n = 0; n < heads; ++n)
    for (int64_t i = 0; i < tq; ++i) {
      std::vector<double> w(static_cast<size_t>(tk), -std::numeric_limits<double>::infinity());
      double mx = -std::numeric_limits<double>::infinity(), total = 0;
      for (int64_t j = 0; j < tk; ++j) {
        if (causal && j > i) continue;
        double dot = 0;
        for (int64_t e = 0; e < d; ++e) dot += q.v[(n * tq + i) * d + e] * k.v[(n * tk + j) * d + e];
        w[j] = dot * scale;
        mx = std::max(mx, w[j]);
      }
      for (int64_t j = 0; j < tk; ++j) total += w[j] == -std::numeric_limits<double>::infinity() ? 0 : std::exp(w[j] - mx);
      for (int64_t j = 0; j < tk; ++j) {
        if (w[j] == -std::numeric_limits<double>::infinity()) continue;
        double a = std::exp(w[j] - mx) / total;
        if (p > 0) a = keep[static_cast<size_t>((n * tq + i) * tk + j)] ? a / (1.0 - p) : 0.0;
        for (int64_t x = 0; x < dv; ++x) out.v[(n * tq + i) * dv + x] += a * v.v[(n * tk + j) * dv + x];
      }
    }
  return out;
}

OpCase attention_case(const std::string& variant, Shape sq, Shape sk, Shape sv, bool causal, double p = 0.0,
                      RngState state = {}, std::optional<double> scale = std::nullopt) {
  OpCase c;
  c.name = "scaled_dot_product_attention_" + variant + "_" + dims(sq) + "_" + dims(sk) + "_" + dims(sv);
  c.make_inputs = [=](Rng& r) {
    const int64_t tk = sk[sk.size() - 2];
    if (p > 0 && !ref::dropout_mask_is_unambiguous(numel_of(sq) / sq.back() * tk, p, state))
      throw std::logic_error("attention case: pick another dropout state (f32/f64 masks could differ)");
    return Inputs{floating("q", sq, r.uniform_vector(numel_of(sq), -1.5, 1.5)),
                  floating("k", sk, r.uniform_vector(numel_of(sk), -1.5, 1.5)),
                  floating("v", sv, r.uniform_vector(numel_of(sv), -1, 1))};
  };
  c.apply = [=](const TensorList& in) {
    return TensorList{scaled_dot_product_attention(in[0], in[1], in[2], causal, p, state, scale)};
  };
  c.reference = [=](const std::vector<Array>& a) {
    double sc = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(sq.back()));
    return std::vector<Array>{ref_attention(a[0], a[1], a[2], causal, sc, p, state)};
  };
  return c;
}

// q, k, v as [B, H, T, D] views of one [B, T, 3 * H * D] input, the way nn attention makes them
// (strided along T and H; unit stride along D).
OpCase attention_from_qkv_case(int64_t b, int64_t t, int64_t h, int64_t d, double p, RngState state) {
  OpCase c;
  c.name = "scaled_dot_product_attention_qkv_views_" + dims({b, t, 3 * h * d}) + "_p" +
           std::to_string(static_cast<int>(p * 100));
  const int64_t width = h * d;
  c.make_inputs = [=](Rng& r) {
    if (p > 0 && !ref::dropout_mask_is_unambiguous(b * h * t * t, p, state))
      throw std::logic_error("attention case: pick another dropout state");
    return Inputs{floating("qkv", {b, t, 3 * width}, r.uniform_vector(b * t * 3 * width, -1.5, 1.5))};
  };
  c.apply = [=](const TensorList& in) {
    TensorList parts = split(in[0], {width, width, width}, -1);
    auto heads = [&](const Tensor& z) { return z.reshape({b, t, h, d}).permute({0, 2, 1, 3}); };
    Tensor y = scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), true, p, state);
    return TensorList{y.permute({0, 2, 1, 3}).reshape({b, t, width})};
  };
  c.reference = [=](const std::vector<Array>& a) {
    std::vector<Array> parts = ref::split(a[0], {width, width, width}, -1);
    auto heads = [&](const Array& z) { return ref::permute(ref::reshape(z, {b, t, h, d}), {0, 2, 1, 3}); };
    Array y = ref_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), true,
                            1.0 / std::sqrt(static_cast<double>(d)), p, state);
    return std::vector<Array>{ref::reshape(ref::permute(y, {0, 2, 1, 3}), {b, t, width})};
  };
  return c;
}

void add_attention_rows(std::vector<OpCase>& t) {
  t.push_back(attention_case("causal", {2, 3, 5, 4}, {2, 3, 5, 4}, {2, 3, 5, 4}, true));
  t.push_back(attention_case("full_tq_ne_tk_dv_ne_d", {2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 3}, false));
  t.push_back(attention_case("causal_tq_gt_tk", {1, 2, 6, 3}, {1, 2, 4, 3}, {1, 2, 4, 2}, true));
  t.push_back(attention_case("rank3", {3, 6, 2}, {3, 6, 2}, {3, 6, 2}, true));
  t.push_back(attention_case("scale", {1, 2, 4, 3}, {1, 2, 4, 3}, {1, 2, 4, 3}, true, 0.0, {}, 0.7));
  // several query and key tiles (32 f32 or 16 f64 positions per tile), odd head sizes
  t.push_back(attention_case("tiles", {1, 1, 37, 3}, {1, 1, 37, 3}, {1, 1, 37, 5}, true));
  t.push_back(attention_case("tiles_full", {1, 1, 19, 9}, {1, 1, 35, 9}, {1, 1, 35, 2}, false));
  t.push_back(attention_case("dropout", {2, 2, 5, 4}, {2, 2, 5, 4}, {2, 2, 5, 4}, true, 0.3, {4321, 4}));
  t.push_back(attention_case("dropout_tiles", {1, 1, 34, 3}, {1, 1, 34, 3}, {1, 1, 34, 3}, true, 0.2, {99, 0}));
  t.push_back(attention_from_qkv_case(2, 5, 2, 3, 0.0, {}));
  t.push_back(attention_from_qkv_case(2, 5, 2, 3, 0.25, {2024, 12}));
  // equal head sizes of 8 to 64 over several tiles: the CUDA forward's and backward's kernels for
  // head sizes known at compile time
  t.push_back(attention_case("rows_d8", {1, 2, 37, 8}, {1, 2, 37, 8}, {1, 2, 37, 8}, true));
  t.push_back(attention_case("rows_d16_full", {1, 1, 19, 16}, {1, 1, 35, 16}, {1, 1, 35, 16}, false));
  t.push_back(attention_case("rows_d8_dropout", {1, 1, 34, 8}, {1, 1, 34, 8}, {1, 1, 34, 8}, true, 0.2, {99, 0}));
  t.push_back(attention_case("rows_d32", {1, 1, 37, 32}, {1, 1, 37, 32}, {1, 1, 37, 32}, true));
  t.push_back(attention_case("rows_d64", {1, 1, 33, 64}, {1, 1, 33, 64}, {1, 1, 33, 64}, true));
  // two 64-row tiles, the second partial, with dropout: the tensor-core kernels' tiling
  // (REMAT_CUDA_FAST=attention; the rows above are their one-tile cases)
  t.push_back(attention_case("tiles_d32_dropout", {1, 1, 66, 32}, {1, 1, 66, 32}, {1, 1, 66, 32}, true, 0.2, {7, 3}));
}

// Rows wider than a vector (8 floats, 4 doubles) with a tail: the hand-vectorised row and GELU
// kernels take their vector and scalar paths in one row.
void add_wide_row_cases(std::vector<OpCase>& t) {
  for (bool log : {false, true}) t.push_back(softmax_case(log, {3, 21}, -1));
  t.push_back(layer_norm_case(true, true, {3, 19}));
  t.push_back(layer_norm_case(false, false, {2, 27}));
  t.push_back(rms_norm_case({3, 19}));
  t.push_back(cross_entropy_case("wide", {3, 21}, {4, 20, 0}, 0.0, -100));
  t.push_back(cross_entropy_case("wide_smoothing", {3, 21}, {13, -100, 7}, 0.1, -100));
  t.push_back(unary_case("gelu_wide", [](const Tensor& x) { return gelu(x); }, gelu_d, uniform_gen(-4, 4), {5, 9}));
  // linear: x @ W^T + b in one op
  for (Shape sx : {Shape{4, 3}, Shape{2, 3, 3}}) {
    OpCase c;
    c.name = "linear_" + dims(sx) + "_by_5x3_bias";
    c.make_inputs = [sx](Rng& r) {
      return Inputs{floating("x", sx, r.uniform_vector(numel_of(sx), -1, 1)),
                    floating("weight", {5, 3}, r.uniform_vector(15, -1, 1)), floating("bias", {5}, r.uniform_vector(5, -1, 1))};
    };
    c.apply = [](const TensorList& in) { return TensorList{linear(in[0], in[1], in[2])}; };
    c.reference = [](const std::vector<Array>& a) {
      Array y = ref::matmul(a[0], a[1], false, true);
      return std::vector<Array>{ref::binary(y, a[2], [](double u, double v) { return u + v; })};
    };
    t.push_back(c);
  }
  // reshape of strided tensors that regroup without a copy (views with computed strides)
  t.push_back(view_case("reshape_strided_slice_view", {2, 3, 4}, [](const Tensor& x) { return x.slice(2, 0, 4, 2).reshape({12}); },
                        [](const Array& x) { return ref::reshape(ref::slice(x, 2, 0, 4, 2), {12}); }));
  t.push_back(view_case("reshape_split_last_axis_of_slice", {2, 3, 6},
                        [](const Tensor& x) { return x.slice(2, 2, 6).reshape({2, 3, 2, 2}).permute({0, 2, 1, 3}); },
                        [](const Array& x) { return ref::permute(ref::reshape(ref::slice(x, 2, 2, 6, 1), {2, 3, 2, 2}), {0, 2, 1, 3}); }));
}

// ---- end of fused attention (issue 14) -------------------------------------------------------

// Rows taken over from the focused kernel tests (tests/test_rows_ops.cpp keeps what a row cannot
// check: large shapes, thread counts, exact zeros and copies, error messages): other axes and
// strided operands of the row kernels, vector-width shapes, many-row parameter gradients, inputs
// used twice, empty parts.
OpCase two_input_case(const std::string& name, Input a, Input b, std::function<Tensor(const Tensor&, const Tensor&)> op,
                      std::function<Array(const Array&, const Array&)> reference) {
  OpCase c;
  c.name = name;
  c.make_inputs = [=](Rng&) { return Inputs{a, b}; };
  c.apply = [=](const TensorList& in) { return TensorList{op(in[0], in[1])}; };
  c.reference = [=](const std::vector<Array>& x) { return std::vector<Array>{reference(x[0], x[1])}; };
  return c;
}

void add_row_kernel_cases(std::vector<OpCase>& t) {
  for (bool log : {false, true}) {
    t.push_back(softmax_case(log, {2, 3, 4}, -2));
    t.push_back(softmax_case(log, {2, 3, 33}, -1));
  }
  // a non-contiguous input and a non-contiguous incoming gradient
  t.push_back(view_case("softmax_of_transposed_noncontiguous_grad", {3, 4, 5},
                        [](const Tensor& x) { return softmax(x.transpose(0, 2)).transpose(0, 1); },
                        [](const Array& x) { return ref::permute(ref::softmax(ref::permute(x, {2, 1, 0}), -1, false), {1, 0, 2}); }));
  t.push_back(layer_norm_case(true, true, {2, 3, 16}));
  t.push_back(layer_norm_case(false, false, {4, 9}));
  t.push_back(layer_norm_case(true, true, {70, 5}));  // the parameter gradients over several row blocks
  t.push_back(rms_norm_case({2, 3, 16}));
  t.push_back(rms_norm_case({4, 7}, /*weight=*/false));
  t.push_back(view_case("rms_norm_plain_of_transposed", {4, 7},
                        [](const Tensor& x) { return rms_norm(x.transpose(0, 1), Tensor(), 1e-6); },
                        [](const Array& x) { return ref::rms_norm(ref::permute(x, {1, 0}), nullptr, 1e-6); }));
  {  // a transposed table and strided ids: [[1, 2], [3, 0]]
    Rng r(hash_name("embedding_of_transposed_table_strided_ids"));
    t.push_back(two_input_case(
        "embedding_of_transposed_table_strided_ids", floating("table", {3, 4}, r.uniform_vector(12, -1, 1)),
        index_input("ids", {2, 2}, {1, 3, 2, 0}),
        [](const Tensor& table, const Tensor& ids) { return embedding(table.transpose(0, 1), ids.transpose(0, 1)); },
        [](const Array& table, const Array& ids) {
          return ref::embedding(ref::permute(table, {1, 0}), ref::permute(ids, {1, 0}));
        }));
  }
  t.push_back(cross_entropy_case("smoothing_1", {4, 5}, {1, 0, 4, 2}, 1.0, -100));  // the uniform term alone
  {  // transposed logits [3, 5] and strided targets [0, 4, 2]
    Rng r(hash_name("cross_entropy_transposed_logits_strided_targets"));
    t.push_back(two_input_case(
        "cross_entropy_transposed_logits_strided_targets", floating("logits", {5, 3}, r.uniform_vector(15, -2, 2)),
        index_input("targets", {6}, {0, 9, 4, 9, 2, 9}),
        [](const Tensor& x, const Tensor& targets) { return cross_entropy(x.transpose(0, 1), targets.slice(0, 0, 6, 2), 0.1); },
        [](const Array& x, const Array& targets) {
          return ref::cross_entropy(ref::permute(x, {1, 0}), ref::slice(targets, 0, 0, 6, 2), 0.1, -100);
        }));
  }
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

std::vector<OpCase> build_table() {
  std::vector<OpCase> t;

  // ---- unary elementwise
  t.push_back(unary_case("neg", [](const Tensor& x) { return neg(x); }, [](double x) { return -x; }));
  t.push_back(unary_case("neg_operator", [](const Tensor& x) { return -x; }, [](double x) { return -x; }));
  t.push_back(unary_case("exp", [](const Tensor& x) { return exp(x); }, [](double x) { return std::exp(x); }));
  t.push_back(unary_case("exp_method", [](const Tensor& x) { return x.exp(); }, [](double x) { return std::exp(x); }));
  t.push_back(unary_case("log", [](const Tensor& x) { return log(x); }, [](double x) { return std::log(x); },
                         uniform_gen(0.2, 3)));
  t.push_back(unary_case("sqrt", [](const Tensor& x) { return sqrt(x); }, [](double x) { return std::sqrt(x); },
                         uniform_gen(0.2, 3)));
  t.push_back(unary_case("abs", [](const Tensor& x) { return abs(x); }, [](double x) { return std::abs(x); },
                         away_gen(-2, 2, {0.0}, 0.1)));
  t.push_back(unary_case("tanh", [](const Tensor& x) { return tanh(x); }, [](double x) { return std::tanh(x); }));
  t.push_back(unary_case("sigmoid", [](const Tensor& x) { return sigmoid(x); }, sigmoid_d, uniform_gen(-4, 4)));
  t.push_back(unary_case("relu", [](const Tensor& x) { return relu(x); }, [](double x) { return x > 0 || std::isnan(x) ? x : 0.0; },
                         away_gen(-2, 2, {0.0}, 0.1)));
  t.push_back(unary_case("gelu", [](const Tensor& x) { return gelu(x); }, gelu_d, uniform_gen(-3, 3)));
  t.push_back(unary_case("gelu_tanh", [](const Tensor& x) { return gelu(x, true); }, gelu_tanh_d, uniform_gen(-3, 3)));
  t.push_back(unary_case("silu", [](const Tensor& x) { return silu(x); }, [](double x) { return x * sigmoid_d(x); },
                         uniform_gen(-4, 4)));
  t.push_back(unary_case("pow_2_5", [](const Tensor& x) { return pow(x, 2.5); },
                         [](double x) { return std::pow(x, 2.5); }, uniform_gen(0.2, 2)));
  t.push_back(unary_case("pow_3_signed", [](const Tensor& x) { return pow(x, 3.0); },
                         [](double x) { return x * x * x; }));
  t.push_back(unary_case("pow_m1_5", [](const Tensor& x) { return pow(x, -1.5); },
                         [](double x) { return std::pow(x, -1.5); }, uniform_gen(0.5, 2)));
  t.push_back(unary_case("square", [](const Tensor& x) { return square(x); }, [](double x) { return x * x; }));
  t.push_back(unary_case("add_scalar", [](const Tensor& x) { return add_scalar(x, 1.75); },
                         [](double x) { return x + 1.75; }));
  t.push_back(unary_case("add_scalar_operators", [](const Tensor& x) { return (x + 2.0) - 0.5; },
                         [](double x) { return x + 1.5; }));
  t.push_back(unary_case("mul_scalar", [](const Tensor& x) { return mul_scalar(x, -2.5); },
                         [](double x) { return x * -2.5; }));
  t.push_back(unary_case("mul_scalar_operators", [](const Tensor& x) { return (x * 3.0) / 4.0; },
                         [](double x) { return x * 0.75; }));
  // strided (non-contiguous) inputs go through the kernels' general path
  t.push_back(view_case("tanh_of_transposed", {3, 4}, [](const Tensor& x) { return tanh(x.transpose(0, 1)); },
                        [](const Array& x) { return ref::map(ref::permute(x, {1, 0}), [](double v) { return std::tanh(v); }); }));
  t.push_back(view_case("exp_of_strided_slice", {4, 6}, [](const Tensor& x) { return exp(x.slice(1, 1, 6, 2)); },
                        [](const Array& x) { return ref::map(ref::slice(x, 1, 1, 6, 2), [](double v) { return std::exp(v); }); }));

  // ---- binary elementwise with broadcasting
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

  // ---- reductions
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

  // ---- matmul
  t.push_back(matmul_case("nn", {3, 4}, {4, 5}, false, false));
  t.push_back(matmul_case("tn", {4, 3}, {4, 5}, true, false));
  t.push_back(matmul_case("nt", {3, 4}, {5, 4}, false, true));
  t.push_back(matmul_case("tt", {4, 3}, {5, 4}, true, true));
  t.push_back(matmul_case("batched", {2, 3, 4}, {2, 4, 5}, false, false));
  t.push_back(matmul_case("batched_tt", {2, 4, 3}, {2, 5, 4}, true, true));
  t.push_back(matmul_case("batched_by_2d", {2, 3, 4}, {4, 5}, false, false));
  t.push_back(matmul_case("batched_by_2d_nt", {2, 3, 4}, {5, 4}, false, true));
  t.push_back(matmul_case("batched_by_2d_tn", {2, 4, 3}, {4, 5}, true, false));
  t.push_back(matmul_case("2d_by_batched", {3, 4}, {2, 4, 5}, false, false));
  t.push_back(matmul_case("bcast_batch", {2, 1, 3, 4}, {3, 4, 5}, false, false));
  t.push_back(matmul_case("bcast_batch_tt", {2, 1, 4, 3}, {3, 5, 4}, true, true));
  t.push_back(matmul_case("outer_k1", {3, 1}, {1, 4}, false, false));
  {
    OpCase c = matmul_case("view_operands", {4, 3}, {5, 4}, false, false);
    c.name = "matmul_view_operands_transposed_views";
    c.apply = [](const TensorList& in) { return TensorList{matmul(in[0].transpose(0, 1), in[1].transpose(0, 1))}; };
    c.reference = [](const std::vector<Array>& a) { return std::vector<Array>{ref::matmul(a[0], a[1], true, true)}; };
    t.push_back(c);
  }
  {
    OpCase c = matmul_case("sliced", {3, 8}, {4, 5}, false, false);
    c.name = "matmul_strided_slice_operand";
    c.apply = [](const TensorList& in) { return TensorList{matmul(in[0].slice(1, 0, 8, 2), in[1])}; };
    c.reference = [](const std::vector<Array>& a) {
      return std::vector<Array>{ref::matmul(ref::slice(a[0], 1, 0, 8, 2), a[1], false, false)};
    };
    t.push_back(c);
  }

  // ---- softmax family
  for (bool log : {false, true}) {
    t.push_back(softmax_case(log, {2, 3, 4}, -1));
    t.push_back(softmax_case(log, {2, 3, 4}, 1));
    t.push_back(softmax_case(log, {2, 3, 4}, 0));
    t.push_back(softmax_case(log, {5}, 0));
  }

  // ---- normalisation
  t.push_back(layer_norm_case(true, true, {2, 3, 5}));
  t.push_back(layer_norm_case(false, false, {2, 3, 5}));
  t.push_back(layer_norm_case(true, false, {4, 6}));
  t.push_back(layer_norm_case(false, true, {4, 6}));
  t.push_back(rms_norm_case({2, 3, 5}));
  t.push_back(rms_norm_case({4, 6}));

  // ---- indexing and losses
  t.push_back(embedding_case({5, 3}, {2, 3}, {0, 2, 2, 4, 1, 2}));  // repeated ids accumulate
  t.push_back(embedding_case({4, 2}, {5}, {3, 3, 0, 1, 3}));
  t.push_back(cross_entropy_case("plain", {4, 5}, {1, 0, 4, 2}, 0.0, -100));
  t.push_back(cross_entropy_case("smoothing", {4, 5}, {1, 0, 4, 2}, 0.1, -100));
  t.push_back(cross_entropy_case("ignore_default", {4, 5}, {3, -100, 0, 4}, 0.0, -100));
  t.push_back(cross_entropy_case("ignore_custom_smoothing", {5, 3}, {2, 1, 2, 0, 1}, 0.2, 2));
  t.push_back(dropout_case({4, 8}, 0.3, {1234, 8}));
  t.push_back(dropout_case({2, 3, 5}, 0.5, {77, 0}));

  // ---- joining and splitting
  t.push_back(concat_case({{2, 3}, {2, 2}}, 1));
  t.push_back(concat_case({{1, 3}, {2, 3}}, 0));
  t.push_back(concat_case({{2, 1, 2}, {2, 3, 2}, {2, 2, 2}}, -2));
  t.push_back(split_case({2, 5}, {2, 3}, 1));
  t.push_back(split_case({4, 3}, {1, 3}, 0));
  t.push_back(split_case({2, 6}, {1, 2, 3}, -1));

  // ---- views and copies
  t.push_back(view_case("reshape_2x3x4_to_6x4", {2, 3, 4}, [](const Tensor& x) { return x.reshape({6, 4}); },
                        [](const Array& x) { return ref::reshape(x, {6, 4}); }));
  t.push_back(view_case("reshape_infer", {2, 3, 4}, [](const Tensor& x) { return x.reshape({4, -1}); },
                        [](const Array& x) { return ref::reshape(x, {4, 6}); }));
  t.push_back(view_case("reshape_of_transposed_copies", {3, 4},
                        [](const Tensor& x) { return x.transpose(0, 1).reshape({2, 6}); },
                        [](const Array& x) { return ref::reshape(ref::permute(x, {1, 0}), {2, 6}); }));
  t.push_back(view_case("view_2x6", {3, 4}, [](const Tensor& x) { return x.view({2, 6}); },
                        [](const Array& x) { return ref::reshape(x, {2, 6}); }));
  t.push_back(view_case("flatten", {2, 3, 2}, [](const Tensor& x) { return x.flatten(); },
                        [](const Array& x) { return ref::reshape(x, {12}); }));
  t.push_back(view_case("permute_201", {2, 3, 4}, [](const Tensor& x) { return x.permute({2, 0, 1}); },
                        [](const Array& x) { return ref::permute(x, {2, 0, 1}); }));
  t.push_back(view_case("permute_negative_axes", {2, 3, 4}, [](const Tensor& x) { return x.permute({-1, -3, -2}); },
                        [](const Array& x) { return ref::permute(x, {2, 0, 1}); }));
  t.push_back(view_case("transpose_0_2", {2, 3, 4}, [](const Tensor& x) { return x.transpose(0, 2); },
                        [](const Array& x) { return ref::permute(x, {2, 1, 0}); }));
  t.push_back(view_case("transpose_m1_m2", {2, 3, 4}, [](const Tensor& x) { return x.transpose(-1, -2); },
                        [](const Array& x) { return ref::permute(x, {0, 2, 1}); }));
  t.push_back(view_case("slice_step2", {2, 5, 3}, [](const Tensor& x) { return x.slice(1, 0, 5, 2); },
                        [](const Array& x) { return ref::slice(x, 1, 0, 5, 2); }));
  t.push_back(view_case("slice_step3_offset", {7, 2}, [](const Tensor& x) { return x.slice(0, 1, 7, 3); },
                        [](const Array& x) { return ref::slice(x, 0, 1, 7, 3); }));
  t.push_back(view_case("slice_negative_bounds", {3, 5}, [](const Tensor& x) { return x.slice(-1, -4, -1); },
                        [](const Array& x) { return ref::slice(x, 1, 1, 4, 1); }));
  t.push_back(view_case("slice_clamped_stop", {4, 3}, [](const Tensor& x) { return x.slice(0, 2, 100); },
                        [](const Array& x) { return ref::slice(x, 0, 2, 4, 1); }));
  t.push_back(view_case("slice_of_slice", {6, 4}, [](const Tensor& x) { return x.slice(0, 1, 6, 2).slice(1, 1, 4, 2); },
                        [](const Array& x) { return ref::slice(ref::slice(x, 0, 1, 6, 2), 1, 1, 4, 2); }));
  t.push_back(view_case("expand_3x1_to_2x3x4", {3, 1}, [](const Tensor& x) { return x.expand({2, 3, 4}); },
                        [](const Array& x) { return ref::expand(x, {2, 3, 4}); }));
  t.push_back(view_case("expand_keep_minus1", {1, 3}, [](const Tensor& x) { return x.expand({4, -1}); },
                        [](const Array& x) { return ref::expand(x, {4, 3}); }));
  t.push_back(view_case("unsqueeze_0", {2, 3}, [](const Tensor& x) { return x.unsqueeze(0); },
                        [](const Array& x) { return ref::reshape(x, {1, 2, 3}); }));
  t.push_back(view_case("unsqueeze_m1", {2, 3}, [](const Tensor& x) { return x.unsqueeze(-1); },
                        [](const Array& x) { return ref::reshape(x, {2, 3, 1}); }));
  t.push_back(view_case("squeeze_1", {2, 1, 3}, [](const Tensor& x) { return x.squeeze(1); },
                        [](const Array& x) { return ref::reshape(x, {2, 3}); }));
  t.push_back(view_case("squeeze_of_transposed", {3, 1, 2}, [](const Tensor& x) { return x.transpose(0, 2).squeeze(1); },
                        [](const Array& x) { return ref::reshape(ref::permute(x, {2, 1, 0}), {2, 3}); }));
  t.push_back(view_case("contiguous_of_transposed", {3, 4}, [](const Tensor& x) { return x.transpose(0, 1).contiguous(); },
                        [](const Array& x) { return ref::permute(x, {1, 0}); }));
  t.push_back(view_case("contiguous_noop", {3, 4}, [](const Tensor& x) { return x.contiguous(); },
                        [](const Array& x) { return x; }));
  t.push_back(view_case("clone", {3, 4}, [](const Tensor& x) { return x.clone(); }, [](const Array& x) { return x; }));
  t.push_back(view_case("clone_of_slice", {3, 4}, [](const Tensor& x) { return x.slice(1, 1, 4, 2).clone(); },
                        [](const Array& x) { return ref::slice(x, 1, 1, 4, 2); }));
  t.push_back(view_case("to_other_dtype", {3, 4},
                        [](const Tensor& x) { return x.to(x.dtype() == DType::f32 ? DType::f64 : DType::f32); },
                        [](const Array& x) { return x; }));
  t.push_back(view_case("to_same_dtype", {3, 4}, [](const Tensor& x) { return x.to(x.dtype()); },
                        [](const Array& x) { return x; }));
  t.push_back(view_case("to_other_dtype_and_back_mul", {2, 3},
                        [](const Tensor& x) {
                          Tensor y = x.to(x.dtype() == DType::f32 ? DType::f64 : DType::f32);
                          return mul(y, y).to(x.dtype());
                        },
                        [](const Array& x) { return ref::map(x, [](double v) { return v * v; }); }));
  t.back().computes_in_f32 = true;
  // Tensor::to(Device): to the other device (the emulated one from the CPU, the CPU from it), an op
  // there, and back; the gradient crosses both ways.
  t.push_back(view_case("to_device_and_back_mul", {2, 3},
                        [](const Tensor& x) {
                          const Device other = x.device() == kCpu ? emulated_device() : kCpu;
                          Tensor y = x.to(other);
                          return mul(y, y).to(x.device());
                        },
                        [](const Array& x) { return ref::map(x, [](double v) { return v * v; }); }));

  // ---- issue 17: convolution, pooling, batch norm, diagonal, general einsum (op_rows_conv.h)
  for (auto& c : conv_pool_norm_einsum_rows()) t.push_back(std::move(c));
  add_attention_rows(t);  // issue 14
  add_wide_row_cases(t);  // issue 14
  add_row_kernel_cases(t);
  return t;
}

const std::vector<OpCase>& op_table() {
  static const std::vector<OpCase> table = build_table();
  return table;
}

// The device axis: 0 the CPU, 1 the test-only emulated device (emulated_backend.h), 2 cuda:0 in a
// build with the CUDA backend (each row skipped, with the reason, where no GPU is usable). A new
// backend adds its device here and runs every row. On cuda:0 a row is checked against the float64
// reference and finite differences with the CPU's tolerances (forward_tolerance: f32 2e-5 + 1e-4
// relative, f64 1e-10 + 1e-9 relative; the row's grad_tol_f32 / grad_tol_f64), not bit for bit
// against the CPU: the GPU sums in other orders.
Device device_of_axis(int axis) {
  return axis == 0 ? kCpu : axis == 1 ? emulated_device() : Device{DeviceType::cuda, 0};
}
std::vector<int> device_axes() {
  return compiled_backends().size() > 1 ? std::vector<int>{0, 1, 2} : std::vector<int>{0, 1};
}

class OpTest : public ::testing::TestWithParam<std::tuple<size_t, DType, int>> {
 protected:
  const OpCase& op() const { return op_table()[std::get<0>(GetParam())]; }
  DType dtype() const { return std::get<1>(GetParam()); }
  Device device() const { return device_of_axis(std::get<2>(GetParam())); }
};

// One test per (row, dtype, device) runs the checks (one process per test under ctest: fewer,
// larger tests keep the suite fast, also under sanitizers); each check reports on its own.
TEST_P(OpTest, ForwardAndGradient) {
  if (device().type == DeviceType::cuda) {
    if (device_count(DeviceType::cuda) == 0) GTEST_SKIP() << "no CUDA device: " << unavailable_reason(DeviceType::cuda);
    use_device(device());
  }
  const std::string where = " [" + std::string(dtype_name(dtype())) + ", " + device_name(device()) + "] ";
  CheckResult f = check_forward(op(), dtype(), device());
  EXPECT_TRUE(f.ok) << op().name << where << "forward differs from the reference:\n" << f.message;
  if (device().type == DeviceType::emulated) {
    CheckResult same = check_matches_cpu(op(), dtype(), device());
    EXPECT_TRUE(same.ok) << same.message;
  }
  if (!op().differentiable) {
    Inputs inputs = inputs_of(op());
    TensorList outs = op().apply(tensors_of(inputs, dtype(), /*with_grad=*/true, device()));
    for (const auto& out : outs) EXPECT_FALSE(out.requires_grad()) << op().name << " output should carry no gradient";
    return;
  }
  CheckResult g = check_case_gradient(op(), dtype(), gradient_on(device()));
  EXPECT_TRUE(g.ok) << op().name << where << "gradient differs from finite differences:\n" << g.message;
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTest,
                         ::testing::Combine(::testing::Range<size_t>(0, op_table().size()),
                                            ::testing::Values(DType::f32, DType::f64), ::testing::ValuesIn(device_axes())),
                         [](const ::testing::TestParamInfo<OpTest::ParamType>& info) {
                           std::string name = op_table()[std::get<0>(info.param)].name + "_" +
                                              dtype_name(std::get<1>(info.param));
                           if (std::get<2>(info.param) != 0) name += "_" + device_name(device_of_axis(std::get<2>(info.param)));
                           for (auto& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

// ---- the table covers every op of remat/ops.h

TEST(OpTable, CoversEveryOp) {
  const std::vector<std::string> ops = {
      "neg", "exp", "log", "sqrt", "abs", "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "silu", "pow", "square",
      "add_scalar", "mul_scalar", "add", "sub", "mul", "div", "maximum", "minimum", "where", "masked_fill", "operators",
      "sum_to", "sum", "mean", "max", "argmax", "matmul", "softmax", "log_softmax", "layer_norm", "rms_norm",
      "embedding", "cross_entropy", "dropout", "concat", "split", "reshape", "view", "flatten", "permute",
      "transpose", "slice", "expand", "unsqueeze", "squeeze", "contiguous", "clone", "to",
      // issue 17
      "conv2d", "conv1d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "batch_norm_train", "batch_norm_eval",
      "diagonal", "einsum",
      // issue 14
      "scaled_dot_product_attention", "linear"};
  std::set<std::string> names;
  for (const auto& c : op_table()) {
    EXPECT_TRUE(names.insert(c.name).second) << "duplicate row " << c.name;
  }
  for (const auto& op : ops) {
    bool found = std::any_of(op_table().begin(), op_table().end(),
                             [&](const OpCase& c) { return c.name.rfind(op + "_", 0) == 0 || c.name == op; });
    EXPECT_TRUE(found) << "no row tests " << op;
  }
  // broadcasting pairs required for every binary op
  for (std::string op : {"add", "sub", "mul", "div", "maximum", "minimum"})
    for (std::string pair : {"_2x3_by_3", "_4x1x3_by_2x1", "_s_by_2x3"})
      EXPECT_TRUE(names.count(op + pair)) << "missing " << op + pair;
}

// ---- issue 17: every float32 convolution algorithm passes the conv2d rows (the table itself
// runs the automatic choice; float64 always runs im2col)

TEST(ConvAlgorithms, EveryFloat32AlgorithmPassesTheConvRows) {
  const ConvAlgorithm before = conv_algorithm();
  for (ConvAlgorithm a : {ConvAlgorithm::im2col_gemm, ConvAlgorithm::onednn_plain, ConvAlgorithm::onednn_blocked}) {
    set_conv_algorithm(a);
    for (const auto& row : conv2d_rows()) {
      OpCase c = conv2d_case(row);
      CheckResult f = check_forward(c, DType::f32);
      EXPECT_TRUE(f.ok) << c.name << " under " << conv_algorithm_name(a) << ":\n" << f.message;
      CheckResult g = check_case_gradient(c, DType::f32);
      EXPECT_TRUE(g.ok) << c.name << " under " << conv_algorithm_name(a) << ":\n" << g.message;
    }
  }
  set_conv_algorithm(before);
}

// ---- self-tests of the harness: a broken backward must make a test fail

// tanh whose backward forgets the square: g * (1 - y) instead of g * (1 - y^2).
TensorList wrong_tanh(const TensorList& in) {
  static const CustomOp op{"wrong_tanh",
                           [](const TensorList& x, SaveContext& ctx) {
                             Tensor y = tanh(x[0]);
                             ctx.save(y);
                             return TensorList{y};
                           },
                           [](const TensorList& g, const SavedValues& saved) {
                             return TensorList{mul(g[0], add_scalar(neg(saved[0]), 1.0))};
                           }};
  return op(in);
}

TEST(HarnessSelfTest, CorrectGradientPasses) {
  OpCase c = unary_case("tanh_selftest", [](const Tensor& x) { return tanh(x); }, [](double x) { return std::tanh(x); });
  for (DType d : {DType::f32, DType::f64}) EXPECT_TRUE(check_case_gradient(c, d).ok);
}

TEST(HarnessSelfTest, WrongBackwardIsReported) {
  OpCase c = unary_case("tanh_selftest", [](const Tensor& x) { return wrong_tanh({x})[0]; },
                        [](double x) { return std::tanh(x); });
  for (DType d : {DType::f32, DType::f64}) {
    EXPECT_TRUE(check_forward(c, d).ok);  // the forward is right...
    CheckResult r = check_case_gradient(c, d);
    EXPECT_FALSE(r.ok) << "a wrong backward passed the gradient check";  // ...the backward is not
    EXPECT_GT(r.mismatches, 0);
    EXPECT_NE(r.message.find("analytic"), std::string::npos) << r.message;
  }
}

TEST(HarnessSelfTest, WrongGradientFunctionIsReported) {
  // The checker is fed a gradient function that perturbs remat's (correct) gradient slightly.
  OpCase c = binary_case(Bin::mul, {2, 3}, {3});
  for (DType d : {DType::f32, DType::f64}) {
    ASSERT_TRUE(check_case_gradient(c, d).ok);
    double delta = d == DType::f64 ? 1e-3 : 2e-2;
    GradFn perturbed = [delta](const OpCase& oc, DType dt, const Inputs& in, const std::vector<Array>& w) {
      auto g = remat_gradient(oc, dt, in, w);
      g[1][2] += delta;
      return g;
    };
    CheckResult r = check_case_gradient(c, d, perturbed);
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.mismatches, 1) << r.message;
  }
}

TEST(HarnessSelfTest, MissingBroadcastReductionIsReported) {
  // A backward that forgets to sum the gradient over the broadcast axis (takes row 0 only).
  OpCase c = binary_case(Bin::add, {2, 3}, {3});
  GradFn forgetful = [](const OpCase& oc, DType dt, const Inputs& in, const std::vector<Array>& w) {
    auto g = remat_gradient(oc, dt, in, w);
    g[1] = std::vector<double>(w[0].v.begin(), w[0].v.begin() + 3);
    return g;
  };
  EXPECT_FALSE(check_case_gradient(c, DType::f64, forgetful).ok);
}

TEST(HarnessSelfTest, MissingGradientIsReported) {
  OpCase c = binary_case(Bin::sub, {2, 3}, {2, 3});
  GradFn none_for_b = [](const OpCase& oc, DType dt, const Inputs& in, const std::vector<Array>& w) {
    auto g = remat_gradient(oc, dt, in, w);
    g[1].clear();
    return g;
  };
  CheckResult r = check_case_gradient(c, DType::f64, none_for_b);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("no gradient"), std::string::npos) << r.message;
}

TEST(HarnessSelfTest, CheckerAloneDetectsWrongDerivative) {
  // f(x) = sum x_i^3; the "analytic" gradient 3x instead of 3x^2 must be reported.
  std::vector<std::vector<double>> x = {{0.5, -1.25, 2.0}};
  auto f = [](const std::vector<std::vector<double>>& v) {
    double s = 0;
    for (double e : v[0]) s += e * e * e;
    return s;
  };
  std::vector<std::vector<double>> right = {{0.75, 4.6875, 12.0}}, wrong = {{1.5, -3.75, 6.0}};
  EXPECT_TRUE(check_gradient(f, x, {true}, right, 1e-5).ok);
  CheckResult r = check_gradient(f, x, {true}, wrong, 1e-5);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.mismatches, 3);
}

TEST(HarnessSelfTest, WrongForwardIsReported) {
  OpCase c = unary_case("sigmoid_vs_tanh", [](const Tensor& x) { return sigmoid(x); },
                        [](double x) { return std::tanh(x); });
  EXPECT_FALSE(check_forward(c, DType::f32).ok);
  EXPECT_FALSE(check_forward(c, DType::f64).ok);
}

// ---- op behaviour beyond the table

TEST(Dropout, DefaultGeneratorDrawsFromItsCounter) {
  Tensor x = ones({4, 8}, DType::f64);
  RngState saved = rng_state();
  RngState start{2024, 16};
  set_rng_state(start);
  Tensor y = dropout(x, 0.25);
  RngState after = rng_state();
  set_rng_state(saved);
  EXPECT_EQ(after.seed, start.seed);
  EXPECT_GE(after.offset, start.offset + 32) << "dropout must claim one word per element";
  // the same mask as the explicit-state form
  Tensor z = dropout(x, 0.25, start);
  EXPECT_EQ(y.to_vector(), z.to_vector());
  auto keep = ref::dropout_mask(32, 0.25, start);
  auto yv = y.to_vector();
  for (size_t i = 0; i < yv.size(); ++i) EXPECT_DOUBLE_EQ(yv[i], keep[i] ? 1.0 / 0.75 : 0.0) << i;
}

TEST(Dropout, NotTrainingOrZeroProbabilityIsIdentity) {
  Tensor x = randn({3, 5}, DType::f32, RngState{5, 0});
  EXPECT_EQ(dropout(x, 0.5, /*training=*/false).to_vector(), x.to_vector());
  EXPECT_EQ(dropout(x, 0.0, RngState{9, 0}).to_vector(), x.to_vector());
}

TEST(Dropout, SameStateSameMaskDifferentStateDifferentMask) {
  Tensor x = ones({64}, DType::f32);
  auto a = dropout(x, 0.5, RngState{1, 0}).to_vector();
  auto b = dropout(x, 0.5, RngState{1, 0}).to_vector();
  auto c = dropout(x, 0.5, RngState{1, 64}).to_vector();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Argmax, KeepdimShapeAndDtype) {
  Tensor x = from_vector(std::vector<double>{1, 5, 3, 9, 2, 4}, {2, 3}, DType::f32);
  Tensor a = argmax(x, 1, true);
  EXPECT_EQ(a.dtype(), DType::i64);
  EXPECT_EQ(a.shape(), (Shape{2, 1}));
  EXPECT_EQ(a.to_vector(), (std::vector<double>{1, 0}));
  EXPECT_EQ(argmax(x, 0).to_vector(), (std::vector<double>{1, 0, 1}));
}

TEST(Split, OutputsAreViewsOfTheInputValues) {
  Tensor x = arange(10, DType::f64).reshape({2, 5});
  TensorList parts = split(x, {2, 3}, 1);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].shape(), (Shape{2, 2}));
  EXPECT_EQ(parts[1].shape(), (Shape{2, 3}));
  EXPECT_EQ(parts[1].to_vector(), (std::vector<double>{2, 3, 4, 7, 8, 9}));
  // concat undoes split
  EXPECT_EQ(concat(parts, 1).to_vector(), x.to_vector());
}

TEST(Split, GradientOfUnusedPartIsZero) {
  Tensor x = arange(6, DType::f64).reshape({6}).detach().requires_grad_();
  TensorList parts = split(x, {2, 4}, 0);
  sum(parts[1]).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0, 0, 1, 1, 1, 1}));
}

}  // namespace
