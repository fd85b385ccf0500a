// `remat sample`: generate text from weights saved by `remat train`.
#include <cmath>
#include <cstdio>

#include "commands.h"
#include "corpus.h"
#include "remat/nn.h"
#include "remat/remat.h"

namespace remat::tools {

int run_sample(const SampleOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  REMAT_CHECK(!o.load.empty(), "sample: --load FILE is required (weights saved by `remat train --save FILE`)");
  REMAT_CHECK(o.tokens >= 1, "sample: --tokens must be at least 1, got ", o.tokens);
  REMAT_CHECK(o.temperature > 0, "sample: --temperature must be positive, got ", o.temperature);
  auto file = nn::load_safetensors(o.load);
  auto get = [&](const char* key) {
    auto it = file.metadata.find(key);
    REMAT_CHECK(it != file.metadata.end(), "sample: ", o.load, " has no '", key,
                "' in its metadata (it was not written by remat train)");
    return it->second;
  };
  CharTokenizer tokenizer = CharTokenizer::from_string(get("vocabulary"));
  nn::GPTConfig config{.vocab = tokenizer.vocab_size(), .layers = std::stoll(get("layers")),
                       .width = std::stoll(get("width")), .heads = std::stoll(get("heads")),
                       .seq = std::stoll(get("seq")), .dropout = 0.0};
  nn::GPT model(config);
  model.load_parameters(file.tensors, o.load);
  model.eval();

  std::string prompt = o.prompt.empty() ? std::string("\n") : o.prompt;
  std::vector<int64_t> context = tokenizer.encode(prompt);
  std::string out;
  NoGradGuard no_grad;
  for (int64_t i = 0; i < o.tokens; ++i) {
    int64_t start = std::max<int64_t>(0, static_cast<int64_t>(context.size()) - config.seq);
    std::vector<int64_t> window(context.begin() + start, context.end());
    Tensor ids = from_indices(window, {1, static_cast<int64_t>(window.size())});
    Tensor logits = model.forward(ids);  // [1, T, V]
    Tensor last = logits.slice(1, -1, logits.size(1)).reshape({config.vocab});
    std::vector<double> z = last.to_vector();
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
