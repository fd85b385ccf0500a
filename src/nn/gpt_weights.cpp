// Renaming GPT weights between remat's names and nanoGPT's (see remat/nn/gpt.h).
#include <string_view>
#include <utility>

#include "remat/nn/gpt.h"

namespace remat::nn {

namespace {

// Block-level name pairs (remat, nanoGPT), after "blocks.N." / "transformer.h.N.".
constexpr std::pair<std::string_view, std::string_view> kBlockNames[] = {
    {"ln1.", "ln_1."},           {"ln2.", "ln_2."},           {"attn.qkv.", "attn.c_attn."},
    {"attn.proj.", "attn.c_proj."}, {"mlp.fc.", "mlp.c_fc."}, {"mlp.proj.", "mlp.c_proj."}};
// Top-level pairs.
constexpr std::pair<std::string_view, std::string_view> kTopNames[] = {
    {"wte.", "transformer.wte."}, {"wpe.", "transformer.wpe."}, {"ln_f.", "transformer.ln_f."},
    {"lm_head.", "lm_head."}};

// Replaces the prefix `from` of `name` by `to`; false if `name` does not start with `from`.
bool swap_prefix(std::string& name, std::string_view from, std::string_view to) {
  if (!std::string_view(name).starts_with(from)) return false;
  name = std::string(to) + name.substr(from.size());
  return true;
}

// "PREFIX" N "." REST -> block number and REST; false if `name` is not a block name.
bool split_block(const std::string& name, std::string_view prefix, std::string& number, std::string& rest) {
  if (!std::string_view(name).starts_with(prefix)) return false;
  size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size()) return false;
  number = name.substr(prefix.size(), dot - prefix.size());
  for (char c : number)
    if (c < '0' || c > '9') return false;
  rest = name.substr(dot + 1);
  return true;
}

// One name from one side to the other; `to_remat` picks the direction.
std::string rename(const std::string& name, bool to_remat) {
  std::string number, rest;
  if (split_block(name, to_remat ? "transformer.h." : "blocks.", number, rest)) {
    for (const auto& [remat_name, nano_name] : kBlockNames) {
      std::string r = rest;
      if (swap_prefix(r, to_remat ? nano_name : remat_name, to_remat ? remat_name : nano_name))
        return (to_remat ? "blocks." : "transformer.h.") + number + "." + r;
    }
    return name;
  }
  for (const auto& [remat_name, nano_name] : kTopNames) {
    std::string r = name;
    if (swap_prefix(r, to_remat ? nano_name : remat_name, to_remat ? remat_name : nano_name)) return r;
  }
  return name;
}

}  // namespace

GPTWeightNames detect_gpt_weight_names(const std::map<std::string, Tensor>& tensors) {
  for (const auto& [name, t] : tensors)
    if (std::string_view(name).starts_with("transformer.")) return GPTWeightNames::nanogpt;
  return GPTWeightNames::remat;
}

std::map<std::string, Tensor> gpt_weights_to_remat(const std::map<std::string, Tensor>& tensors, GPTWeightNames from) {
  if (from == GPTWeightNames::remat) return tensors;
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : tensors) {
    // nanoGPT's causal-mask buffer (transformer.h.N.attn.bias, 4-d) is not a parameter
    std::string number, rest;
    if (split_block(name, "transformer.h.", number, rest) && rest == "attn.bias" && t.defined() && t.dim() == 4) continue;
    std::string renamed = rename(name, true);
    REMAT_CHECK(out.count(renamed) == 0, "nanoGPT weights: \"", name, "\" and another tensor both map to \"", renamed, "\"");
    out.emplace(std::move(renamed), t);
  }
  if (out.count("lm_head.weight") == 0 && out.count("wte.weight") != 0)
    out.emplace("lm_head.weight", out.at("wte.weight"));  // tied in nanoGPT (load_parameters copies)
  return out;
}

std::map<std::string, Tensor> gpt_weights_from_remat(const std::map<std::string, Tensor>& tensors, GPTWeightNames to) {
  if (to == GPTWeightNames::remat) return tensors;
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : tensors) out.emplace(rename(name, false), t);
  return out;
}

}  // namespace remat::nn
