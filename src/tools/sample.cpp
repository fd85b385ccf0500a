// `remat sample`: generate text from weights saved by `remat train`.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "commands.h"
#include "corpus.h"
#include "footprint.h"
#include "weights.h"
#include "remat/nn.h"
#include "remat/remat.h"

namespace remat::tools {

int run_sample(const SampleOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  REMAT_CHECK(!o.load.empty(), "sample: --load FILE is required (weights saved by `remat train --save FILE`)");
  REMAT_CHECK(o.tokens >= 1, "sample: --tokens must be at least 1, got ", o.tokens);
  REMAT_CHECK(o.tokens <= kMaxSampleTokens, "sample: --tokens must be at most ", kMaxSampleTokens, ", got ", o.tokens);
  REMAT_CHECK(std::isfinite(o.temperature) && o.temperature > 0, "sample: --temperature must be a finite number > 0, got ",
              o.temperature);
  CharGPTFile weights = read_char_gpt(o.load, "sample");
  CharTokenizer tokenizer = weights.tokenizer;
  nn::GPTConfig config = weights.config;
  config.dropout = 0.0;
  check_footprint(config, 1, Use::sample,
                  detail::concat("sample: the model of ", o.load, " (layers ", config.layers, ", width ", config.width,
                                 ", heads ", config.heads, ", seq ", config.seq, ")"));
  nn::GPT model(config);
  model.load_parameters(weights.file.tensors, o.load);
  weights.file.tensors.clear();
  model.eval();

  std::string prompt = o.prompt.empty() ? std::string("\n") : o.prompt;
  std::vector<int64_t> context;
  try {
    context = tokenizer.encode(prompt);
  } catch (const Error& e) {
    throw Error(detail::concat("sample: --prompt: ", e.what()));
  }
  std::string out;
  NoGradGuard no_grad;
  for (int64_t i = 0; i < o.tokens; ++i) {
    int64_t start = std::max<int64_t>(0, static_cast<int64_t>(context.size()) - config.seq);
    std::vector<int64_t> window(context.begin() + start, context.end());
    Tensor ids = from_indices(window, {1, static_cast<int64_t>(window.size())});
    Tensor logits = model.forward(ids);  // [1, T, V]
    Tensor last = logits.slice(1, -1, logits.size(1)).reshape({config.vocab});
    std::vector<double> z = last.to_vector();
    for (double v : z)
      REMAT_CHECK(std::isfinite(v), "sample: the model of ", o.load, " gives non-finite logits (", v,
                  "): its weights hold NaN or infinite values");
    double m = *std::max_element(z.begin(), z.end()), total = 0;
    for (auto& v : z) total += (v = std::exp((v - m) / o.temperature));
    double u = uniform_double(philox_word({o.seed, 0}, static_cast<uint64_t>(i))) * total;
    int64_t next = config.vocab - 1;
    for (int64_t k = 0; k < config.vocab; ++k) {
      u -= z[static_cast<size_t>(k)];
      if (u <= 0) {
        next = k;
        break;
      }
    }
    context.push_back(next);
    out += tokenizer.decode({next});
    if (o.stop_at_separator && out.size() >= 3 && out.compare(out.size() - 3, 3, "\n%\n") == 0) {
      out.resize(out.size() - 2);
      break;
    }
  }
  std::printf("%s%s", o.prompt.c_str(), out.c_str());
  if (out.empty() || out.back() != '\n') std::printf("\n");
  return 0;
}

}  // namespace remat::tools
