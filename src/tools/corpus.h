// Text corpora for `remat train`: a file or a folder of text files, read as bytes and tokenised
// one byte per token (a character-level model; UTF-8 letters outside ASCII become several
// tokens). The vocabulary is the set of bytes present, saved with the weights.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "remat/tensor.h"

namespace remat::tools {

// Debian's `fortunes` package installs its cookie files here.
inline constexpr const char* kDefaultCorpus = "/usr/share/games/fortunes";

struct Corpus {
  std::string text;
  std::vector<std::string> files;  // what was read
  std::vector<size_t> file_ends;    // where each file's text ends in `text` (rising; the last is its size)
};

// The most text load_corpus reads (256 MiB: enwik8 and text8, 100 MB each, fit). Training holds
// about 17 bytes per byte of text at once: the text, its tokens and their split, 8 bytes a token.
inline constexpr size_t kMaxCorpusMiB = 256;
inline constexpr size_t kMaxCorpusBytes = kMaxCorpusMiB << 20;

// Reads `path` (a file, or every text file under a folder, sorted by name; binary files such as
// the fortune .dat indexes are skipped, and so are a folder's entries that are not regular files,
// symbolic links included). Throws remat::Error saying how to install the default corpus or pass
// --data when nothing usable is found. A `path` that is not a regular file or a folder (/dev/zero,
// a FIFO), or text of more than `max_bytes` in all, is a remat::Error naming the file, raised
// before that file is read.
Corpus load_corpus(const std::string& path, size_t max_bytes = kMaxCorpusBytes);

class CharTokenizer {
 public:
  CharTokenizer() = default;
  static CharTokenizer from_text(const std::string& text);
  // As written by to_string(): distinct byte values 0..255, comma-separated, parsed strictly;
  // `what` names the source in errors.
  static CharTokenizer from_string(const std::string& serialised, const std::string& what = "vocabulary");
  std::string to_string() const;  // the byte values, comma-separated
  int64_t vocab_size() const { return static_cast<int64_t>(bytes_.size()); }
  std::vector<int64_t> encode(const std::string& text) const;  // unknown bytes: error
  std::string decode(const std::vector<int64_t>& ids) const;
  bool contains(unsigned char c) const { return index_[c] >= 0; }

 private:
  std::vector<unsigned char> bytes_;
  int index_[256];
};

// Training and validation token streams: the last 5% of each file's text is held out, so that the
// validation text comes from every file of a folder, in the proportions of the training text (one
// token per byte: `file_ends` are Corpus::file_ends). The validation stream is the files' tails in
// file order; the training stream the rest.
struct TokenSplit {
  std::vector<int64_t> train, validation;
};
TokenSplit split_tokens(const std::vector<int64_t>& tokens, const std::vector<size_t>& file_ends,
                        double validation_fraction = 0.05);

// A batch of B windows of length T+1 from `tokens`, starting at positions drawn from (seed, step):
// inputs [B, T] and targets [B, T] (the inputs shifted by one), on `device`.
struct Batch {
  Tensor inputs, targets;
};
Batch sample_batch(const std::vector<int64_t>& tokens, int64_t batch, int64_t seq, uint64_t seed, uint64_t step,
                   Device device = {});

}  // namespace remat::tools
