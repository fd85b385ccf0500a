// remat/nn/transformer.h - causal self-attention, the MLP and the pre-norm transformer block.
//
//   auto block = std::make_shared<remat::nn::TransformerBlock>(/*width=*/64, /*heads=*/4);
//   Tensor y = block->forward(x);        // x, y [B, T, 64]
//
// Names (as in nanoGPT): attention "qkv" (fused Linear C -> 3C) then "proj" (C -> C); MLP "fc"
// (C -> 4C), GELU, "proj" (4C -> C); block "ln1", "attn", "ln2", "mlp".
#pragma once

#include <cstdint>
#include <memory>

#include "remat/nn/layers.h"

namespace remat::nn {

// Multi-head causal self-attention on x [B, T, C] with H heads of size D = C / H:
//   q, k, v = split(qkv(x)) as [B, H, T, D]
//   att = softmax(mask_future(q @ k^T / sqrt(D)))          [B, H, T, T] (future: -inf)
//   y = proj(dropout(att) @ v as [B, T, C]), then dropout (resid_dropout)
// By default (fused) the attention is one scaled_dot_product_attention op, which never forms nor
// keeps att; fused = false writes it out with matmul, masked_fill, softmax and dropout ops (the
// same function and the same dropout mask; a reference for tests and benchmarks).
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t width, int64_t heads, double attn_dropout = 0.0, double resid_dropout = 0.0,
                      DType dtype = DType::f32, bool fused = true);
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override;
  std::shared_ptr<Linear> qkv, proj;

 private:
  int64_t width_, heads_;
  double attn_dropout_, resid_dropout_;
  bool fused_;
};

// proj(gelu(fc(x))), then dropout; hidden = 4 * width unless given.
class MLP : public Module {
 public:
  explicit MLP(int64_t width, double dropout = 0.0, DType dtype = DType::f32, int64_t hidden = 0,
               bool tanh_gelu = false);
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "MLP"; }
  std::shared_ptr<Linear> fc, proj;

 private:
  bool tanh_gelu_;
  double dropout_;
};

// Pre-norm block: x = x + attn(ln1(x)); x = x + mlp(ln2(x)). `dropout` applies to the attention
// weights, the attention output and the MLP output; `tanh_gelu` picks the MLP's GELU.
class TransformerBlock : public Module {
 public:
  TransformerBlock(int64_t width, int64_t heads, double dropout = 0.0, DType dtype = DType::f32,
                   bool fused_attention = true, bool tanh_gelu = false);
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "TransformerBlock"; }
  std::shared_ptr<LayerNorm> ln1, ln2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<MLP> mlp;
};

}  // namespace remat::nn
