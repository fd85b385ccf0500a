// Layer calls (remat/call.h, remat/nn/module.h): a model written as its own class gets one region
// per layer call by default; containers are looked through; nested calls run plain; overrides;
// several inputs and outputs; every-k groups and budget plans over any model; warnings; reports.
#include <gtest/gtest.h>

#include <thread>

#include "module_models.h"

using namespace remat;
using remat::testing::LoopModel;
using remat::testing::measure_step;
using remat::testing::module_grads;
using remat::testing::region_bound;
using remat::testing::bitwise_equal;
using remat::testing::TanhBlock;

namespace {

void expect_same_grads(const TensorList& got, const TensorList& reference, const std::string& what) {
  ASSERT_EQ(got.size(), reference.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], reference[i])) << what << ": gradient " << i;
}

std::vector<std::string> labels(const Counters& c) {
  std::vector<std::string> out;
  for (const auto& r : c.regions) out.push_back(r.label);
  return out;
}

// A module with two inputs (x and a mask) and one output, and one with two outputs.
class MaskedMix : public nn::Module {
 public:
  explicit MaskedMix(int64_t width) {
    a = register_module("a", std::make_shared<nn::Linear>(width, width, true, DType::f64));
    b = register_module("b", std::make_shared<nn::Linear>(width, width, true, DType::f64));
  }
  TensorList forward_list_impl(const TensorList& in) override {
    REMAT_CHECK(in.size() == 2, "MaskedMix takes (x, mask)");
    return {tanh(add(mul(a->forward(in[0]), in[1]), b->forward(in[0])))};
  }
  std::shared_ptr<nn::Linear> a, b;
};
class Split2 : public nn::Module {
 public:
  explicit Split2(int64_t width) { fc = register_module("fc", std::make_shared<nn::Linear>(width, 2 * width, true, DType::f64)); }
  TensorList forward_list_impl(const TensorList& in) override {
    Tensor h = tanh(fc->forward(in[0]));
    int64_t w = in[0].size(-1);
    return {h.slice(-1, 0, w), h.slice(-1, w, 2 * w)};
  }
  std::shared_ptr<nn::Linear> fc;
};

// A container written by the user: a loop over its children (no computation of its own).
class Stack : public nn::Module {
 public:
  Stack(int n, int64_t width, DType dtype) {
    for (int i = 0; i < n; ++i)
      blocks.push_back(register_module(std::to_string(i), std::make_shared<remat::testing::WideBlock>(width, dtype)));
  }
  Tensor forward_impl(const Tensor& x) override {
    Tensor h = x;
    for (auto& b : blocks) h = b->forward(h);
    return h;
  }
  std::vector<std::shared_ptr<remat::testing::WideBlock>> blocks;
};

class WithStack : public nn::Module {
 public:
  WithStack(int n, int64_t width, DType dtype) {
    stem = register_module("stem", std::make_shared<TanhBlock>(width, dtype));
    stack = register_module("stack", std::make_shared<Stack>(n, width, dtype));
    head = register_module("head", std::make_shared<nn::Linear>(width, width, true, dtype));
    reset_parameters(4);
  }
  Tensor forward_impl(const Tensor& x) override { return head->forward(stack->forward(stem->forward(x))); }
  std::shared_ptr<TanhBlock> stem;
  std::shared_ptr<Stack> stack;
  std::shared_ptr<nn::Linear> head;
};

}  // namespace

// ---- the acceptance test: a loop over N layers gets N regions and N*b + I + g

class UserLoop : public ::testing::TestWithParam<int> {};

