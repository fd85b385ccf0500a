// Renaming GPT weights between remat's names and nanoGPT's (see remat/nn/gpt.h).
#include <set>
#include <sstream>
#include <string_view>
#include <utility>
#include <vector>

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

// One name from one side to the other; `to_remat` picks the direction. To remat, the prefix
// "transformer." is optional (Hugging Face's GPT2Model files have "h.N.", "wte.", "ln_f.").
std::string rename(const std::string& name, bool to_remat) {
  std::string number, rest;
  if (split_block(name, to_remat ? "transformer.h." : "blocks.", number, rest) ||
      (to_remat && split_block(name, "h.", number, rest))) {
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

// The block-level part of a nanoGPT / Hugging Face name ("attn.c_attn.weight"), or "".
std::string block_rest(const std::string& name) {
  std::string number, rest;
  if (split_block(name, "transformer.h.", number, rest) || split_block(name, "h.", number, rest)) return rest;
  return "";
}

// The weights of Hugging Face's Conv1D modules, stored [in, out] (block-level names).
bool is_conv1d_weight(std::string_view rest) {
  return rest == "attn.c_attn.weight" || rest == "attn.c_proj.weight" || rest == "mlp.c_fc.weight" ||
         rest == "mlp.c_proj.weight";
}
// The same for remat's names ("blocks.N.attn.qkv.weight", ...).
bool is_conv1d_weight_remat(const std::string& name) {
  std::string number, rest;
  return split_block(name, "blocks.", number, rest) &&
         (rest == "attn.qkv.weight" || rest == "attn.proj.weight" || rest == "mlp.fc.weight" || rest == "mlp.proj.weight");
}

Tensor transposed(const Tensor& t) { return t.transpose(0, 1).contiguous(); }

const char* layout_name(GPTWeightNames layout) {
  return layout == GPTWeightNames::hf_gpt2 ? "Hugging Face GPT-2" : layout == GPTWeightNames::nanogpt ? "nanoGPT" : "remat";
}

}  // namespace

GPTWeightNames detect_gpt_weight_names(const std::map<std::string, Tensor>& tensors) {
  bool theirs = false;
  for (const auto& [name, t] : tensors)
    theirs = theirs || std::string_view(name).starts_with("transformer.") || std::string_view(name).starts_with("h.");
  if (!theirs) return GPTWeightNames::remat;
  // nanoGPT's Linear [out, in] or Hugging Face's Conv1D [in, out]: told apart by the first
  // block's fused attention input (C -> 3C), else its MLP input (C -> 4C); the square ones
  // (c_proj of the attention) cannot tell
  for (const auto& [part, factor] : {std::pair<const char*, int64_t>{"attn.c_attn.weight", 3}, {"mlp.c_fc.weight", 4}})
    for (const auto& [name, t] : tensors) {
      if (block_rest(name) != part || !t.defined() || t.dim() != 2) continue;
      if (t.size(1) == factor * t.size(0)) return GPTWeightNames::hf_gpt2;
      if (t.size(0) == factor * t.size(1)) return GPTWeightNames::nanogpt;
    }
  return GPTWeightNames::nanogpt;
}

std::map<std::string, Tensor> gpt_weights_to_remat(const std::map<std::string, Tensor>& tensors, GPTWeightNames from) {
  if (from == GPTWeightNames::remat) return tensors;
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : tensors) {
    // the causal-mask buffers (h.N.attn.bias, 4-d, and Hugging Face's h.N.attn.masked_bias, a
    // scalar) are not parameters
    const std::string rest = block_rest(name);
    if (rest == "attn.bias" && t.defined() && t.dim() == 4) continue;
    if (rest == "attn.masked_bias" && from == GPTWeightNames::hf_gpt2) continue;
    std::string renamed = rename(name, true);
    REMAT_CHECK(out.count(renamed) == 0, layout_name(from), " weights: \"", name, "\" and another tensor both map to \"",
                renamed, "\"");
    // Conv1D [in, out] -> Linear [out, in]; a tensor that is not 2-d is left for the shape checks
    const bool transpose = from == GPTWeightNames::hf_gpt2 && is_conv1d_weight(rest) && t.defined() && t.dim() == 2;
    out.emplace(std::move(renamed), transpose ? transposed(t) : t);
  }
  return out;
}

