// nn modules: registration and dotted names, train/eval, zero_grad, memory tags, seeded
// initialisation, Sequential regions and the GPT model (names, shapes, policies bitwise equal).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "remat/nn.h"

using namespace remat;

namespace {

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

std::vector<std::string> names_of(const nn::Module& m) {
  std::vector<std::string> names;
  for (const auto& [name, p] : m.named_parameters()) names.push_back(name);
  return names;
}

nn::GPTConfig tiny_config(double dropout = 0.0) {
  return nn::GPTConfig{.vocab = 11, .layers = 3, .width = 8, .heads = 2, .seq = 6, .dropout = dropout,
                       .dtype = DType::f32, .seed = 3};
}

Tensor tiny_ids(int64_t batch, int64_t t, uint64_t seed) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < batch * t; ++i) v.push_back(static_cast<int64_t>((i * 7 + seed * 3) % 11));
  return from_indices(v, {batch, t});
}

class Custom : public nn::Module {
 public:
  Custom() {
    scale = register_parameter("scale", {3}, DType::f64, nn::Init::constant(2.0));
    inner = register_module("inner", std::make_shared<nn::Linear>(3, 3, true, DType::f64));
  }
  Tensor forward_impl(const Tensor& x) override { return mul(inner->forward(x), scale); }
  Tensor scale;
  std::shared_ptr<nn::Linear> inner;
};

}  // namespace

TEST(NnModule, RegistrationAndDottedNames) {
  Custom m;
  EXPECT_EQ(names_of(m), (std::vector<std::string>{"scale", "inner.weight", "inner.bias"}));
  EXPECT_EQ(m.parameters().size(), 3u);
  EXPECT_EQ(m.num_parameters(), 3 + 9 + 3);
  EXPECT_TRUE(m.parameter("inner.weight").same(m.inner->weight));
  EXPECT_EQ(m.scale.to_vector(), (std::vector<double>{2, 2, 2}));
  for (const auto& p : m.parameters()) {
    EXPECT_TRUE(p.requires_grad());
    EXPECT_TRUE(p.is_leaf());
    EXPECT_EQ(p.storage()->tag(), memory::Tag::parameter);
  }
  EXPECT_THROW(m.parameter("inner.nothing"), Error);
  EXPECT_THROW(m.register_parameter("scale", {1}, DType::f64, nn::Init::zeros()), Error);
  EXPECT_THROW(m.register_parameter("a.b", {1}, DType::f64, nn::Init::zeros()), Error);
  EXPECT_THROW(m.register_parameter("", {1}, DType::f64, nn::Init::zeros()), Error);
  EXPECT_THROW(m.register_parameter("ids", {1}, DType::i64, nn::Init::zeros()), Error);
  EXPECT_THROW(m.register_module("inner", std::make_shared<nn::ReLU>()), Error);
  auto modules = m.named_modules();
  ASSERT_EQ(modules.size(), 2u);
  EXPECT_EQ(modules[1].first, "inner");
  // registering an existing tensor copies it into a parameter
  Tensor v = from_vector(std::vector<double>{1, 2}, {2}, DType::f64);
  Tensor p = m.register_parameter("extra", v);
  EXPECT_FALSE(p.same(v));
  EXPECT_EQ(p.to_vector(), v.to_vector());
  EXPECT_EQ(p.storage()->tag(), memory::Tag::parameter);
}

TEST(NnModule, SharedModuleParametersAreListedOnce) {
  auto shared = std::make_shared<nn::Linear>(2, 2);
  nn::Sequential seq;
  seq.add(shared).add(std::make_shared<nn::Tanh>()).add(shared);
  EXPECT_EQ(names_of(seq), (std::vector<std::string>{"0.weight", "0.bias"}));
}