TEST_P(UserLoop, GetsOneRegionPerLayerAndPeakSavedBytesFollowTheFormula) {
  const int n = GetParam();
  const int64_t batch = 16, width = 32;
  const size_t b = static_cast<size_t>(batch * width) * sizeof(float);
  LoopModel model(n, width, DType::f32, 11, /*residual=*/false, /*wide=*/true);
  Tensor x = randn({batch, width}, DType::f32, RngState{2, 0});

  // I: what one layer's ops keep when recorded, beyond its input (measured).
  size_t internal;
  {
    Tensor h = randn({batch, width}, DType::f32, RngState{3, 0}).requires_grad_();
    ScopedPolicy save_all(Policy::save_all());
    const size_t before = memory::live_bytes(memory::Tag::saved);
    Tensor y = model.layers[0]->forward(h);
    const size_t after = memory::live_bytes(memory::Tag::saved);
    ASSERT_GT(after - before, b);
    internal = after - before - b;
  }
  const size_t g = b;

  auto every_layer = measure_step(model, x, Policy::every_layer());
  EXPECT_EQ(every_layer.counters.regions_created, static_cast<uint64_t>(n));
  EXPECT_EQ(every_layer.counters.regions_recomputed, static_cast<uint64_t>(n));
  EXPECT_EQ(every_layer.counters.layer_calls, static_cast<uint64_t>(n));
  ASSERT_EQ(every_layer.counters.regions.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(every_layer.counters.regions[static_cast<size_t>(i)].label, "layer" + std::to_string(i));
    EXPECT_EQ(every_layer.counters.regions[static_cast<size_t>(i)].recomputations, 1u);
  }
  EXPECT_LE(every_layer.peak_saved, static_cast<size_t>(n) * b + internal + g)
      << "N=" << n << " b=" << b << " I=" << internal;
  auto save_all = measure_step(model, x, Policy::save_all());
  EXPECT_EQ(save_all.counters.regions_created, 0u);
  EXPECT_GE(save_all.peak_saved, static_cast<size_t>(n) * internal);
  if (n >= 16) EXPECT_LT(2 * every_layer.peak_saved, save_all.peak_saved);

  TensorList reference = module_grads(model, x, Policy::save_all());
  for (const char* p : {"every-layer", "every-k:2", "every-k:3", "selective:matmul", "selective:tanh"})
    expect_same_grads(module_grads(model, x, Policy::parse(p)), reference, p);
  // and under a budget halfway between every-layer and save-all (after the profiling steps)
  const Policy budget = Policy::budget((every_layer.peak_saved + save_all.peak_saved) / 2);
  for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) measure_step(model, x, budget);
  EXPECT_LE(measure_step(model, x, budget).peak_saved, budget.keep.budget_bytes);
  expect_same_grads(module_grads(model, x, budget), reference, budget.to_string());
  RecordProperty("every_layer_peak_saved", static_cast<int>(every_layer.peak_saved));
  RecordProperty("save_all_peak_saved", static_cast<int>(save_all.peak_saved));
}

INSTANTIATE_TEST_SUITE_P(Layers, UserLoop, ::testing::Values(4, 16, 64));

TEST(LayerCalls, NestedCallsRunPlainSoEachLayerIsRecomputedOnce) {
  LoopModel model(5, 8, DType::f64, 3);
  Tensor x = randn({4, 8}, DType::f64, RngState{1, 0});
  auto m = measure_step(model, x, Policy::every_layer());
  // each layer: linear (one matmul op with its bias), tanh; recomputed once, and nothing else
  EXPECT_EQ(m.counters.ops.recomputed_ops, 5u * 2);
  EXPECT_EQ(m.counters.regions_created, 5u);
  for (const auto& r : m.counters.regions) EXPECT_EQ(r.recomputations, 1u) << r.label;
  EXPECT_FALSE(in_layer_call());
}

TEST(LayerCalls, ContainersAreLookedThrough) {
  const int64_t w = 6;
  auto block = [&] { return std::make_shared<TanhBlock>(w, DType::f64); };
  auto model = std::make_shared<nn::Sequential>();
  model->add(block(), "stem");
  model->add(std::make_shared<nn::Residual>(block()), "res");
  model->add(std::make_shared<nn::Parallel>(std::initializer_list<std::shared_ptr<nn::Module>>{block(), block()}), "par");
  model->add(std::make_shared<nn::Linear>(2 * w, w, true, DType::f64), "merge");
  model->reset_parameters(9);
  Tensor x = randn({3, w}, DType::f64, RngState{4, 0}).requires_grad_();
  auto m = measure_step(*model, x, Policy::every_layer());
  EXPECT_EQ(labels(m.counters), (std::vector<std::string>{"stem", "res.fn", "par.0", "par.1", "merge"}));
  TensorList reference = module_grads(*model, x, Policy::save_all());
  for (const char* p : {"every-layer", "every-k:2", "every-k:4", "selective:matmul"})
    expect_same_grads(module_grads(*model, x, Policy::parse(p)), reference, p);
}

