// The fused attention rows (src/autodiff/ops/attention.cpp) against a float64 written-out attention.
#include "op_rows/builders.h"
namespace remat::test {

namespace {

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

}  // namespace

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

}  // namespace remat::test