TEST(NnModule, TrainEvalPropagatesAndZeroGrad) {
  nn::GPT model(tiny_config(0.1));
  EXPECT_TRUE(model.training());
  model.eval();
  for (const auto& [name, m] : model.named_modules()) EXPECT_FALSE(m->training()) << name;
  model.train();
  for (const auto& [name, m] : model.named_modules()) EXPECT_TRUE(m->training()) << name;

  Tensor ids = tiny_ids(2, 5, 1);
  model.loss(ids, tiny_ids(2, 5, 2)).backward();
  for (const auto& [name, p] : model.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().storage()->tag(), memory::Tag::gradient) << name;
  }
  model.zero_grad();
  for (const auto& p : model.parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(NnModule, EvalModeIsDeterministic) {
  nn::GPT model(tiny_config(0.5));
  Tensor ids = tiny_ids(2, 6, 4);
  model.eval();
  manual_seed(1);
  Tensor a = model.forward(ids);
  manual_seed(2);
  Tensor b = model.forward(ids);
  EXPECT_TRUE(bitwise_equal(a, b));
  model.train();
  manual_seed(2);
  EXPECT_FALSE(bitwise_equal(model.forward(ids), a));
}

TEST(NnModule, SeededInitialisationIgnoresTheDefaultGenerator) {
  manual_seed(1);
  nn::GPT a(tiny_config());
  manual_seed(999);
  (void)randn({100});
  nn::GPT b(tiny_config());
  auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(bitwise_equal(pa[i].second, pb[i].second)) << pa[i].first;
  // another seed gives other weights; blocks differ from each other
  auto config = tiny_config();
  config.seed = 4;
  nn::GPT c(config);
  EXPECT_FALSE(bitwise_equal(a.parameter("wte.weight"), c.parameter("wte.weight")));
  EXPECT_FALSE(bitwise_equal(a.parameter("blocks.0.attn.qkv.weight"), a.parameter("blocks.1.attn.qkv.weight")));
  // reset_parameters(seed) reproduces the constructor's draw
  c.reset_parameters(3);
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(bitwise_equal(pa[i].second, c.named_parameters()[i].second));
  // parameter i is drawn from parameter_rng_state(seed, i)
  size_t index = 0;
  for (; index < pa.size() && pa[index].first != "blocks.0.attn.qkv.weight"; ++index) {
  }
  Tensor expected = randn({24, 8}, DType::f32, nn::parameter_rng_state(3, index), 0.0, 0.02);
  EXPECT_TRUE(bitwise_equal(a.parameter("blocks.0.attn.qkv.weight"), expected));
}

TEST(NnModule, GPTInitialisationFollowsGPT2) {
  auto config = tiny_config();
  config.width = 64;
  config.heads = 4;
  config.vocab = 300;
  config.layers = 2;
  nn::GPT model(config);
  auto stddev = [](const Tensor& t) {
    auto v = t.to_vector();
    double s = 0;
    for (double x : v) s += x * x;
    return std::sqrt(s / static_cast<double>(v.size()));
  };
  EXPECT_NEAR(stddev(model.parameter("wte.weight")), 0.02, 0.002);
  EXPECT_NEAR(stddev(model.parameter("lm_head.weight")), 0.02, 0.002);
  EXPECT_NEAR(stddev(model.parameter("blocks.0.mlp.fc.weight")), 0.02, 0.002);
  EXPECT_NEAR(stddev(model.parameter("blocks.1.mlp.proj.weight")), 0.01, 0.001);  // 0.02 / sqrt(2 * 2)
  EXPECT_EQ(model.parameter("blocks.0.ln1.weight").to_vector(), std::vector<double>(64, 1.0));
  EXPECT_EQ(model.parameter("blocks.0.attn.qkv.bias").to_vector(), std::vector<double>(192, 0.0));
  // a plain Linear uses U(-1/sqrt(in), 1/sqrt(in))
  nn::Linear fc(16, 32);
  for (double w : fc.weight.to_vector()) EXPECT_LE(std::abs(w), 0.25);
  EXPECT_EQ(fc.bias.to_vector(), std::vector<double>(32, 0.0));
}

TEST(NnModule, GPTParameterNamesAndShapes) {
  nn::GPT model(tiny_config());
  std::vector<std::string> expected = {"wte.weight", "wpe.weight"};
  for (int i = 0; i < 3; ++i) {
    std::string b = "blocks." + std::to_string(i) + ".";
    for (const char* n : {"ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                          "attn.proj.bias", "ln2.weight", "ln2.bias", "mlp.fc.weight", "mlp.fc.bias",
                          "mlp.proj.weight", "mlp.proj.bias"})
      expected.push_back(b + n);
  }
  expected.insert(expected.end(), {"ln_f.weight", "ln_f.bias", "lm_head.weight"});
  EXPECT_EQ(names_of(model), expected);
  EXPECT_EQ(model.parameter("wpe.weight").shape(), (Shape{6, 8}));
  EXPECT_EQ(model.parameter("lm_head.weight").shape(), (Shape{11, 8}));
  EXPECT_EQ(model.parameter("blocks.2.mlp.fc.weight").shape(), (Shape{32, 8}));

  Tensor logits = model.forward(tiny_ids(2, 5, 0));
  EXPECT_EQ(logits.shape(), (Shape{2, 5, 11}));
  EXPECT_THROW(model.forward(tiny_ids(1, 7, 0)), Error);               // longer than seq
  EXPECT_THROW(model.forward(randn({2, 3})), Error);                   // not i64
  Tensor loss = model.loss(tiny_ids(2, 5, 0), tiny_ids(2, 5, 1));
  EXPECT_NEAR(loss.item(), std::log(11.0), 0.3);  // near uniform at initialisation
}

TEST(NnModule, SequentialChildrenAreRegionsUnderThePolicy) {
  auto make = [] {
    auto seq = std::make_shared<nn::Sequential>();
    for (int i = 0; i < 4; ++i) seq->add(std::make_shared<nn::Linear>(4, 4, true, DType::f64));
    return seq;
  };
  auto seq = make();
  Tensor x = randn({2, 4}, DType::f64, RngState{1, 0});
  reset_counters();
  backward([&] { return sum(seq->forward(x)); }, GradOptions{Policy::every_layer()});
  EXPECT_EQ(counters().regions_created, 4u);
  // a Linear saves only its input and its weight, which its region keeps: nothing to make again
  EXPECT_EQ(counters().regions_recomputed, 0u);
  ASSERT_EQ(counters().regions.size(), 4u);
  EXPECT_EQ(counters().regions[2].label, "2");

  // a per-container override wins over the per-call option
  seq->zero_grad();
  seq->set_policy(Policy::save_all());
  reset_counters();
  backward([&] { return sum(seq->forward(x)); }, GradOptions{Policy::every_layer()});
  EXPECT_EQ(counters().regions_created, 0u);
  seq->set_policy(Policy::every_k(2));
  reset_counters();
  backward([&] { return sum(seq->forward(x)); }, GradOptions{Policy::save_all()});
  EXPECT_EQ(counters().regions_created, 2u);

  // a per-child override
  auto named = std::make_shared<nn::Sequential>();
  named->add(std::make_shared<nn::Linear>(4, 4, true, DType::f64), "first", Policy::save_all());
  named->add(std::make_shared<nn::Linear>(4, 4, true, DType::f64), "second");
  EXPECT_EQ(names_of(*named)[2], "second.weight");
  reset_counters();
  backward([&] { return sum(named->forward(x)); }, GradOptions{Policy::every_layer()});
  EXPECT_EQ(counters().regions_created, 1u);
}

TEST(NnModule, SequentialOutlivedByItsGraph) {
  // The regions hold the children by shared_ptr: backward works after the container is gone.
  Tensor x = randn({2, 4}, DType::f64, RngState{1, 0});
  Tensor w_grad_reference;
  std::shared_ptr<nn::Linear> first = std::make_shared<nn::Linear>(4, 4, true, DType::f64);
  Tensor loss;
  {
    auto seq = std::make_shared<nn::Sequential>();
    seq->add(first).add(std::make_shared<nn::Tanh>()).add(std::make_shared<nn::Linear>(4, 2, true, DType::f64));
    ScopedPolicy scope(Policy::every_layer());
    loss = sum(seq->forward(x));
  }
  loss.backward();
  EXPECT_TRUE(first->weight.grad().defined());
}

TEST(NnModule, GPTEveryLayerGradientsBitwiseEqualSaveAllWithDropout) {
  for (bool tie : {false, true}) {
    SCOPED_TRACE(tie ? "tied embeddings" : "untied");
    nn::GPTConfig config = tiny_config(0.1);
    config.tie_embeddings = tie;
    nn::GPT model(config);
    Tensor ids = tiny_ids(2, 6, 5), targets = tiny_ids(2, 6, 6);
    TensorList params = model.parameters();
    auto run = [&](const Policy& policy) {
      manual_seed(77);
      return remat::grad([&](const TensorList&) { return model.loss(ids, targets); }, params, GradOptions{policy});
    };
    TensorList reference = run(Policy::save_all());
    reset_counters();
    TensorList every_layer = run(Policy::every_layer());
    // the model's layer calls: wte, wpe, the 3 blocks (through the transparent Sequential), ln_f and
    // lm_head (the embedding dropout is transparent)
    EXPECT_EQ(counters().regions_created, 7u);
    // the blocks and ln_f have values to make again; the embeddings and lm_head save only their
    // inputs and weights, which their regions keep
    EXPECT_EQ(counters().regions_recomputed, 4u);
    TensorList every_two = run(Policy::every_k(2));
    TensorList selective = run(Policy::parse("selective:matmul"));
    auto names = names_of(model);
    ASSERT_EQ(reference.size(), every_layer.size());
    for (size_t i = 0; i < reference.size(); ++i) {
      EXPECT_TRUE(bitwise_equal(every_layer[i], reference[i])) << names[i];
      EXPECT_TRUE(bitwise_equal(every_two[i], reference[i])) << names[i];
      EXPECT_TRUE(bitwise_equal(selective[i], reference[i])) << names[i];
    }
    // dropout really is active (another seed changes the gradient)
    manual_seed(78);
    TensorList other = remat::grad([&](const TensorList&) { return model.loss(ids, targets); }, params,
                                   GradOptions{Policy::save_all()});
    EXPECT_FALSE(bitwise_equal(other[0], reference[0]));
  }
}

TEST(NnModule, GPTTrainsWithAdamW) {
  nn::GPT model(tiny_config());
  nn::AdamW opt(model.parameters(), {.lr = 3e-2, .weight_decay = 0.0});
  Tensor ids = tiny_ids(4, 6, 1), targets = tiny_ids(4, 6, 2);
  double first = 0, last = 0;
  for (int step = 0; step < 10; ++step) {
    opt.zero_grad();
    Tensor loss = model.loss(ids, targets);
    loss.backward();
    nn::clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    if (step == 0) first = loss.item();
    last = loss.item();
  }
  EXPECT_LT(last, 0.6 * first) << "first " << first << ", last " << last;
}

// --tie-embeddings: lm_head's weight is wte's, one parameter whose gradient is the sum of the
// two uses; the policies stay bitwise equal to save-all (GPTEveryLayerGradients... covers them
// with tying too).
TEST(NnModule, GPTTiedEmbeddings) {
  nn::GPTConfig config = tiny_config();
  nn::GPT untied(config);
  config.tie_embeddings = true;
  nn::GPT tied(config);
  // one parameter, listed and counted once, saved once
  EXPECT_TRUE(tied.lm_head->weight.same(tied.wte->weight));
  EXPECT_EQ(tied.num_parameters(), untied.num_parameters() - config.vocab * config.width);
  std::vector<std::string> names = names_of(untied);
  names.erase(std::find(names.begin(), names.end(), "lm_head.weight"));
  EXPECT_EQ(names_of(tied), names);
  EXPECT_EQ(tied.parameters().size(), untied.parameters().size() - 1);
  EXPECT_NE(tied.type_name().find("tied"), std::string::npos);
  // the same seed draws the same weights (lm_head comes last); the untied model's lm_head is set
  // to the embedding's values
  for (const auto& [name, p] : tied.named_parameters()) EXPECT_TRUE(bitwise_equal(p, untied.parameter(name))) << name;
  {
    NoGradGuard no_grad;
    untied.lm_head->weight.copy_(untied.wte->weight);
  }
  Tensor ids = tiny_ids(2, 6, 5), targets = tiny_ids(2, 6, 6);
  TensorList gu = remat::grad([&](const TensorList&) { return untied.loss(ids, targets); }, untied.parameters(),
                              GradOptions{Policy::save_all()});
  TensorList gt = remat::grad([&](const TensorList&) { return tied.loss(ids, targets); }, tied.parameters(),
                              GradOptions{Policy::save_all()});
  const nn::NamedTensors pu = untied.named_parameters(), pt = tied.named_parameters();
  auto index = [](const nn::NamedTensors& ps, const std::string& name) {
    for (size_t i = 0; i < ps.size(); ++i)
      if (ps[i].first == name) return i;
    ADD_FAILURE() << "no " << name;
    return size_t{0};
  };
  const Tensor sum = add(gu[index(pu, "wte.weight")], gu[index(pu, "lm_head.weight")]);
  const Tensor tied_grad = gt[index(pt, "wte.weight")];
  EXPECT_TRUE(bitwise_equal(tied_grad, sum));
  // the lm_head part is not zero (both uses contribute)
  EXPECT_FALSE(bitwise_equal(tied_grad, gu[index(pu, "wte.weight")]));
  // every other gradient is the untied model's
  for (const auto& [name, p] : pt)
    if (name != "wte.weight") EXPECT_TRUE(bitwise_equal(gt[index(pt, name)], gu[index(pu, name)])) << name;
  // the file of a tied model has no lm_head.weight, and loads back into a tied model only
  const std::string file = (std::filesystem::temp_directory_path() / ("remat_tied_" + std::to_string(::getpid()))).string();
  tied.save(file);
  nn::SafetensorsFile f = nn::load_safetensors(file);
  EXPECT_EQ(f.tensors.count("lm_head.weight"), 0u);
  EXPECT_EQ(f.tensors.count("wte.weight"), 1u);
  nn::GPT again(config);
  again.load(file);
  EXPECT_TRUE(bitwise_equal(again.lm_head->weight, tied.wte->weight));
  EXPECT_THROW(nn::GPT(tiny_config()).load(file), Error);
  std::filesystem::remove(file);
}