TEST(LayerCalls, AUserContainerIsALayerUnlessMarkedTransparent) {
  WithStack model(4, 8, DType::f64);
  Tensor x = randn({2, 8}, DType::f64, RngState{5, 0});
  auto as_layer = measure_step(model, x, Policy::every_layer());
  EXPECT_EQ(labels(as_layer.counters), (std::vector<std::string>{"stem", "stack", "head"}));
  model.stack->set_transparent();
  auto looked_through = measure_step(model, x, Policy::every_layer());
  EXPECT_EQ(labels(looked_through.counters),
            (std::vector<std::string>{"stem", "stack.0", "stack.1", "stack.2", "stack.3", "head"}));
  EXPECT_LT(looked_through.peak_saved, as_layer.peak_saved);
  // the same container called as the root: its children are the layers, without marking
  Stack root(3, 8, DType::f64);
  auto m = measure_step(root, x, Policy::every_layer());
  EXPECT_EQ(labels(m.counters), (std::vector<std::string>{"0", "1", "2"}));
  TensorList reference = module_grads(model, x, Policy::save_all());
  expect_same_grads(module_grads(model, x, Policy::every_layer()), reference, "transparent stack");
}

TEST(LayerCalls, ASharedModuleCalledTwiceIsTwoRegions) {
  class Twice : public nn::Module {
   public:
    Twice() { block = register_module("block", std::make_shared<TanhBlock>(5, DType::f64)); }
    Tensor forward_impl(const Tensor& x) override { return block->forward(block->forward(x)); }
    std::shared_ptr<TanhBlock> block;
  };
  Twice model;
  Tensor x = randn({3, 5}, DType::f64, RngState{6, 0}).requires_grad_();
  auto m = measure_step(model, x, Policy::every_layer());
  EXPECT_EQ(labels(m.counters), (std::vector<std::string>{"block", "block"}));
  for (const auto& r : m.counters.regions) EXPECT_EQ(r.recomputations, 1u);
  TensorList reference = module_grads(model, x, Policy::save_all());
  for (const char* p : {"every-layer", "every-k:2", "selective:matmul"})
    expect_same_grads(module_grads(model, x, Policy::parse(p)), reference, p);
}

TEST(LayerCalls, LayersWithSeveralInputsAndOutputsAreRegions) {
  class Model : public nn::Module {
   public:
    Model() {
      mix = register_module("mix", std::make_shared<MaskedMix>(4));
      split = register_module("split", std::make_shared<Split2>(4));
      reset_parameters(2);
    }
    Tensor forward_impl(const Tensor& x) override {
      Tensor mask = from_vector(std::vector<double>{1, 0, 1, 1}, {4}, DType::f64);
      TensorList parts = split->forward(TensorList{mix->forward(x, mask)});
      return mul(parts[0], parts[1]);
    }
    std::shared_ptr<MaskedMix> mix;
    std::shared_ptr<Split2> split;
  };
  Model model;
  Tensor x = randn({3, 4}, DType::f64, RngState{7, 0}).requires_grad_();
  auto m = measure_step(model, x, Policy::every_layer());
  EXPECT_EQ(labels(m.counters), (std::vector<std::string>{"mix", "split"}));
  TensorList reference = module_grads(model, x, Policy::save_all());
  for (const char* p : {"every-layer", "every-k:2", "selective:matmul"})
    expect_same_grads(module_grads(model, x, Policy::parse(p)), reference, p);
  // a one-output call of a two-output module says so
  EXPECT_THROW(model.split->forward(x), Error);
}

TEST(LayerCalls, AModuleThatImplementsNothingIsAnError) {
  class Empty : public nn::Module {};
  Empty e;
  try {
    e.forward(zeros({2}));
    FAIL() << "no error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("override forward_impl"), std::string::npos) << err.what();
  }
}

