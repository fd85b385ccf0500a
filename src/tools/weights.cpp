#include "weights.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>

#include "footprint.h"
#include "io/atomic_file.h"
#include "io/strict_json.h"
#include "numbers.h"
#include "usage.h"

namespace remat::tools {

namespace {

constexpr const char* kFormat = "remat-char-gpt";
// In a --format hf-gpt2 directory the weights' "format" is "pt", as Transformers requires; remat's
// other keys are there too.
constexpr const char* kTorchFormat = "pt";
constexpr const char* kWeightsName = "model.safetensors";
constexpr const char* kConfigName = "config.json";

// Whether `metadata` holds any of remat's keys (a "format" other than remat's, e.g. PyTorch's
// "pt", does not count).
bool has_remat_metadata(const nn::Metadata& metadata) {
  for (const char* key : {"vocabulary", "layers", "width", "heads", "seq", "gelu"})
    if (metadata.count(key) != 0) return true;
  auto format = metadata.find("format");
  return format != metadata.end() && format->second == kFormat;
}

// What a file without remat's metadata cannot say about its model: the number of heads and the
// GELU (Hugging Face's GPT-2 uses the tanh form, nanoGPT the exact one).
struct Unstated {
  int64_t heads;
  bool tanh_gelu;
  bool from_config;  // read from a config.json, else --heads and the layout's custom
};

// Transformers' config.json of a directory whose weights have no remat metadata (one saved by
// Transformers' save_pretrained, say), as far as remat's GPT depends on it; keys that are absent
// take GPT2Config's defaults. What remat's GPT cannot compute (another LayerNorm eps, an
// activation other than the exact or tanh GELU, other attention scaling) is an error naming it.
Unstated read_hf_gpt2_config(const std::string& path, const std::string& command) {
  std::error_code ec;
  const uintmax_t bytes = std::filesystem::file_size(path, ec);
  REMAT_CHECK(!ec && bytes <= (1u << 20), command, ": cannot read ", path, ec ? ": " + ec.message() : " (over 1 MiB)");
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  using io::strict_json::Problem;
  // GPT2Config nests 3 deep; refused before anything deeper is built (Note [strict JSON])
  const Problem p = io::strict_json::check(text, {.max_depth = 8});
  REMAT_CHECK(p.kind != Problem::repeated_key, command, ": ", path, " has the key \"", p.detail, "\" twice in one object");
  REMAT_CHECK(p.kind == Problem::none, command, ": ", path, " is not a JSON object",
              p.kind == Problem::too_deep ? " (nested too deeply)" : "");
  const nlohmann::json j = nlohmann::json::parse(text);
  REMAT_CHECK(j.is_object(), command, ": ", path, " is not a JSON object");
  const std::string where = detail::concat(command, ": ", path, ": ");
  auto key = [&](const char* name, const nlohmann::json& fallback) {
    const nlohmann::json& v = j.contains(name) ? j.at(name) : fallback;
    REMAT_CHECK(v.type() == fallback.type() || (v.is_number() && fallback.is_number()), where, "\"", name, "\" is ",
                v.dump(), ", expected a ", fallback.type_name());
    return v;
  };
  const nlohmann::json heads = key("n_head", 12), act = key("activation_function", "gelu_new");
  REMAT_CHECK(heads.is_number_integer() && heads.get<int64_t>() >= 1, where, "\"n_head\" is ", heads.dump(),
              ", expected a whole number >= 1");
  const std::string a = act.get<std::string>();
  REMAT_CHECK(a == "gelu" || a == "gelu_python" || a == "gelu_new" || a == "gelu_pytorch_tanh", where,
              "\"activation_function\" is \"", a, "\"; remat's GPT has the exact GELU (\"gelu\") or its tanh form "
              "(\"gelu_new\")");
  REMAT_CHECK(key("layer_norm_epsilon", 1e-5).get<double>() == 1e-5, where, "\"layer_norm_epsilon\" is ",
              j.at("layer_norm_epsilon").dump(), "; remat's LayerNorms use 1e-05");
  REMAT_CHECK(key("scale_attn_weights", true).get<bool>() && !key("scale_attn_by_inverse_layer_idx", false).get<bool>(),
              where, "remat's attention scales by 1/sqrt(head size) only (\"scale_attn_weights\" true, "
              "\"scale_attn_by_inverse_layer_idx\" false)");
  return {heads.get<int64_t>(), a == "gelu_new" || a == "gelu_pytorch_tanh", true};
}

// A file without remat's metadata: the architecture from its tensors' shapes, checked one by one.
void read_by_shapes(CharGPTFile& w, const std::string& path, const Unstated& unstated, nn::GPTWeightNames layout,
                    const std::string& command) {
  w.has_metadata = false;
  const int64_t heads = unstated.heads;
  auto wte = w.file.tensors.find("wte.weight");
  REMAT_USAGE_CHECK(wte == w.file.tensors.end() || wte->second.dim() != 2 || wte->second.size(1) % heads == 0, command,
                    ": ", path, " has no remat metadata, so its architecture is read from its tensors, but the number "
                    "of heads cannot be: the width ", wte->second.size(1), " of its token embedding is not a multiple "
                    "of ", unstated.from_config ? "\"n_head\" " : "--heads ", heads,
                    unstated.from_config ? " of its config.json" : "; pass the --heads the model was trained with");
  w.config = nn::gpt_config_from_weights(w.file.tensors, heads, layout, detail::concat(command, ": ", path));
  w.config.tanh_gelu = unstated.tanh_gelu;
  w.heads_known = unstated.from_config;
}

}  // namespace

nn::Metadata char_gpt_metadata(const nn::GPTConfig& config, const CharTokenizer& tokenizer) {
  nn::Metadata m = {{"format", kFormat},
                    {"vocabulary", tokenizer.to_string()},
                    {"layers", std::to_string(config.layers)},
                    {"width", std::to_string(config.width)},
                    {"heads", std::to_string(config.heads)},
                    {"seq", std::to_string(config.seq)}};
  if (config.tanh_gelu) m["gelu"] = "tanh";  // absent: exact (files written before it say nothing)
  return m;
}

CharGPTFile read_char_gpt(const std::string& given, const std::string& command, int64_t heads) {
  CharGPTFile w;
  std::error_code ec;
  const bool directory = std::filesystem::is_directory(given, ec);
  const std::string path = directory ? (std::filesystem::path(given) / kWeightsName).string() : given;
  REMAT_CHECK(!directory || std::filesystem::is_regular_file(path, ec), command, ": ", given, " is a directory without ",
              kWeightsName, " (a --format hf-gpt2 export holds one; else name the weight file itself)");
  w.file = nn::load_safetensors(path);
  // nanoGPT's names (transformer.h.N.attn.c_attn.weight, ...) are read as remat's
  const nn::GPTWeightNames layout = nn::detect_gpt_weight_names(w.file.tensors);
  w.file.tensors = nn::gpt_weights_to_remat(w.file.tensors, layout);
  if (!has_remat_metadata(w.file.metadata)) {
    const std::filesystem::path config = std::filesystem::path(given) / kConfigName;
    if (directory && std::filesystem::exists(config, ec))
      read_by_shapes(w, path, read_hf_gpt2_config(config.string(), command), layout, command);
    else
      read_by_shapes(w, path, {heads, layout == nn::GPTWeightNames::hf_gpt2, false}, layout, command);
    return w;
  }
  const std::string in_file = detail::concat(" of ", path);
  auto get = [&](const char* key) -> const std::string& {
    auto it = w.file.metadata.find(key);
    REMAT_CHECK(it != w.file.metadata.end(), command, ": ", path, " has no \"", key,
                "\" in its metadata (it was not written by remat train)");
    return it->second;
  };
  auto number = [&](const char* key, int64_t min) {
    return parse_int(detail::concat(command, ": metadata \"", key, "\"", in_file), get(key), min,
                     std::numeric_limits<int64_t>::max());
  };
  auto format = w.file.metadata.find("format");
  REMAT_CHECK(format == w.file.metadata.end() || format->second == kFormat || format->second == kTorchFormat, command,
              ": ", path, " has format \"", format->second, "\" in its metadata, not \"", kFormat, "\" (or \"",
              kTorchFormat, "\" in a --format hf-gpt2 directory)");
  w.tokenizer = CharTokenizer::from_string(get("vocabulary"), detail::concat(command, ": metadata \"vocabulary\"", in_file));
  nn::GPTConfig& c = w.config;
  c.vocab = w.tokenizer.vocab_size();
  c.layers = number("layers", 0);
  c.width = number("width", 1);
  c.heads = number("heads", 1);
  c.seq = number("seq", 1);
  c.tie_embeddings = w.file.tensors.count("lm_head.weight") == 0;  // saved once, as wte.weight
  REMAT_CHECK(c.width % c.heads == 0, command, ": metadata", in_file, ": width ", c.width,
              " is not a multiple of heads ", c.heads);
  auto gelu = w.file.metadata.find("gelu");
  REMAT_CHECK(gelu == w.file.metadata.end() || gelu->second == "tanh" || gelu->second == "exact", command, ": metadata ",
              "\"gelu\"", in_file, " is \"", gelu->second, "\", expected \"exact\" or \"tanh\"");
  c.tanh_gelu = gelu != w.file.metadata.end() && gelu->second == "tanh";

  // The metadata must describe the tensors the file holds: the model is then no larger than the file.
  const std::string described = detail::concat(command, ": the metadata", in_file, " (vocabulary of ", c.vocab,
                                               ", layers ", c.layers, ", width ", c.width, ", seq ", c.seq, ")");
  auto expect_shape = [&](const char* name, const Shape& shape) {
    auto it = w.file.tensors.find(name);
    REMAT_CHECK(it != w.file.tensors.end(), command, ": ", path, " has no tensor \"", name, "\"");
    REMAT_CHECK(it->second.shape() == shape, described, " describes ", name, " ", shape_str(shape), ", but the file's is ",
                shape_str(it->second.shape()));
  };
  expect_shape("wte.weight", {c.vocab, c.width});
  expect_shape("wpe.weight", {c.seq, c.width});
  const uint64_t expected = gpt_parameter_count(c, described);
  uint64_t held = 0;
  for (const auto& [name, t] : w.file.tensors) held += static_cast<uint64_t>(t.numel());  // <= file bytes
  REMAT_CHECK(held == expected, described, " describes a model of ", expected, " parameters, but the file holds ", held,
              " values");
  // and every tensor has its shape in the file's layout (a file mixing nanoGPT's and Hugging
  // Face's layouts is named here, under the file's names)
  nn::gpt_config_from_weights(w.file.tensors, c.heads, layout, detail::concat(command, ": ", path));
  return w;
}

CharTokenizer vocabulary_from_text(const CharGPTFile& weights, const std::string& path, const std::string& text,
                                   const std::string& data_path, const std::string& command) {
  CharTokenizer t = CharTokenizer::from_text(text);
  REMAT_CHECK(t.vocab_size() == weights.config.vocab, command, ": ", path, " has no vocabulary in its metadata (it was "
              "not written by remat train), so its characters are those of --data ", data_path, ", numbered in byte "
              "order; but that text has ", t.vocab_size(), " distinct bytes and the model's token embedding has ",
              weights.config.vocab, " rows. Pass as --data the text the model was trained on (remat's tokenizer is "
              "one token per byte; models with other tokenizers, e.g. GPT-2's 50257 BPE tokens, cannot be used here)");
  return t;
}

}  // namespace remat::tools

