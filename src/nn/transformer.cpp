// Causal self-attention, MLP and the pre-norm transformer block.
#include "remat/nn/transformer.h"

#include <cmath>
#include <limits>

#include "remat/backend.h"
#include "remat/ops.h"

namespace remat::nn {

namespace {

// [T, T] on `device`, nonzero where the key position is after the query position (to be masked):
// relu(key - query) over two aranges, by the device's kernels (no host loop, no host copy; plain
// kernels, so the mask is not an op of the tape). f64 positions are exact for any T.
Tensor future_mask(int64_t t, Device device) {
  Tensor pos = arange(t, DType::f64, device);
  Tensor diff = Tensor::empty({t, t}, DType::f64, memory::Tag::other, device);
  Backend& b = backend(device);
  b.binary(BinaryOp::sub, pos.view({1, t}), pos.view({t, 1}), diff);
  b.unary(UnaryOp::relu, diff, diff, 0.0);
  return diff;
}

}  // namespace

// ---- CausalSelfAttention

CausalSelfAttention::CausalSelfAttention(int64_t width, int64_t heads, double attn_dropout, double resid_dropout,
                                         DType dtype, bool fused)
    : width_(width), heads_(heads), attn_dropout_(attn_dropout), resid_dropout_(resid_dropout), fused_(fused) {
  REMAT_CHECK(width > 0 && heads > 0 && width % heads == 0, "CausalSelfAttention: width ", width,
              " must be a positive multiple of the number of heads ", heads);
  REMAT_CHECK(attn_dropout >= 0 && attn_dropout <= 1 && resid_dropout >= 0 && resid_dropout <= 1,
              "CausalSelfAttention: dropout probabilities ", attn_dropout, ", ", resid_dropout, " are outside [0, 1]");
  qkv = register_module("qkv", std::make_shared<Linear>(width, 3 * width, true, dtype));
  proj = register_module("proj", std::make_shared<Linear>(width, width, true, dtype));
}

std::string CausalSelfAttention::type_name() const {
  return detail::concat("CausalSelfAttention(width ", width_, ", heads ", heads_, ")");
}

Tensor CausalSelfAttention::forward_impl(const Tensor& x) {
  REMAT_CHECK(x.defined() && x.dim() == 3 && x.size(2) == width_, type_name(), ": expects x of shape [B, T, ", width_,
              "], got ", x.defined() ? shape_str(x.shape()) : "an undefined tensor");
  const int64_t b = x.size(0), t = x.size(1), c = width_, h = heads_, d = c / h;
  TensorList parts = split(qkv->forward(x), {c, c, c}, -1);  // 3 x [B, T, C]
  auto heads_first = [&](const Tensor& z) { return z.reshape({b, t, h, d}).permute({0, 2, 1, 3}); };
  Tensor q = heads_first(parts[0]), k = heads_first(parts[1]), v = heads_first(parts[2]);  // [B, H, T, D] views
  Tensor y;
  if (fused_) {
    // one op: keeps q, k, v, y and a log-sum-exp per row, never the [B, H, T, T] probabilities
    y = scaled_dot_product_attention(q, k, v, /*causal=*/true, attn_dropout_, training());
  } else {
    Tensor scores = mul_scalar(matmul(q, k, false, true), 1.0 / std::sqrt(static_cast<double>(d)));  // [B, H, T, T]
    scores = masked_fill(scores, future_mask(t, scores.device()), -std::numeric_limits<double>::infinity());
    y = matmul(dropout(softmax(scores, -1), attn_dropout_, training()), v);
  }
  y = y.permute({0, 2, 1, 3}).reshape({b, t, c});  // [B, T, C] (a view for the fused op)
  return dropout(proj->forward(y), resid_dropout_, training());
}

// ---- MLP

MLP::MLP(int64_t width, double dropout, DType dtype, int64_t hidden, bool tanh_gelu)
    : tanh_gelu_(tanh_gelu), dropout_(dropout) {
  REMAT_CHECK(width > 0 && hidden >= 0, "MLP: width ", width, " must be positive and hidden ", hidden,
              " non-negative");
  REMAT_CHECK(dropout >= 0 && dropout <= 1, "MLP: dropout probability ", dropout, " is outside [0, 1]");
  if (hidden == 0) hidden = 4 * width;
  fc = register_module("fc", std::make_shared<Linear>(width, hidden, true, dtype));
  proj = register_module("proj", std::make_shared<Linear>(hidden, width, true, dtype));
}

Tensor MLP::forward_impl(const Tensor& x) {
  return dropout(proj->forward(gelu(fc->forward(x), tanh_gelu_)), dropout_, training());
}

// ---- TransformerBlock

TransformerBlock::TransformerBlock(int64_t width, int64_t heads, double dropout, DType dtype, bool fused_attention,
                                   bool tanh_gelu) {
  ln1 = register_module("ln1", std::make_shared<LayerNorm>(width, 1e-5, true, dtype));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(width, heads, dropout, dropout, dtype,
                                                                       fused_attention));
  ln2 = register_module("ln2", std::make_shared<LayerNorm>(width, 1e-5, true, dtype));
  mlp = register_module("mlp", std::make_shared<MLP>(width, dropout, dtype, 0, tanh_gelu));
}

Tensor TransformerBlock::forward_impl(const Tensor& x) {
  // h = x + attn(ln1(x)) and ln2(h) in one op (add_layer_norm): the bits of the add and the norm
  TensorList hn = ln2->forward(TensorList{x, attn->forward(ln1->forward(x))});
  return add(hn[0], mlp->forward(hn[1]));
}

}  // namespace remat::nn
