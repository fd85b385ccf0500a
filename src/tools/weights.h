// Weight files of `remat train --save`: safetensors with the architecture and the vocabulary in
// the metadata ("format" = "remat-char-gpt", "vocabulary", "layers", "width", "heads", "seq").
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
  CharTokenizer tokenizer;
  nn::GPTConfig config;  // vocab, layers, width, heads, seq from the metadata; the rest default
};

// Reads and checks `path`; `command` ("train", "sample") prefixes the errors.
CharGPTFile read_char_gpt(const std::string& path, const std::string& command);

// Writes the model's weights with `format`'s names ("remat" or "nanogpt", see remat/nn/gpt.h)
// and the metadata; read_char_gpt reads either.
void save_char_gpt(const std::string& path, const nn::GPT& model, const nn::Metadata& metadata, const std::string& format);

// The metadata that read_char_gpt reads back.
nn::Metadata char_gpt_metadata(const nn::GPTConfig& config, const CharTokenizer& tokenizer);

}  // namespace remat::tools