namespace remat::tools {

namespace {

// PyTorch's name of a floating-point dtype, as Transformers' config.json writes it.
const char* torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f64: return "float64";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    default: return "float32";
  }
}

// Transformers' GPT2Config for `model` (see save_char_gpt). remat's LayerNorms (blocks and ln_f)
// use eps 1e-5; its MLP is 4 x width; its GELU is the exact (erf) one, Transformers' "gelu", unless
// tanh_gelu, Transformers' "gelu_new". A character vocabulary has no special tokens: the
// beginning and end of text are both newline's id when it has one, else 0. "dtype" (Transformers 5;
// "torch_dtype" for earlier ones) names the precision of the saved weights, which from_pretrained
// loads them in by default.
std::string hf_gpt2_config(const nn::GPTConfig& c, const nn::Metadata& metadata, DType saved) {
  int64_t newline = 0;
  if (auto v = metadata.find("vocabulary"); v != metadata.end()) {
    const CharTokenizer tokenizer = CharTokenizer::from_string(v->second);
    if (tokenizer.contains('\n')) newline = tokenizer.encode("\n").front();
  }
  const nlohmann::json config = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", c.vocab},
      {"n_positions", c.seq},
      {"n_ctx", c.seq},
      {"n_embd", c.width},
      {"n_layer", c.layers},
      {"n_head", c.heads},
      {"n_inner", 4 * c.width},
      {"activation_function", c.tanh_gelu ? "gelu_new" : "gelu"},
      {"layer_norm_epsilon", 1e-5},
      {"resid_pdrop", c.dropout},
      {"embd_pdrop", c.dropout},
      {"attn_pdrop", c.dropout},
      {"initializer_range", 0.02},
      {"scale_attn_weights", true},
      {"tie_word_embeddings", c.tie_embeddings},
      {"bos_token_id", newline},
      {"eos_token_id", newline},
      {"dtype", torch_dtype_name(saved)},
      {"torch_dtype", torch_dtype_name(saved)},
  };
  return config.dump(2) + "\n";
}

