// remat_reference_logits WEIGHTS ID...: the logits remat computes for one sequence of token ids,
// printed as JSON on stdout ({"vocab": V, "logits": [[...], ...]}, a row per position), for the
// reference checks beside this file. WEIGHTS is anything `remat train --load` reads that says how
// many heads its model has: a weight file with remat's metadata (remat's, nanoGPT's or Hugging
// Face's names), or a directory with model.safetensors and config.json (a --format hf-gpt2 export,
// or one Transformers saved). Errors go to stderr, exit 1.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "numbers.h"
#include "remat/autodiff.h"
#include "weights.h"

int main(int argc, char** argv) {
  using namespace remat;
  try {
    REMAT_CHECK(argc >= 3, "usage: remat_reference_logits WEIGHTS ID...");
    tools::CharGPTFile weights = tools::read_char_gpt(argv[1], "remat_reference_logits", 1);
    REMAT_CHECK(weights.heads_known, argv[1], " does not say how many heads its model has (no remat metadata, no config.json)");
    nn::GPT model(weights.config);
    model.load_parameters(weights.file.tensors, argv[1]);
    model.eval();
    std::vector<int64_t> ids;
    for (int i = 2; i < argc; ++i) ids.push_back(tools::parse_int("token id", argv[i], 0, weights.config.vocab - 1));
    const auto t = static_cast<int64_t>(ids.size());
    NoGradGuard no_grad;
    const std::vector<double> v = model.forward(from_indices(ids, {1, t})).to_vector();
    std::printf("{\"vocab\": %lld, \"logits\": [", static_cast<long long>(weights.config.vocab));
    for (int64_t row = 0; row < t; ++row) {
      std::printf("%s[", row == 0 ? "" : ", ");
      for (int64_t j = 0; j < weights.config.vocab; ++j)
        std::printf("%s%.17g", j == 0 ? "" : ", ", v[static_cast<size_t>(row * weights.config.vocab + j)]);
      std::printf("]");
    }
    std::printf("]}\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "remat_reference_logits: %s\n", e.what());
    return 1;
  }
}
