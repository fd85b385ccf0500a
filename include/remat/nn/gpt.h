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
// With config.tie_embeddings (as nanoGPT and GPT-2 do) lm_head's weight IS wte's weight: one
// parameter [vocab, width], listed once as "wte.weight" (named_parameters, num_parameters, the
// optimizer, weight files: no "lm_head.weight"), whose gradient is the sum of its two uses
// (the embedding lookup and the output projection), under every policy as under save-all.
// Under the default policy (every-layer) each block is a checkpoint region. The MLP's GELU is the
// exact one unless config.tanh_gelu (GPT-2's and Hugging Face's approximation).
//
// Initialisation (GPT-2 / nanoGPT): every Linear and Embedding weight ~ N(0, 0.02^2), except the
// residual projections (attn.proj.weight, mlp.proj.weight) ~ N(0, (0.02 / sqrt(2 * layers))^2);
// biases 0; LayerNorm weight 1, bias 0. The weights are drawn by reset_parameters(config.seed),
// so the same config gives the same model.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

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
  bool tanh_gelu = false;       // the MLP's GELU: exact (nanoGPT) or the tanh approximation (GPT-2, Hugging Face)
  bool tie_embeddings = false;  // lm_head's weight is wte's (one parameter; see below)
  // Mixed precision: the dtype the model computes in (bf16, f16), the parameters staying in
  // `dtype` (Module::set_compute_dtype); nullopt: compute in `dtype`.
  std::optional<DType> compute_dtype;
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

// ---- weight layouts of other tools
// nanoGPT's GPT (Karpathy) has the same structure, layouts ([out, in] Linear weights, q, k, v in
// that order in the attention's input projection) and exact GELU; only the names differ:
//   remat                      nanoGPT
//   wte.weight, wpe.weight     transformer.wte.weight, transformer.wpe.weight
//   blocks.N.ln1.*             transformer.h.N.ln_1.*
//   blocks.N.attn.qkv.*        transformer.h.N.attn.c_attn.*
//   blocks.N.attn.proj.*       transformer.h.N.attn.c_proj.*
//   blocks.N.ln2.*             transformer.h.N.ln_2.*
//   blocks.N.mlp.fc.*          transformer.h.N.mlp.c_fc.*
//   blocks.N.mlp.proj.*        transformer.h.N.mlp.c_proj.*
//   ln_f.*                     transformer.ln_f.*
//   lm_head.weight             lm_head.weight (nanoGPT ties it to wte; the safetensors package
//                              writes a shared tensor once, so a file without it is a tied model:
//                              load it into a GPT with tie_embeddings, as gpt_config_from_weights says)
// A nanoGPT file carries no architecture: gpt_config_from_weights reads it from the shapes (all
// but the number of heads), checking every tensor.
// nanoGPT trains with bias=False as an option: a file without the biases is refused by
// load_parameters (remat's GPT has them). Names of nanoGPT's non-parameter buffers
// (".attn.bias", the causal mask of its non-flash path) are dropped.
//
// Hugging Face's GPT2LMHeadModel has nanoGPT's names (nanoGPT took them from it), but its
// attention and MLP projections are Conv1D modules, whose weights are stored transposed:
// [in, out] where Linear has [out, in] (attn.c_attn.weight [C, 3C], attn.c_proj.weight [C, C],
// mlp.c_fc.weight [C, 4C], mlp.c_proj.weight [4C, C]); biases, embeddings and LayerNorms are as
// in nanoGPT. Its files may lack the "transformer." prefix (a GPT2Model's: "h.0.ln_1.weight",
// "wte.weight"), may hold the buffers "h.N.attn.bias" (the causal mask) and "h.N.attn.masked_bias"
// (a constant), which are dropped on load, and usually have no lm_head.weight (it is tied to
// wte). Hugging Face's GPT-2 uses the tanh approximation of GELU where nanoGPT and remat use the
// exact one: logits of a Hugging Face checkpoint computed by remat differ from its own by that.
// Which of nanoGPT and Hugging Face a file is cannot be told from its names: it is decided once
// per file by the first block's attn.c_attn.weight ([3C, C]: nanoGPT, [C, 3C]: Hugging Face),
// else its mlp.c_fc.weight ([4C, C] / [C, 4C]) (the square attn.c_proj cannot tell); every other
// tensor must then follow that layout, which gpt_config_from_weights checks (a file mixing both
// is an error naming the first tensor that disagrees, with the shape expected).
enum class GPTWeightNames { remat, nanogpt, hf_gpt2 };
// The layout of `tensors`: remat unless some name starts with "transformer." or "h."; then
// hf_gpt2 or nanogpt by the shapes, as above.
GPTWeightNames detect_gpt_weight_names(const std::map<std::string, Tensor>& tensors);
// `tensors` renamed from `from` to remat's names (the tensors themselves are shared, not copied,
// except Hugging Face's 2-d Conv1D weights, which are transposed into new tensors). A name the
// map does not know is kept as it is (load_parameters then names it as unexpected).
std::map<std::string, Tensor> gpt_weights_to_remat(const std::map<std::string, Tensor>& tensors, GPTWeightNames from);
// remat-named tensors renamed to `to` (lm_head.weight kept if there is one: a tied model's
// named_parameters() have none, and neither does its file; for hf_gpt2
// the Conv1D weights are transposed views, with the "transformer." prefix of GPT2LMHeadModel).
std::map<std::string, Tensor> gpt_weights_from_remat(const std::map<std::string, Tensor>& tensors, GPTWeightNames to);
// The name `remat_name` has in the layout `to`.
std::string gpt_weight_name(const std::string& remat_name, GPTWeightNames to);

// The architecture of GPT weights that carry no description of it (a nanoGPT state_dict saved by
// the safetensors package has none), read from the shapes of remat-named `tensors` (as
// gpt_weights_to_remat gives them): vocab and width from wte.weight [vocab, width], seq from
// wpe.weight [seq, width], layers from the blocks 0 .. layers-1 present. The number of heads
// cannot be read from any shape (it only splits the width): it is `heads`, which must divide the
// width. Every tensor of that model must be there with its shape, and nothing else (lm_head.weight
// may be absent: the model then has tie_embeddings); otherwise one
// remat::Error names `source` and, under its name in `layout` (the file's), every tensor that is
// missing, unknown or of the wrong shape, with the shape expected and the shape found.
GPTConfig gpt_config_from_weights(const std::map<std::string, Tensor>& tensors, int64_t heads, GPTWeightNames layout,
                                  const std::string& source);

}  // namespace remat::nn