// GPT-2's byte-level alphabet: byte b as a printable character (its own code point for the printable
// ones, 256 + n for the n-th of the others), so that Transformers' byte-level BPE tokenizers read
// one token per byte.
std::string byte_character(unsigned char b) {
  auto printable = [](int c) { return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255); };
  int code = b;
  if (!printable(b)) {
    code = 256;
    for (int c = 0; c < b; ++c) code += printable(c) ? 0 : 1;
  }
  std::string utf8;  // code < 0x800: one or two bytes
  if (code < 0x80) {
    utf8 += static_cast<char>(code);
  } else {
    utf8 += static_cast<char>(0xC0 | (code >> 6));
    utf8 += static_cast<char>(0x80 | (code & 0x3F));
  }
  return utf8;
}

// The character vocabulary as a tokenizer Transformers' AutoTokenizer loads (tokenizer.json, the
// `tokenizers` library's format, and tokenizer_config.json): the text's bytes mapped to GPT-2's
// byte-level alphabet and split one character a token, a word-level model over those characters
// with remat's ids, and the byte-level decoder. So every byte of the vocabulary is its own token
// both ways, and a byte outside it is refused (the word-level model's unknown token is not in the
// vocabulary: encoding raises), as remat's tokenizer refuses it. GPT-2's own BPE files would drop
// such a byte without a word.
void write_hf_tokenizer(const std::filesystem::path& root, const nn::Metadata& metadata, int64_t seq) {
  auto v = metadata.find("vocabulary");
  if (v == metadata.end()) return;
  const CharTokenizer tokenizer = CharTokenizer::from_string(v->second);
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (int b = 0; b < 256; ++b)
    if (tokenizer.contains(static_cast<unsigned char>(b)))
      vocab[byte_character(static_cast<unsigned char>(b))] = tokenizer.encode(std::string(1, static_cast<char>(b))).front();
  const nlohmann::ordered_json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false},
                                             {"use_regex", false}};
  const nlohmann::ordered_json one_character = {{"type", "Split"}, {"pattern", {{"Regex", "."}}},
                                                {"behavior", "Isolated"}, {"invert", false}};
  const nlohmann::ordered_json spec = {
      {"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr},
      {"added_tokens", nlohmann::ordered_json::array()}, {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {byte_level, one_character}}}},
      {"post_processor", nullptr}, {"decoder", byte_level},
      {"model", {{"type", "WordLevel"}, {"vocab", vocab}, {"unk_token", "<a byte outside the vocabulary>"}}}};
  const nlohmann::json config = {{"tokenizer_class", "PreTrainedTokenizerFast"}, {"model_max_length", seq},
                                 {"clean_up_tokenization_spaces", false}};
  io::write_file_atomically((root / "tokenizer.json").string(), spec.dump() + "\n", "train --save");
  io::write_file_atomically((root / "tokenizer_config.json").string(), config.dump(2) + "\n", "train --save");
}

