// The GPT model: embeddings, a Sequential of transformer blocks, final norm and head. Under the
// layer rule (remat/nn/module.h) the embeddings, every block, the final norm and the head are
// the model's layer calls.
#include "remat/nn/gpt.h"

#include <cmath>

#include "remat/nn/loss.h"
#include "remat/ops.h"

namespace remat::nn {

GPT::GPT(const GPTConfig& config) : config_(config) {
  REMAT_CHECK(config.vocab > 0 && config.layers >= 0 && config.width > 0 && config.heads > 0 && config.seq > 0,
              "GPT: invalid config (vocab ", config.vocab, ", layers ", config.layers, ", width ", config.width,
              ", heads ", config.heads, ", seq ", config.seq, ")");
  REMAT_CHECK(config.width % config.heads == 0, "GPT: width ", config.width, " is not a multiple of heads ",
              config.heads);
  const DType dt = config.dtype;
  wte = register_module("wte", std::make_shared<Embedding>(config.vocab, config.width, dt));
  wpe = register_module("wpe", std::make_shared<Embedding>(config.seq, config.width, dt));
  drop = register_module("drop", std::make_shared<Dropout>(config.dropout));
  // The embedding dropout keeps nothing for its backward: as a region of its own it would only add
  // a boundary. Transparent, it runs as part of the model's own code between layer calls.
  drop->set_transparent();
  blocks = register_module("blocks", std::make_shared<Sequential>());
  for (int64_t i = 0; i < config.layers; ++i)
    blocks->add(std::make_shared<TransformerBlock>(config.width, config.heads, config.dropout, dt,
                                                   config.fused_attention, config.tanh_gelu));
  ln_f = register_module("ln_f", std::make_shared<LayerNorm>(config.width, 1e-5, true, dt));
  lm_head = register_module("lm_head", std::make_shared<Linear>(config.width, config.vocab, false, dt));
  if (config.tie_embeddings) lm_head->tie_weight(wte->weight);  // [vocab, width] both

  // GPT-2 initialisation: N(0, 0.02^2) weights, residual projections scaled by 1/sqrt(2 * layers).
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(std::max<int64_t>(config.layers, 1)));
  for (const auto& [name, p] : named_parameters()) {
    const bool linear_weight = name.ends_with(".weight") && p.dim() == 2 && !name.starts_with("wte.") &&
                               !name.starts_with("wpe.");
    if (!linear_weight) continue;
    const bool residual = name.ends_with("attn.proj.weight") || name.ends_with("mlp.proj.weight");
    set_parameter_init(name, Init::normal(0.0, residual ? residual_std : 0.02));
  }
  reset_parameters(config.seed);
  if (config.compute_dtype && *config.compute_dtype != dt) set_compute_dtype(config.compute_dtype);
}

std::string GPT::type_name() const {
  return detail::concat("GPT(vocab ", config_.vocab, ", layers ", config_.layers, ", width ", config_.width,
                        ", heads ", config_.heads, ", seq ", config_.seq, config_.tie_embeddings ? ", tied" : "", ")");
}

Tensor GPT::forward_impl(const Tensor& ids) {
  REMAT_CHECK(ids.defined() && ids.dtype() == DType::i64 && ids.dim() == 2, type_name(),
              ": expects i64 token ids of shape [B, T], got ",
              ids.defined() ? detail::concat(dtype_name(ids.dtype()), " ", shape_str(ids.shape())) : "undefined");
  const int64_t t = ids.size(1);
  REMAT_CHECK(t <= config_.seq, type_name(), ": sequence length ", t, " exceeds the model's seq ", config_.seq);
  const Tensor positions = arange(t, DType::i64, ids.device());  // made on the device: no upload
  // wpe's layer call first, then wte's, in this order with every compiler (two calls as arguments of
  // one call run in an order the language leaves open, and the order is the plan's chain of stages)
  const Tensor pos = wpe->forward(positions);  // [T, C]
  Tensor x = add(wte->forward(ids), pos);      // [B, T, C] + [T, C]
  x = drop->forward(x);
  x = blocks->forward(x);
  return lm_head->forward(ln_f->forward(x));  // [B, T, V]
}

Tensor GPT::loss(const Tensor& ids, const Tensor& targets, double label_smoothing, int64_t ignore_index) {
  REMAT_CHECK(targets.defined() && ids.defined() && targets.shape() == ids.shape(), type_name(),
              ": targets must have the shape of the ids ", ids.defined() ? shape_str(ids.shape()) : "(undefined)",
              ", got ", targets.defined() ? shape_str(targets.shape()) : "an undefined tensor");
  return nn::cross_entropy(forward(ids), targets, label_smoothing, ignore_index);
}

}  // namespace remat::nn