std::map<std::string, Tensor> gpt_weights_from_remat(const std::map<std::string, Tensor>& tensors, GPTWeightNames to) {
  if (to == GPTWeightNames::remat) return tensors;
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : tensors) {
    // Hugging Face's Conv1D weights are [in, out]: a transposed view
    const bool transpose = to == GPTWeightNames::hf_gpt2 && is_conv1d_weight_remat(name) && t.defined() && t.dim() == 2;
    out.emplace(gpt_weight_name(name, to), transpose ? t.transpose(0, 1) : t);
  }
  return out;
}

std::string gpt_weight_name(const std::string& remat_name, GPTWeightNames to) {
  return to == GPTWeightNames::remat ? remat_name : rename(remat_name, false);
}

namespace {

// Block numbers are at most this many digits (a billion blocks would not fit any file anyway).
constexpr size_t kMaxBlockDigits = 9;

struct Expected {
  std::string name;  // remat's
  Shape shape;       // remat's orientation
};

// Names and shapes as the file has them, for errors.
struct FileNames {
  GPTWeightNames layout;
  std::string name(const std::string& remat_name) const {
    return detail::concat("\"", gpt_weight_name(remat_name, layout), "\"");
  }
  // Hugging Face's Conv1D weights are [in, out] in the file (2-d ones were transposed)
  std::string shape(const std::string& remat_name, Shape shape) const {
    if (layout == GPTWeightNames::hf_gpt2 && is_conv1d_weight_remat(remat_name) && shape.size() == 2)
      std::swap(shape[0], shape[1]);
    return shape_str(shape);
  }
};

std::string shape_of(const Tensor& t) { return t.defined() ? shape_str(t.shape()) : std::string("undefined"); }

// wte.weight [vocab, width] or wpe.weight [seq, width]: present, 2-d, both sizes > 0.
const Tensor& embedding(const std::map<std::string, Tensor>& tensors, const char* name, const char* rows,
                        const std::string& what, const FileNames& files) {
  auto it = tensors.find(name);
  REMAT_CHECK(it != tensors.end(), what, "there is no ", files.name(name), " (expected [", rows, ", width])");
  REMAT_CHECK(it->second.defined() && it->second.dim() == 2 && it->second.size(0) > 0 && it->second.size(1) > 0, what,
              files.name(name), " is ", shape_of(it->second), ", expected [", rows, ", width] with both sizes > 0");
  return it->second;
}

// The number of blocks: numbers 0 .. layers-1, every one present.
int64_t count_blocks(const std::map<std::string, Tensor>& tensors, const std::string& what, const FileNames& files) {
  std::set<int64_t> blocks;
  for (const auto& [name, t] : tensors) {
    if (!std::string_view(name).starts_with("blocks.")) continue;
    const size_t dot = name.find('.', 7);
    const std::string number = name.substr(7, dot == std::string::npos ? std::string::npos : dot - 7);
    bool digits = !number.empty() && number.size() <= kMaxBlockDigits && dot != std::string::npos &&
                  (number == "0" || number[0] != '0');
    for (char ch : number) digits = digits && ch >= '0' && ch <= '9';
    if (digits) blocks.insert(std::stoll(number));  // at most 9 digits: no overflow
  }
  const int64_t layers = static_cast<int64_t>(blocks.size());
  if (!blocks.empty() && *blocks.rbegin() != layers - 1) {
    int64_t gap = 0;
    while (blocks.count(gap) != 0) ++gap;
    throw Error(detail::concat(what, "block ", *blocks.rbegin(), " is there but block ", gap, " is not (no tensor ",
                               files.name(detail::concat("blocks.", gap, ".ln1.weight")), " or any other of its)"));
  }
  return layers;
}

// Every tensor of the model `c`, with its shape.
std::vector<Expected> expected_tensors(const GPTConfig& c) {
  const int64_t v = c.vocab, w = c.width, t = c.seq;
  std::vector<Expected> expected = {{"wte.weight", {v, w}}, {"wpe.weight", {t, w}}};
  for (int64_t b = 0; b < c.layers; ++b) {
    const std::string p = detail::concat("blocks.", b, ".");
    for (const Expected& e : std::initializer_list<Expected>{
             {"ln1.weight", {w}}, {"ln1.bias", {w}}, {"attn.qkv.weight", {3 * w, w}}, {"attn.qkv.bias", {3 * w}},
             {"attn.proj.weight", {w, w}}, {"attn.proj.bias", {w}}, {"ln2.weight", {w}}, {"ln2.bias", {w}},
             {"mlp.fc.weight", {4 * w, w}}, {"mlp.fc.bias", {4 * w}}, {"mlp.proj.weight", {w, 4 * w}},
             {"mlp.proj.bias", {w}}})
      expected.push_back({p + e.name, e.shape});
  }
  expected.push_back({"ln_f.weight", {w}});
  expected.push_back({"ln_f.bias", {w}});
  if (!c.tie_embeddings) expected.push_back({"lm_head.weight", {v, w}});
  return expected;
}

// The tensors must be exactly those expected, with their shapes: else one error listing the
// first problems.
void check_tensors(const std::map<std::string, Tensor>& tensors, const std::vector<Expected>& expected,
                   const GPTConfig& c, const FileNames& files, const std::string& source) {
  std::vector<std::string> problems;
  std::set<std::string> known;
  for (const Expected& e : expected) {
    known.insert(e.name);
    auto it = tensors.find(e.name);
    if (it == tensors.end())
      problems.push_back(detail::concat("missing ", files.name(e.name), " (expected ", files.shape(e.name, e.shape), ")"));
    else if (!it->second.defined() || it->second.shape() != e.shape)
      problems.push_back(detail::concat(files.name(e.name), " is ",
                                        it->second.defined() ? files.shape(e.name, it->second.shape()) : "undefined",
                                        ", expected ", files.shape(e.name, e.shape),
                                        files.layout == GPTWeightNames::hf_gpt2 && is_conv1d_weight_remat(e.name)
                                            ? " (Hugging Face's Conv1D layout [in, out], as the file's other weights)"
                                            : ""));
  }
  for (const auto& [name, tensor] : tensors)
    if (known.count(name) == 0)
      problems.push_back(detail::concat("unknown tensor ", files.name(name), " (", shape_of(tensor), ")"));
  if (problems.empty()) return;
  constexpr size_t kShown = 10;
  std::ostringstream out;
  out << source << ": the tensors do not form one GPT (vocab " << c.vocab << ", width " << c.width << " from "
      << files.name("wte.weight") << ", seq " << c.seq << " from " << files.name("wpe.weight") << ", " << c.layers
      << " blocks): " << problems.size() << (problems.size() == 1 ? " problem" : " problems") << ":";
  for (size_t i = 0; i < problems.size() && i < kShown; ++i) out << "\n  " << problems[i];
  if (problems.size() > kShown) out << "\n  ... and " << problems.size() - kShown << " more";
  throw Error(out.str());
}

}  // namespace

