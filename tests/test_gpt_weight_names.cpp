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
  // a nanoGPT model: lm_head := wte, one tensor, saved once (as the safetensors package does)
  GPTConfig tied_config = kConfig;
  tied_config.tie_embeddings = true;
  GPT model(tied_config);
  const std::vector<double> expected = logits_of(model);
  NamedTensors nano;
  for (const auto& [name, p] : model.named_parameters()) nano.emplace_back(nanogpt_name(name), p.detach());
  for (const auto& [name, t] : nano) ASSERT_NE(name, "lm_head.weight");
  save_safetensors(path("tied.safetensors"), nano, {});
  SafetensorsFile file = load_safetensors(path("tied.safetensors"));
  const std::map<std::string, Tensor> remat = gpt_weights_to_remat(file.tensors, GPTWeightNames::nanogpt);
  // the file says tied, and loads into a tied model
  const GPTConfig read = gpt_config_from_weights(remat, kConfig.heads, GPTWeightNames::nanogpt, "tied.safetensors");
  EXPECT_TRUE(read.tie_embeddings);
  GPTConfig other = read;
  other.seed = 7;
  GPT loaded(other);
  loaded.load_parameters(remat, "tied.safetensors");
  EXPECT_EQ(logits_of(loaded), expected);
  EXPECT_TRUE(loaded.lm_head->weight.same(loaded.wte->weight));
  // not silently into an untied one
  try {
    GPT(kConfig).load_parameters(remat, "tied.safetensors");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing \"lm_head.weight\""), std::string::npos) << e.what();
  }
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

// A file without remat's metadata: the architecture read from the shapes; every tensor checked.
TEST_F(GPTWeightNamesTest, ArchitectureFromTheShapes) {
  const GPTConfig config{.vocab = 11, .layers = 3, .width = 8, .heads = 2, .seq = 6, .seed = 3};
  GPT model(config);
  std::map<std::string, Tensor> params;
  for (const auto& [name, p] : model.named_parameters()) params[name] = p.detach();
  const std::map<std::string, Tensor> nano = gpt_weights_from_remat(params, GPTWeightNames::nanogpt);
  const GPTConfig read = gpt_config_from_weights(gpt_weights_to_remat(nano, GPTWeightNames::nanogpt), 2,
                                                 GPTWeightNames::nanogpt, "f.safetensors");
  EXPECT_EQ(read.vocab, 11);
  EXPECT_EQ(read.layers, 3);
  EXPECT_EQ(read.width, 8);
  EXPECT_EQ(read.heads, 2);  // as given
  EXPECT_EQ(read.seq, 6);
  // the model built from it loads the weights and gives the same logits
  GPT loaded(GPTConfig{read.vocab, read.layers, read.width, read.heads, read.seq, 0.0, DType::f32, 9});
  loaded.load_parameters(gpt_weights_to_remat(nano, GPTWeightNames::nanogpt), "f.safetensors");
  EXPECT_EQ(logits_of(loaded), logits_of(model));

  // hostile variants: each error names the tensor (by the file's name) and the shape expected
  auto expect_error = [&](std::map<std::string, Tensor> tensors, int64_t heads, std::vector<std::string> fragments) {
    try {
      gpt_config_from_weights(gpt_weights_to_remat(tensors, GPTWeightNames::nanogpt), heads, GPTWeightNames::nanogpt,
                              "f.safetensors");
      ADD_FAILURE() << "no error for " << fragments.front();
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("f.safetensors"), std::string::npos) << m;
      for (const auto& f : fragments) EXPECT_NE(m.find(f), std::string::npos) << m << "\nexpected: " << f;
    }
  };
  auto with = [&](const std::string& name, const Tensor& t) {
    auto m = nano;
    if (t.defined()) m[name] = t;
    else m.erase(name);
    return m;
  };
  // inconsistent shapes between blocks (block 1 is twice as wide)
  expect_error(with("transformer.h.1.attn.c_attn.weight", zeros({48, 16})), 2,
               {"\"transformer.h.1.attn.c_attn.weight\" is [48, 16], expected [24, 8]"});
  expect_error(with("transformer.h.2.mlp.c_proj.bias", zeros({9})), 2,
               {"\"transformer.h.2.mlp.c_proj.bias\" is [9], expected [8]"});
  // a missing tensor, an unknown one
  expect_error(with("transformer.h.0.mlp.c_fc.bias", Tensor()), 2, {"missing \"transformer.h.0.mlp.c_fc.bias\" (expected [32])"});
  expect_error(with("transformer.ln_f.weight", Tensor()), 2, {"missing \"transformer.ln_f.weight\" (expected [8])"});
  expect_error(with("transformer.h.0.attn.rotary.weight", zeros({2})), 2,
               {"unknown tensor \"transformer.h.0.attn.rotary.weight\" ([2])"});
  // a block missing in the middle, an absurd block number
  {
    auto m = nano;
    for (auto it = m.begin(); it != m.end();)
      it = it->first.rfind("transformer.h.1.", 0) == 0 ? m.erase(it) : std::next(it);
    expect_error(m, 2, {"block 2 is there but block 1 is not", "transformer.h.1.ln_1.weight"});
  }
  expect_error(with("transformer.h.99999999999999999999.ln_1.weight", zeros({8})), 2,
               {"unknown tensor \"transformer.h.99999999999999999999.ln_1.weight\""});
  expect_error(with("transformer.h.7.ln_1.weight", zeros({8})), 2, {"block 7 is there but block 3 is not"});
  // the embeddings that give the sizes
  expect_error(with("transformer.wte.weight", Tensor()), 2, {"no \"transformer.wte.weight\""});
  expect_error(with("transformer.wte.weight", zeros({11})), 2, {"\"transformer.wte.weight\" is [11], expected [vocab, width]"});
  expect_error(with("transformer.wpe.weight", zeros({6, 9})), 2, {"\"transformer.wpe.weight\" is [6, 9], expected [6, 8]"});
  // the heads must divide the width
  expect_error(nano, 3, {"width 8", "not a multiple of 3 heads", "cannot be read from the weights' shapes"});
  // a wrong lm_head is named too
  expect_error(with("lm_head.weight", zeros({12, 8})), 2, {"\"lm_head.weight\" is [12, 8], expected [11, 8]"});
}