TEST(LayerCalls, PoliciesAndRolesPerModule) {
  LoopModel model(4, 6, DType::f64, 8);
  Tensor x = randn({2, 6}, DType::f64, RngState{8, 0}).requires_grad_();
  TensorList reference = module_grads(model, x, Policy::save_all());
  // one line for the whole model
  model.set_policy(Policy::save_all());
  EXPECT_EQ(measure_step(model, x, Policy::every_layer()).counters.regions_created, 0u);
  model.set_policy(std::nullopt);
  // one layer kept whole
  model.layers[1]->set_policy(Policy::save_all());
  auto m = measure_step(model, x, Policy::every_layer());
  EXPECT_EQ(labels(m.counters), (std::vector<std::string>{"layer0", "layer2", "layer3"}));
  expect_same_grads(module_grads(model, x, Policy::every_layer()), reference, "layer1 save-all");
  model.layers[1]->set_policy(std::nullopt);
  // a layer that is transparent: its Linear becomes the layer call
  model.layers[2]->set_transparent();
  m = measure_step(model, x, Policy::every_layer());
  EXPECT_EQ(labels(m.counters), (std::vector<std::string>{"layer0", "layer1", "layer2.fc", "layer3"}));
  expect_same_grads(module_grads(model, x, Policy::every_layer()), reference, "layer2 transparent");
  model.layers[2]->set_role(CallRole::automatic);
  // a sub-module marked as a layer: a nested region (multi-level)
  auto& fc0 = static_cast<TanhBlock&>(*model.layers[0]).fc;
  fc0->set_layer();
  m = measure_step(model, x, Policy::every_layer());
  EXPECT_EQ(m.counters.regions_created, 5u);  // 4 layers + layer0.fc inside layer0
  // layer0.fc's one linear op saves only what it read from outside (its input, its weight), so its
  // segment drops nothing and is never recomputed; layer0's recomputation of tanh's output runs the
  // linear op: every layer's two ops are recomputed once, none more, none skipped
  EXPECT_EQ(m.counters.ops.recomputed_ops, 4u * 2);
  EXPECT_EQ(m.counters.ops.skipped_ops, 0u);
  expect_same_grads(module_grads(model, x, Policy::every_layer()), reference, "layer0.fc a layer");
  fc0->set_role(CallRole::automatic);
  // a slot policy on a Sequential child wins over the child's own
  auto seq = std::make_shared<nn::Sequential>();
  auto b0 = std::make_shared<TanhBlock>(6, DType::f64);
  b0->set_policy(Policy::save_all());
  seq->add(b0, "", Policy::every_layer());
  seq->add(std::make_shared<TanhBlock>(6, DType::f64), "", Policy::save_all());
  m = measure_step(*seq, x, Policy::every_layer());
  EXPECT_EQ(labels(m.counters), (std::vector<std::string>{"0"}));
}

TEST(LayerCalls, EveryKGroupsConsecutiveCallsAndReplaysTheModelsOwnOps) {
  // the residual add is in the user's loop, between layer calls: a group replays it too
  LoopModel model(7, 8, DType::f64, 5, /*residual=*/true);
  Tensor x = randn({3, 8}, DType::f64, RngState{9, 0}).requires_grad_();
  TensorList reference = module_grads(model, x, Policy::save_all());
  auto m = measure_step(model, x, Policy::every_k(3));
  EXPECT_EQ(labels(m.counters), (std::vector<std::string>{"layer0..layer2", "layer3..layer5", "layer6"}));
  for (const auto& r : m.counters.regions) {
    EXPECT_EQ(r.kind, "segment");
    EXPECT_EQ(r.recomputations, 1u);
  }
  // each layer's 2 ops and the residual mul_scalar + add inside the groups, recomputed once: a
  // group ends right after its K-th call, so the adds after layer2 and layer5 run outside any
  // group (they keep nothing); the last group ends with the model, after its add, and its re-run
  // skips that mul_scalar and add, whose results no node saved (Note [one graph] in segment.cpp)
  EXPECT_EQ(m.counters.ops.recomputed_ops, 7u * 2 + 5u * 2 - 2);
  EXPECT_EQ(m.counters.ops.skipped_ops, 2u);
  for (int k : {1, 2, 3, 4, 7, 9})
    expect_same_grads(module_grads(model, x, Policy::every_k(k)), reference, "every-k:" + std::to_string(k));
  auto every_layer = measure_step(model, x, Policy::every_layer());
  auto every_3 = measure_step(model, x, Policy::every_k(3));
  EXPECT_LE(every_3.peak_saved, region_bound(every_3.counters));
  EXPECT_LE(every_layer.peak_saved, region_bound(every_layer.counters));
}