GPTConfig gpt_config_from_weights(const std::map<std::string, Tensor>& tensors, int64_t heads, GPTWeightNames layout,
                                  const std::string& source) {
  const FileNames files{layout};
  const std::string what = detail::concat(source, ": cannot read the GPT architecture from the tensors' shapes: ");
  // wte.weight [vocab, width] and wpe.weight [seq, width] give the sizes
  const Tensor& wte = embedding(tensors, "wte.weight", "vocab", what, files);
  const Tensor& wpe = embedding(tensors, "wpe.weight", "seq", what, files);
  GPTConfig c;
  c.vocab = wte.size(0);
  c.width = wte.size(1);
  c.seq = wpe.size(0);
  c.heads = heads;
  c.tie_embeddings = tensors.count("lm_head.weight") == 0;  // saved once, as wte.weight
  REMAT_CHECK(wpe.size(1) == c.width, what, files.name("wpe.weight"), " is ", shape_of(wpe), ", expected [", c.seq, ", ",
              c.width, "] (the width ", c.width, " of ", files.name("wte.weight"), " ", shape_of(wte), ")");
  REMAT_CHECK(heads > 0 && c.width % heads == 0, source, ": the width ", c.width, " (from ", files.name("wte.weight"),
              ") is not a multiple of ", heads, " heads; the number of heads cannot be read from the weights' shapes ",
              "and must be given");
  c.layers = count_blocks(tensors, what, files);
  // every tensor of that model, with its shape, and nothing else
  check_tensors(tensors, expected_tensors(c), c, files, source);
  return c;
}

}  // namespace remat::nn