namespace {

bool conv1d_weight(const std::string& remat_name) {
  for (const char* end : {".attn.qkv.weight", ".attn.proj.weight", ".mlp.fc.weight", ".mlp.proj.weight"})
    if (remat_name.size() > std::string(end).size() && remat_name.ends_with(end)) return true;
  return false;
}

// The tensors Hugging Face's GPT2LMHeadModel would hold for `model`, written out here: nanoGPT's
// names, Conv1D weights [in, out], the attention buffers, no lm_head.weight when `tied`.
std::map<std::string, Tensor> hf_tensors(const GPT& model, bool prefix, bool tied) {
  std::map<std::string, Tensor> hf;
  for (const auto& [name, p] : model.named_parameters()) {
    if (tied && name == "lm_head.weight") continue;
    std::string n = nanogpt_name(name);
    if (!prefix && n.rfind("transformer.", 0) == 0) n = n.substr(12);
    hf[n] = conv1d_weight(name) ? p.detach().transpose(0, 1).contiguous() : p.detach();
  }
  const int64_t t = model.config().seq;
  for (int b = 0; b < model.config().layers; ++b) {
    const std::string h = (prefix ? "transformer.h." : "h.") + std::to_string(b);
    hf[h + ".attn.bias"] = zeros({1, 1, t, t});
    hf[h + ".attn.masked_bias"] = full({}, -1e4);
  }
  return hf;
}

}  // namespace