// Whether `path` can become the --format hf-gpt2 directory (nothing there yet, or a directory).
bool directory_or_nothing(const std::string& path) {
  std::error_code ec;
  return !std::filesystem::exists(path, ec) || std::filesystem::is_directory(path, ec);
}

std::string not_a_directory(const std::string& path) {
  return detail::concat("train: --save ", path, " is a file, but --format hf-gpt2 writes a directory (", kWeightsName,
                        " and ", kConfigName, ")");
}

// The --format hf-gpt2 directory: model.safetensors and config.json.
void save_hf_gpt2(const std::string& dir, const std::map<std::string, Tensor>& tensors, const nn::GPTConfig& config,
                  nn::Metadata metadata, DType saved) {
  REMAT_CHECK(directory_or_nothing(dir), not_a_directory(dir));
  std::error_code ec;
  std::filesystem::create_directory(dir, ec);
  REMAT_CHECK(!ec, "train: cannot create the directory ", dir, ": ", ec.message());
  metadata["format"] = kTorchFormat;
  const std::filesystem::path root(dir);
  nn::save_safetensors((root / kWeightsName).string(), nn::NamedTensors(tensors.begin(), tensors.end()), metadata);
  io::write_file_atomically((root / kConfigName).string(), hf_gpt2_config(config, metadata, saved), "train --save");
  write_hf_tokenizer(root, metadata, config.seq);
}

}  // namespace