TEST(LayerCalls, BudgetPlansOverTheLayerCallsOfAnyModel) {
  LoopModel model(10, 48, DType::f32, 6, /*residual=*/true);
  Tensor x = randn({32, 48}, DType::f32, RngState{10, 0}).requires_grad_();
  TensorList reference = module_grads(model, x, Policy::save_all());
  const size_t save_all = measure_step(model, x, Policy::save_all()).peak_saved;
  const size_t every_layer = measure_step(model, x, Policy::every_layer()).peak_saved;
  ASSERT_LT(every_layer, save_all);
  for (double fraction : {0.3, 0.6, 1.0}) {
    const size_t budget = every_layer + static_cast<size_t>(fraction * static_cast<double>(save_all - every_layer));
    SCOPED_TRACE(budget);
    const Policy policy = Policy::budget(budget);
    for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) measure_step(model, x, policy);  // profiling
    auto m = measure_step(model, x, policy);
    auto report = model.planner()->report();
    ASSERT_TRUE(report.has_value());
    EXPECT_EQ(report->costs.num_stages(), 10);
    EXPECT_EQ(report->stage_labels.front(), "layer0");
    EXPECT_LE(report->predicted_peak_bytes, budget);
    EXPECT_LE(m.peak_saved, budget) << "plan " << report->tree;
    expect_same_grads(module_grads(model, x, policy), reference, report->tree);
  }
  // below the smallest feasible budget: an error naming it, before anything runs
  try {
    measure_step(model, x, Policy::budget(1024));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("smallest feasible budget"), std::string::npos) << e.what();
  }
}

TEST(LayerCalls, ARecomputingPolicyThatMeetsNoRegionWarnsOnce) {
  std::vector<std::string> warnings;
  set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
  std::thread([&] {  // a fresh thread: the warning is once per thread
    Tensor w = randn({3, 3}, DType::f64, RngState{1, 0}).requires_grad_();
    Tensor x = randn({2, 3}, DType::f64, RngState{2, 0});
    backward([&] { return sum(tanh(matmul(x, w))); }, GradOptions{Policy::save_all()});
    EXPECT_TRUE(warnings.empty());
    backward([&] { return sum(tanh(matmul(x, w))); }, GradOptions{Policy::every_layer()});
    backward([&] { return sum(tanh(matmul(x, w))); }, GradOptions{Policy::every_layer()});
  }).join();
  set_warning_handler(nullptr);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("every-layer"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("met no checkpoint region"), std::string::npos) << warnings[0];
  // with regions, no warning
  warnings.clear();
  set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
  std::thread([&] {
    LoopModel model(2, 4, DType::f64, 1);
    Tensor x = randn({2, 4}, DType::f64, RngState{2, 0});
    backward([&] { return mean(model.forward(x)); }, GradOptions{Policy::every_layer()});
  }).join();
  set_warning_handler(nullptr);
  EXPECT_TRUE(warnings.empty());
}

TEST(LayerCalls, MemoryReportNamesEachRegion) {
  LoopModel model(3, 8, DType::f32, 2);
  Tensor x = randn({4, 8}, DType::f32, RngState{3, 0});
  measure_step(model, x, Policy::every_layer());
  std::string report = memory_report(12345);
  for (const char* name : {"layer0", "layer1", "layer2", "total", "3 regions, 3 layer calls"})
    EXPECT_NE(report.find(name), std::string::npos) << name << "\n" << report;
  const Counters c = counters();
  for (const auto& r : c.regions) {
    EXPECT_EQ(r.boundary_bytes, 4u * 8 * sizeof(float)) << r.label;
    EXPECT_GT(r.recomputed_saved_bytes, 0u) << r.label;
    EXPECT_GT(r.forward_seconds, 0.0);
    EXPECT_GT(r.recompute_seconds, 0.0);
  }
}

TEST(LayerCalls, ModulesCalledWithoutGradAreUntouched) {
  LoopModel model(3, 4, DType::f64, 2);
  Tensor x = randn({2, 4}, DType::f64, RngState{3, 0});
  reset_counters();
  NoGradGuard no_grad;
  Tensor y = model.forward(x);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(counters().regions_created, 0u);
}

