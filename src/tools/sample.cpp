// `remat sample`: generate text from weights saved by `remat train`.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "commands.h"
#include "usage.h"
#include "corpus.h"
#include "device_option.h"
#include "footprint.h"
#include "weights.h"
#include "remat/nn.h"
#include "remat/remat.h"

namespace remat::tools {

namespace {
// A byte for messages: 'c' when printable ASCII, else 0xNN.
std::string byte_text(unsigned char c) {
  char buffer[16];
  if (c >= 0x20 && c < 0x7f) std::snprintf(buffer, sizeof buffer, "'%c'", c);
  else std::snprintf(buffer, sizeof buffer, "0x%02X", c);
  return buffer;
}
void check_sample_options(const SampleOptions& o) {
  REMAT_USAGE_CHECK(!o.load.empty(), "sample: --load FILE is required (weights saved by `remat train --save FILE`)");
  REMAT_USAGE_CHECK(o.tokens >= 1, "sample: --tokens must be at least 1, got ", o.tokens);
  REMAT_USAGE_CHECK(o.tokens <= kMaxSampleTokens, "sample: --tokens must be at most ", kMaxSampleTokens, ", got ", o.tokens);
  REMAT_USAGE_CHECK(std::isfinite(o.temperature) && o.temperature >= 0,
                    "sample: --temperature must be a finite number >= 0 (0: greedy), got ", o.temperature);
  REMAT_USAGE_CHECK(o.top_p > 0 && o.top_p <= 1, "sample: --top-p must be in (0, 1], got ", o.top_p);
}

// The file's vocabulary, or for a file without remat's metadata (a nanoGPT state_dict) the
// characters of --data.
CharTokenizer sample_vocabulary(const SampleOptions& o, const CharGPTFile& weights) {
  if (weights.has_metadata) return weights.tokenizer;
  const std::string data_path = o.data.empty() ? kDefaultCorpus : o.data;
  Corpus corpus;
  try {
    corpus = load_corpus(data_path);
  } catch (const Error& e) {
    throw Error(detail::concat("sample: ", o.load, " has no vocabulary in its metadata (it was not written by remat "
                               "train), so its characters come from --data (default ", kDefaultCorpus, "): ", e.what()));
  }
  return vocabulary_from_text(weights, o.load, corpus.text, data_path, "sample");
}

// Every byte of the prompt must be a character of the vocabulary.
void check_prompt(const SampleOptions& o, const std::string& prompt, const CharTokenizer& tokenizer) {
  for (size_t i = 0; i < prompt.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(prompt[i]);
    REMAT_USAGE_CHECK(tokenizer.contains(c), "sample --prompt: byte ", i, " (", byte_text(c), ") is not in the vocabulary of ",
                      o.load, ", which has ", tokenizer.vocab_size(), " characters");
  }
}

// Character i of the sample, drawn from the last position's logits z: the seed's i-th uniform
// number over the sampling weights.
int64_t draw_token(std::vector<double> z, const SampleOptions& o, int64_t i, int64_t vocab) {
  for (double v : z)
    REMAT_CHECK(std::isfinite(v), "sample: the model of ", o.load, " gives non-finite logits (", v,
                "): its weights hold NaN or infinite values");
  z = sampling_weights(z, o.temperature, o.top_k, o.top_p);
  double total = 0;
  for (double v : z) total += v;
  double u = uniform_double(philox_word({o.seed, 0}, static_cast<uint64_t>(i))) * total;
  int64_t next = vocab - 1;
  for (int64_t k = 0; k < vocab; ++k) {
    if (z[static_cast<size_t>(k)] == 0) continue;  // excluded
    next = k;
    u -= z[static_cast<size_t>(k)];
    if (u <= 0) {
      next = k;
      break;
    }
  }
  return next;
}

// Up to --tokens characters after `context`, the last config.seq tokens as the window; stops
// after the fortune separator when asked.
std::string generate(nn::GPT& model, const nn::GPTConfig& config, const CharTokenizer& tokenizer,
                     std::vector<int64_t> context, const SampleOptions& o, Device device) {
  std::string out;
  NoGradGuard no_grad;
  for (int64_t i = 0; i < o.tokens; ++i) {
    int64_t start = std::max<int64_t>(0, static_cast<int64_t>(context.size()) - config.seq);
    std::vector<int64_t> window(context.begin() + start, context.end());
    Tensor ids = from_indices(window, {1, static_cast<int64_t>(window.size())}, device);
    Tensor logits = model.forward(ids);  // [1, T, V]
    Tensor last = logits.slice(1, -1, logits.size(1)).reshape({config.vocab});
    const int64_t next = draw_token(last.to(kCpu).to_vector(), o, i, config.vocab);
    context.push_back(next);
    out += tokenizer.decode({next});
    if (o.stop_at_separator && out.size() >= 3 && out.compare(out.size() - 3, 3, "\n%\n") == 0) {
      out.resize(out.size() - 2);
      break;
    }
  }
  return out;
}

}  // namespace

int run_sample(const SampleOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  const Device device = select_device("sample --device", o.device, o.backend_options);
  check_sample_options(o);
  CharGPTFile weights = read_char_gpt(o.load, "sample", o.heads);
  REMAT_USAGE_CHECK(!weights.heads_known || !o.heads_given || o.heads == weights.config.heads, "sample: --heads ",
                    o.heads, " disagrees with the model of ", o.load, " (heads ", weights.config.heads,
                    "); the architecture comes from the weight file: drop the flag or pass the file's value");
  const CharTokenizer tokenizer = sample_vocabulary(o, weights);
  nn::GPTConfig config = weights.config;
  config.dropout = 0.0;
  check_footprint(config, 1, Use::sample,
                  detail::concat("sample: the model of ", o.load, " (layers ", config.layers, ", width ", config.width,
                                 ", heads ", config.heads, ", seq ", config.seq, ")"));
  nn::GPT model(config);
  model.load_parameters(weights.file.tensors, o.load);
  weights.file.tensors.clear();
  model.to(device);
  model.eval();

  std::string prompt = o.prompt.empty() ? std::string("\n") : o.prompt;
  check_prompt(o, prompt, tokenizer);
  const std::string out = generate(model, config, tokenizer, tokenizer.encode(prompt), o, device);
  const std::string text = o.prompt + out;
  const std::string shown = o.raw ? text : utf8_escaped(text);
  std::fwrite(shown.data(), 1, shown.size(), stdout);
  if (out.empty() || out.back() != '\n') std::printf("\n");
  return 0;
}

std::vector<double> sampling_weights(const std::vector<double>& z, double temperature, int64_t top_k, double top_p) {
  std::vector<double> w(z.size(), 0.0);
  if (z.empty()) return w;
  const size_t best = static_cast<size_t>(std::max_element(z.begin(), z.end()) - z.begin());
  if (temperature == 0) {
    w[best] = 1;
    return w;
  }
  const double m = z[best];
  for (size_t k = 0; k < z.size(); ++k) w[k] = std::exp((z[k] - m) / temperature);
  // candidates by decreasing weight (ties: lower id first)
  std::vector<size_t> order(z.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return w[a] > w[b]; });
  size_t keep = order.size();
  if (top_k > 0) keep = std::min(keep, static_cast<size_t>(top_k));
  if (top_p < 1) {
    double total = 0;
    for (double v : w) total += v;
    double sum = 0;
    size_t n = 0;
    while (n < keep) {
      sum += w[order[n++]];
      if (sum >= top_p * total) break;
    }
    keep = n;
  }
  for (size_t r = keep; r < order.size(); ++r) w[order[r]] = 0;
  return w;
}

std::string utf8_escaped(const std::string& bytes) {
  std::string out;
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = b[i];
    size_t length = 0;
    unsigned lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c < 0x80) length = 1;
    else if (c >= 0xC2 && c <= 0xDF) length = 2;
    else if (c >= 0xE0 && c <= 0xEF) length = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) length = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    bool ok = length > 0 && i + length <= n;
    for (size_t k = 1; ok && k < length; ++k) {
      const unsigned char d = b[i + k];
      ok = k == 1 ? (d >= lo && d <= hi) : (d >= 0x80 && d <= 0xBF);
    }
    if (ok) {
      out.append(bytes, i, length);
      i += length;
    } else {
      char escape[5];
      std::snprintf(escape, sizeof escape, "\\x%02X", c);
      out += escape;
      ++i;
    }
  }
  return out;
}

}  // namespace remat::tools