void check_save_path(const std::string& path, const std::string& format) {
  REMAT_USAGE_CHECK(path.empty() || format != "hf-gpt2" || directory_or_nothing(path), not_a_directory(path));
}

void save_char_gpt(const std::string& path, const nn::GPT& model, const nn::Metadata& metadata, const std::string& format,
                   DType dtype) {
  nn::GPTWeightNames names = nn::GPTWeightNames::remat;
  if (format == "nanogpt") names = nn::GPTWeightNames::nanogpt;
  else if (format == "hf-gpt2") names = nn::GPTWeightNames::hf_gpt2;
  else REMAT_CHECK(format == "remat", "--format must be remat, nanogpt or hf-gpt2, got \"", format, "\"");
  std::map<std::string, Tensor> tensors;
  for (const auto& [name, p] : model.named_parameters())
    tensors.emplace(name, p.dtype() == dtype ? p : p.detach().to(dtype));
  std::map<std::string, Tensor> renamed = nn::gpt_weights_from_remat(tensors, names);
  if (names == nn::GPTWeightNames::hf_gpt2) return save_hf_gpt2(path, renamed, model.config(), metadata, dtype);
  nn::save_safetensors(path, nn::NamedTensors(renamed.begin(), renamed.end()), metadata);
}

}  // namespace remat::tools
