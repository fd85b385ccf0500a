// remat/nn/gpt.h - a GPT-2 style decoder-only language model.
//
//   remat::nn::GPTConfig config{.vocab = 256, .layers = 4, .width = 128, .heads = 4, .seq = 64};
//   auto model = std::make_shared<remat::nn::GPT>(config);
//   Tensor logits = model->forward(ids);            // ids [B, T] i64 -> logits [B, T, vocab]
//   Tensor loss = model->loss(ids, targets);        // mean cross entropy over B * T positions
//
// Structure and parameter names:
//   wte     Embedding(vocab, width)                    token embedding
//   wpe     Embedding(seq, width)                      position embedding
//   drop    Dropout(dropout)
//   blocks  Sequential of `layers` TransformerBlock    "blocks.3.attn.qkv.weight", ...
//   ln_f    LayerNorm(width)
//   lm_head Linear(width, vocab, no bias)
// Under the default policy (every-layer) each block is a checkpoint region.
//
// Initialisation (GPT-2 / nanoGPT): every Linear and Embedding weight ~ N(0, 0.02^2), except the
// residual projections (attn.proj.weight, mlp.proj.weight) ~ N(0, (0.02 / sqrt(2 * layers))^2);
// biases 0; LayerNorm weight 1, bias 0. The weights are drawn by reset_parameters(config.seed),
// so the same config gives the same model.
#pragma once

#include <cstdint>
#include <memory>

#include "remat/nn/containers.h"
#include "remat/nn/layers.h"
#include "remat/nn/transformer.h"

namespace remat::nn {

struct GPTConfig {
  int64_t vocab = 50257;  // GPT-2 small by default
  int64_t layers = 12;
  int64_t width = 768;
  int64_t heads = 12;
  int64_t seq = 1024;     // the longest sequence (rows of wpe)
  double dropout = 0.0;
  DType dtype = DType::f32;
  uint64_t seed = 0;      // the initialisation seed
  bool fused_attention = true;  // false: attention written out (scores, mask, softmax; keeps [B, H, T, T])
};

class GPT : public Module {
 public:
  explicit GPT(const GPTConfig& config);
  // ids [B, T] i64, T <= seq -> logits [B, T, vocab]
  Tensor forward_impl(const Tensor& ids) override;
  // Mean cross entropy of forward(ids) against targets [B, T] (i64; ignore_index rows skipped).
  Tensor loss(const Tensor& ids, const Tensor& targets, double label_smoothing = 0.0, int64_t ignore_index = -100);
  std::string type_name() const override;
  const GPTConfig& config() const { return config_; }

  std::shared_ptr<Embedding> wte, wpe;
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<Sequential> blocks;
  std::shared_ptr<LayerNorm> ln_f;
  std::shared_ptr<Linear> lm_head;

 private:
  GPTConfig config_;
};

}  // namespace remat::nn
