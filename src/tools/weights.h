// Weight files of `remat train --save` (or a directory, for --format hf-gpt2; see save_char_gpt):
// safetensors with the architecture and the vocabulary in
// the metadata ("format" = "remat-char-gpt", "vocabulary", "layers", "width", "heads", "seq", and
// "gelu" = "tanh" for a model with the tanh approximation, e.g. one loaded from Hugging Face).
// The metadata is untrusted like the rest of the file: its numbers are parsed strictly and must
// describe the tensors the file holds (wte.weight [vocab, width], wpe.weight [seq, width], and
// the parameter count of the whole model), so a model is built only at the file's own size.
#pragma once

#include <string>

#include "corpus.h"
#include "remat/nn/gpt.h"
#include "remat/nn/safetensors.h"

namespace remat::tools {

struct CharGPTFile {
  nn::SafetensorsFile file;
  bool has_metadata = true;  // false: a file without remat's metadata (e.g. a nanoGPT state_dict)
  bool heads_known = true;   // the file says how many heads (its metadata, or a directory's config.json)
  CharTokenizer tokenizer;   // from the metadata; empty without it (see vocabulary_from_text)
  nn::GPTConfig config;      // vocab, layers, width, heads, seq, tanh_gelu from the metadata, tie_embeddings
                             // when the file has no lm_head.weight; the rest default
};

// Reads and checks `path`, a weight file or a --format hf-gpt2 directory (its model.safetensors is
// read); `command` ("train", "sample") prefixes the errors.
// A file with none of remat's metadata keys ("format" other than remat's, e.g. the "pt" that
// PyTorch tools write, counts as none) is read by its tensors' shapes instead
// (nn::gpt_config_from_weights): every tensor is checked, and the number of heads, which no shape
// gives, is `heads` (--heads); its tokenizer then comes from a text (vocabulary_from_text). In a
// directory with Transformers' config.json (one saved by save_pretrained) the heads and the GELU
// come from that file instead, which must describe a model remat computes the same way.
CharGPTFile read_char_gpt(const std::string& path, const std::string& command, int64_t heads);

// The tokenizer of a file read without metadata: the bytes present in `text` (the corpus
// `data_path`), numbered in increasing order, as remat train does and as nanoGPT's character-level
// data preparation does for ASCII text. Their number must be the file's vocabulary (the rows of
// its token embedding), else a remat::Error says so and what to pass.
CharTokenizer vocabulary_from_text(const CharGPTFile& weights, const std::string& path, const std::string& text,
                                   const std::string& data_path, const std::string& command);

// Writes the model's weights with `format`'s names and layout ("remat", "nanogpt" or "hf-gpt2",
// see remat/nn/gpt.h) and the metadata; read_char_gpt reads each (telling them apart itself).
// "remat" and "nanogpt" write one safetensors file at `path`. "hf-gpt2" makes `path` a directory
// that Transformers' GPT2LMHeadModel.from_pretrained loads: model.safetensors (GPT2LMHeadModel's
// tensor names and layouts; metadata "format" = "pt", with remat's other keys beside it) and
// config.json (a GPT2Config describing the same model: sizes, GELU, LayerNorm eps, tying).
// `dtype`: the weights' dtype in the file (f32, or bf16: the float32 masters rounded once).
void save_char_gpt(const std::string& path, const nn::GPT& model, const nn::Metadata& metadata, const std::string& format,
                   DType dtype = DType::f32);

// Before training: a usage error when `path` cannot take `format`'s output (for "hf-gpt2", a
// path that is a file, not a directory). Empty `path`: nothing to check.
void check_save_path(const std::string& path, const std::string& format);

// The metadata that read_char_gpt reads back.
nn::Metadata char_gpt_metadata(const nn::GPTConfig& config, const CharTokenizer& tokenizer);

}  // namespace remat::tools