// Hugging Face's GPT-2 layout: detected by the shapes, the Conv1D weights transposed on load and
// on save; the same weights as remat, nanogpt and hf-gpt2 files give bitwise-equal logits.
TEST_F(GPTWeightNamesTest, HuggingFaceLayoutGivesTheSameLogits) {
  GPT model(kConfig);
  const std::vector<double> expected = logits_of(model);
  std::map<std::string, Tensor> params;
  for (const auto& [name, p] : model.named_parameters()) params[name] = p.detach();
  // the library's hf-gpt2 output is the layout written out above
  const std::map<std::string, Tensor> saved = gpt_weights_from_remat(params, GPTWeightNames::hf_gpt2);
  const std::map<std::string, Tensor> hand = hf_tensors(model, true, false);
  for (const auto& [name, t] : saved) {
    ASSERT_EQ(hand.count(name), 1u) << name;
    EXPECT_EQ(t.shape(), hand.at(name).shape()) << name;
    EXPECT_EQ(t.to_vector(), hand.at(name).to_vector()) << name;
  }
  EXPECT_EQ(saved.at("transformer.h.0.attn.c_attn.weight").shape(), (Shape{8, 24}));
  EXPECT_EQ(saved.at("transformer.h.1.mlp.c_proj.weight").shape(), (Shape{32, 8}));

  struct Case {
    const char* file;
    std::map<std::string, Tensor> tensors;
    GPTWeightNames layout;
  };
  std::vector<Case> cases = {
      {"remat.safetensors", gpt_weights_from_remat(params, GPTWeightNames::remat), GPTWeightNames::remat},
      {"nanogpt.safetensors", gpt_weights_from_remat(params, GPTWeightNames::nanogpt), GPTWeightNames::nanogpt},
      {"hf.safetensors", saved, GPTWeightNames::hf_gpt2},
      {"hf-buffers.safetensors", hand, GPTWeightNames::hf_gpt2},
      {"hf-gpt2model.safetensors", hf_tensors(model, false, false), GPTWeightNames::hf_gpt2},  // no "transformer."
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file);
    save_safetensors(path(c.file), NamedTensors(c.tensors.begin(), c.tensors.end()), {});
    SafetensorsFile file = load_safetensors(path(c.file));
    ASSERT_EQ(detect_gpt_weight_names(file.tensors), c.layout);
    std::map<std::string, Tensor> remat = gpt_weights_to_remat(file.tensors, c.layout);
    const GPTConfig read = gpt_config_from_weights(remat, kConfig.heads, c.layout, c.file);
    EXPECT_EQ(read.layers, kConfig.layers);
    EXPECT_EQ(read.width, kConfig.width);
    GPTConfig other = kConfig;
    other.seed = 42;
    GPT loaded(other);
    loaded.load_parameters(remat, c.file);
    EXPECT_EQ(logits_of(loaded), expected);
  }
}

// A file mixing nanoGPT's [out, in] and Hugging Face's [in, out] is an error naming the tensor.
TEST_F(GPTWeightNamesTest, MixedLayoutsAreAnError) {
  GPT model(kConfig);
  auto expect_error = [&](std::map<std::string, Tensor> tensors, GPTWeightNames layout, const std::string& fragment) {
    ASSERT_EQ(detect_gpt_weight_names(tensors), layout);
    try {
      gpt_config_from_weights(gpt_weights_to_remat(tensors, layout), kConfig.heads, layout, "mixed.safetensors");
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("mixed.safetensors"), std::string::npos) << e.what();
    }
  };
  // Hugging Face by block 0's c_attn; block 1's c_attn and block 0's c_fc as nanoGPT's
  std::map<std::string, Tensor> hf = hf_tensors(model, true, false);
  auto mixed = hf;
  mixed["transformer.h.1.attn.c_attn.weight"] = model.parameter("blocks.1.attn.qkv.weight").detach();
  expect_error(mixed, GPTWeightNames::hf_gpt2, "\"transformer.h.1.attn.c_attn.weight\" is [24, 8], expected [8, 24]");
  mixed = hf;
  mixed["transformer.h.0.mlp.c_fc.weight"] = model.parameter("blocks.0.mlp.fc.weight").detach();
  expect_error(mixed, GPTWeightNames::hf_gpt2, "\"transformer.h.0.mlp.c_fc.weight\" is [32, 8], expected [8, 32]");
  // nanoGPT by block 0's c_attn; block 1's c_proj of the MLP as Hugging Face's
  std::map<std::string, Tensor> params;
  for (const auto& [name, p] : model.named_parameters()) params[name] = p.detach();
  mixed = gpt_weights_from_remat(params, GPTWeightNames::nanogpt);
  mixed["transformer.h.1.mlp.c_proj.weight"] = hf.at("transformer.h.1.mlp.c_proj.weight");
  expect_error(mixed, GPTWeightNames::nanogpt, "\"transformer.h.1.mlp.c_proj.weight\" is [32, 8], expected [8, 32]");
}