TEST(LayerCalls, AnErrorInsideALayerLeavesNoRegionOpen) {
  class Failing : public nn::Module {
   public:
    Tensor forward_impl(const Tensor& x) override {
      if (fail) throw Error("deliberate");
      return tanh(x);
    }
    bool fail = false;
  };
  class Model : public nn::Module {
   public:
    Model() {
      a = register_module("a", std::make_shared<TanhBlock>(4, DType::f64));
      f = register_module("f", std::make_shared<Failing>());
    }
    Tensor forward_impl(const Tensor& x) override { return f->forward(a->forward(x)); }
    std::shared_ptr<TanhBlock> a;
    std::shared_ptr<Failing> f;
  };
  Model model;
  Tensor x = randn({2, 4}, DType::f64, RngState{3, 0}).requires_grad_();
  TensorList reference = module_grads(model, x, Policy::save_all());
  model.f->fail = true;
  for (const char* p : {"every-layer", "every-k:2"}) {
    ScopedPolicy policy(Policy::parse(p));
    EXPECT_THROW(model.forward(x), Error);
    EXPECT_FALSE(in_layer_call());
    EXPECT_EQ(autodiff::recording_observer(), nullptr);
  }
  model.f->fail = false;
  expect_same_grads(module_grads(model, x, Policy::every_k(2)), reference, "after the error");
}

// The engine with several roots where one root lies on another's path (a region whose outputs
// feed each other needs this): every contribution reaches the shared node before it runs.
TEST(Engine, SeveralRootsOneOnAnothersPath) {
  Tensor x = randn({3}, DType::f64, RngState{1, 0}).requires_grad_();
  Tensor h1 = mul_scalar(x, 3.0);
  Tensor h2 = tanh(mul_scalar(h1, 0.5));
  TensorList g = remat::grad({h1, h2}, {x}, {ones({3}, DType::f64), ones({3}, DType::f64)}, /*retain_graph=*/true);
  // d/dx (3x + tanh(1.5x)) = 3 + 1.5 (1 - tanh(1.5x)^2)
  Tensor expected = add_scalar(mul_scalar(add_scalar(neg(square(tanh(mul_scalar(x, 1.5)))), 1.0), 1.5), 3.0);
  EXPECT_LT(max(abs(sub(g[0], expected))).item(), 1e-12);
  // and the same through backward() into .grad()
  backward({h1, h2}, {ones({3}, DType::f64), ones({3}, DType::f64)});
  EXPECT_LT(max(abs(sub(x.grad(), expected))).item(), 1e-12);
}

TEST(LayerCalls, BudgetPlansAParallelAndResidualStructure) {
  // Sequential of [Parallel(wide, wide) -> merge Linear] and Residual(wide) units: the layer calls
  // are the branches, the merges and the residual functions, planned as one chain.
  const int64_t w = 32;
  auto model = std::make_shared<nn::Sequential>();
  for (int i = 0; i < 4; ++i) {
    auto par = std::make_shared<nn::Parallel>();
    par->add(std::make_shared<remat::testing::WideBlock>(w, DType::f32));
    par->add(std::make_shared<remat::testing::WideBlock>(w, DType::f32));
    model->add(par);
    model->add(std::make_shared<nn::Linear>(2 * w, w));
    model->add(std::make_shared<nn::Residual>(std::make_shared<remat::testing::WideBlock>(w, DType::f32)));
  }
  model->reset_parameters(12);
  Tensor x = randn({16, w}, DType::f32, RngState{13, 0}).requires_grad_();
  TensorList reference = module_grads(*model, x, Policy::save_all());
  const size_t save_all = measure_step(*model, x, Policy::save_all()).peak_saved;
  auto every_layer = measure_step(*model, x, Policy::every_layer());
  EXPECT_EQ(every_layer.counters.regions_created, 16u);  // 2 branches + merge + residual fn, 4 times
  ASSERT_LT(every_layer.peak_saved, save_all);
  for (double fraction : {0.2, 0.5, 1.0}) {
    const size_t budget =
        every_layer.peak_saved + static_cast<size_t>(fraction * static_cast<double>(save_all - every_layer.peak_saved));
    SCOPED_TRACE(budget);
    const Policy policy = Policy::budget(budget);
    for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) measure_step(*model, x, policy);
    auto m = measure_step(*model, x, policy);
    auto report = model->planner()->report();
    ASSERT_TRUE(report.has_value());
    EXPECT_EQ(report->costs.num_stages(), 16);
    EXPECT_LE(report->predicted_peak_bytes, budget);
    EXPECT_LE(m.peak_saved, budget) << report->tree;
    expect_same_grads(module_grads(*model, x, policy), reference, report->tree);
  }
}
