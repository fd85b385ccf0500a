// nanoGPT-named GPT weights: a safetensors file written with nanoGPT's names (as its state_dict,
// saved with the safetensors package, has them) loads into remat's GPT and gives logits equal,
// bit for bit, to those of remat's own layout of the same weights; tied lm_head and nanoGPT's
// causal-mask buffers are handled; the names round-trip.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "remat/nn.h"

using namespace remat;
using namespace remat::nn;
namespace fs = std::filesystem;

namespace {

const GPTConfig kConfig{.vocab = 11, .layers = 2, .width = 8, .heads = 2, .seq = 6, .seed = 3};

// nanoGPT's name for one of remat's, written out here independently of the library's map.
std::string nanogpt_name(const std::string& name) {
  if (name == "wte.weight") return "transformer.wte.weight";
  if (name == "wpe.weight") return "transformer.wpe.weight";
  if (name.rfind("ln_f.", 0) == 0) return "transformer." + name;
  if (name == "lm_head.weight") return name;
  // blocks.N.REST
  const size_t dot = name.find('.', 7);
  const std::string n = name.substr(7, dot - 7), rest = name.substr(dot + 1);
  const std::pair<const char*, const char*> parts[] = {{"ln1.", "ln_1."},
                                                       {"ln2.", "ln_2."},
                                                       {"attn.qkv.", "attn.c_attn."},
                                                       {"attn.proj.", "attn.c_proj."},
                                                       {"mlp.fc.", "mlp.c_fc."},
                                                       {"mlp.proj.", "mlp.c_proj."}};
  for (const auto& [a, b] : parts)
    if (rest.rfind(a, 0) == 0) return "transformer.h." + n + "." + b + rest.substr(std::string(a).size());
  ADD_FAILURE() << "no nanoGPT name for " << name;
  return name;
}

std::vector<double> logits_of(GPT& model) {
  NoGradGuard no_grad;
  model.eval();
  Tensor ids = from_indices({1, 4, 7, 10, 0, 3, 2, 2, 9, 5, 6, 8}, {2, 6});
  return model.forward(ids).to_vector();
}

class GPTWeightNamesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("remat_gpt_names_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

}  // namespace

TEST_F(GPTWeightNamesTest, NanoGPTFileGivesTheSameLogits) {
  GPT model(kConfig);
  const std::vector<double> expected = logits_of(model);
  // the file nanoGPT would write: its names, its causal-mask buffer per block
  NamedTensors nano;
  for (const auto& [name, p] : model.named_parameters()) nano.emplace_back(nanogpt_name(name), p.detach());
  for (int b = 0; b < kConfig.layers; ++b)
    nano.emplace_back("transformer.h." + std::to_string(b) + ".attn.bias", zeros({1, 1, kConfig.seq, kConfig.seq}));
  save_safetensors(path("nanogpt.safetensors"), nano, {});

  SafetensorsFile file = load_safetensors(path("nanogpt.safetensors"));
  ASSERT_EQ(detect_gpt_weight_names(file.tensors), GPTWeightNames::nanogpt);
  GPTConfig other = kConfig;
  other.seed = 99;  // different initial weights: everything must come from the file
  GPT loaded(other);
  ASSERT_NE(logits_of(loaded), expected);
  loaded.load_parameters(gpt_weights_to_remat(file.tensors, GPTWeightNames::nanogpt), path("nanogpt.safetensors"));
  EXPECT_EQ(logits_of(loaded), expected);
}

TEST_F(GPTWeightNamesTest, TiedLmHeadComesFromTheTokenEmbedding) {
  GPT model(kConfig);
  // tie: lm_head := wte, as nanoGPT does
  std::map<std::string, Tensor> params;
  for (const auto& [name, p] : model.named_parameters()) params[name] = p.detach().clone();
  params["lm_head.weight"] = params["wte.weight"];
  model.load_parameters(params, "tied");
  const std::vector<double> expected = logits_of(model);
  NamedTensors nano;
  for (const auto& [name, p] : model.named_parameters())
    if (name != "lm_head.weight") nano.emplace_back(nanogpt_name(name), p.detach());
  save_safetensors(path("tied.safetensors"), nano, {});
  SafetensorsFile file = load_safetensors(path("tied.safetensors"));
  GPT loaded(GPTConfig{kConfig.vocab, kConfig.layers, kConfig.width, kConfig.heads, kConfig.seq, 0.0, DType::f32, 7});
  loaded.load_parameters(gpt_weights_to_remat(file.tensors, GPTWeightNames::nanogpt), "tied.safetensors");
  EXPECT_EQ(logits_of(loaded), expected);
}

TEST_F(GPTWeightNamesTest, NamesRoundTripAndUnknownNamesAreReported) {
  GPT model(kConfig);
  std::map<std::string, Tensor> params;
  for (const auto& [name, p] : model.named_parameters()) params[name] = p;
  EXPECT_EQ(detect_gpt_weight_names(params), GPTWeightNames::remat);
  std::map<std::string, Tensor> nano = gpt_weights_from_remat(params, GPTWeightNames::nanogpt);
  for (const auto& [name, p] : params) EXPECT_EQ(nano.count(nanogpt_name(name)), 1u) << name;
  std::map<std::string, Tensor> back = gpt_weights_to_remat(nano, GPTWeightNames::nanogpt);
  ASSERT_EQ(back.size(), params.size());
  for (const auto& [name, p] : params) EXPECT_TRUE(back.at(name).same(p)) << name;
  // a name the map does not know stays, and loading names it
  nano["transformer.h.0.attn.rotary.weight"] = zeros({2});
  try {
    GPT(kConfig).load_parameters(gpt_weights_to_remat(nano, GPTWeightNames::nanogpt), "odd.safetensors");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("transformer.h.0.attn.rotary.weight"), std::string::npos) << e.what();
  }
}
