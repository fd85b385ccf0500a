// Values that leave a layer call (remat/call.h, "Values that leave a layer"): a tensor computed
// inside a layer that the program reaches outside it (kept in a member, pushed to a list, handed
// to a callback, one of two outputs the caller keeps) carries save-all's value and gradient path
// under every policy. An auxiliary loss on such a value gives save-all's gradients bitwise; the
// value read after the backward pass, and after a second step, holds save-all's bits; a list the
// layer appends to holds what it holds under save-all (a recomputation does not append again).
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "gpt_steps.h"
#include "module_models.h"

using namespace remat;
using remat::testing::TwoOut;
using remat::testing::bitwise_equal;

namespace {

// The block: keeps cache = tanh(fc(x)) in a member and returns x + cache.
class StashBlock : public nn::Module {
 public:
  StashBlock(int64_t width, DType dtype) { fc = register_module("fc", std::make_shared<nn::Linear>(width, width, true, dtype)); }
  Tensor forward_impl(const Tensor& x) override {
    cache = tanh(fc->forward(x));
    return add(x, mul_scalar(cache, 0.5));
  }
  std::shared_ptr<nn::Linear> fc;
  Tensor cache;
};

// Appends an intermediate to a list the model owns.
class ListBlock : public nn::Module {
 public:
  ListBlock(int64_t width, DType dtype, TensorList* sink) : sink_(sink) {
    fc = register_module("fc", std::make_shared<nn::Linear>(width, width, true, dtype));
  }
  Tensor forward_impl(const Tensor& x) override {
    Tensor h = fc->forward(x);
    Tensor s = sigmoid(h);
    sink_->push_back(s);
    return tanh(h);
  }
  std::shared_ptr<nn::Linear> fc;

 private:
  TensorList* sink_;
};

// Hands an intermediate to a callback (a logging hook, a metrics map).
class CallbackBlock : public nn::Module {
 public:
  CallbackBlock(int64_t width, DType dtype, std::function<void(const Tensor&)> hook) : hook_(std::move(hook)) {
    fc = register_module("fc", std::make_shared<nn::Linear>(width, width, true, dtype));
  }
  Tensor forward_impl(const Tensor& x) override {
    Tensor h = silu(fc->forward(x));
    hook_(mul(h, h));
    return h;
  }
  std::shared_ptr<nn::Linear> fc;

 private:
  std::function<void(const Tensor&)> hook_;
};


// Keeps its input (not computed inside, but reached outside all the same).
class InputStash : public nn::Module {
 public:
  InputStash(int64_t width, DType dtype) { fc = register_module("fc", std::make_shared<nn::Linear>(width, width, true, dtype)); }
  Tensor forward_impl(const Tensor& x) override {
    last_input = x;
    return tanh(fc->forward(x));
  }
  std::shared_ptr<nn::Linear> fc;
  Tensor last_input;
};

// Keeps a detached copy of an intermediate and a tensor it made (for logging): no op made either
// handle, and neither carries a gradient; called from two layer calls, it ends with the second's.
class DetachStash : public nn::Module {
 public:
  DetachStash(int64_t width, DType dtype) { fc = register_module("fc", std::make_shared<nn::Linear>(width, width, true, dtype)); }
  Tensor forward_impl(const Tensor& x) override {
    Tensor h = sigmoid(fc->forward(x));
    seen = h.detach();
    made = full(h.shape(), static_cast<double>(++calls), h.dtype());
    return mul(h, x);
  }
  std::shared_ptr<nn::Linear> fc;
  Tensor seen, made;
  int calls = 0;
};

// A block called twice (shared weights): its member is the second call's value after the forward.
class Twice : public nn::Module {
 public:
  explicit Twice(std::shared_ptr<StashBlock> child) { block = register_module("block", std::move(child)); }
  Tensor forward_impl(const Tensor& x) override { return block->forward(block->forward(x)); }
  std::shared_ptr<StashBlock> block;
};

// A stash inside an explicit region inside a layer (a region nested in a region).
class Explicit : public nn::Module {
 public:
  explicit Explicit(std::shared_ptr<StashBlock> child) { block = register_module("block", std::move(child)); }
  Tensor forward_impl(const Tensor& x) override {
    auto b = block;
    return tanh(checkpoint([b](const Tensor& h) { return b->forward(h); }, x));
  }
  std::shared_ptr<StashBlock> block;
};

// The model: a loop over its layers with every escape route, and the auxiliary loss over what
// escaped: mean(out) + sum over the escaped values of mean(square(v)).
class AuxModel : public nn::Module {
 public:
  AuxModel(int64_t width, DType dtype) {
    a = register_module("a", std::make_shared<StashBlock>(width, dtype));
    plain = register_module("plain", std::make_shared<remat::testing::TanhBlock>(width, dtype));
    list = register_module("list", std::make_shared<ListBlock>(width, dtype, &sink));
    callback = register_module("callback", std::make_shared<CallbackBlock>(width, dtype, [this](const Tensor& t) {
                                 metrics["energy"] = t;
                               }));
    two = register_module("two", std::make_shared<TwoOut>(width, dtype));
    input = register_module("input", std::make_shared<InputStash>(width, dtype));
    twice = register_module("twice", std::make_shared<Twice>(std::make_shared<StashBlock>(width, dtype)));
    nested = register_module("nested", std::make_shared<Explicit>(std::make_shared<StashBlock>(width, dtype)));
    b = register_module("b", std::make_shared<StashBlock>(width, dtype));
    shared = register_module("shared", std::make_shared<DetachStash>(width, dtype));
    reset_parameters(5);
  }
  Tensor forward_impl(const Tensor& x) override {
    sink.clear();
    Tensor h = a->forward(x);
    h = plain->forward(h);
    h = list->forward(h);
    h = callback->forward(h);
    TensorList parts = two->forward(TensorList{h});
    kept = parts[1];
    h = input->forward(parts[0]);
    h = twice->forward(h);
    h = nested->forward(h);
    h = shared->forward(h);
    h = b->forward(h);
    return shared->forward(h);
  }
  // Every value that left a layer call, in a fixed order.
  TensorList escaped() const {
    TensorList v{a->cache, b->cache, kept, metrics.at("energy"), input->last_input, twice->block->cache,
                 nested->block->cache, shared->seen, shared->made};
    v.insert(v.end(), sink.begin(), sink.end());
    return v;
  }
  Tensor loss(const Tensor& x) {
    Tensor l = mean(forward(x));
    for (const Tensor& v : escaped()) l = add(l, mean(square(v)));
    return l;
  }

  std::shared_ptr<StashBlock> a, b;
  std::shared_ptr<remat::testing::TanhBlock> plain;
  std::shared_ptr<ListBlock> list;
  std::shared_ptr<CallbackBlock> callback;
  std::shared_ptr<TwoOut> two;
  std::shared_ptr<InputStash> input;
  std::shared_ptr<Twice> twice;
  std::shared_ptr<Explicit> nested;
  std::shared_ptr<DetachStash> shared;
  TensorList sink;
  std::map<std::string, Tensor> metrics;
  Tensor kept;
};

struct StepResult {
  TensorList grads;     // of every parameter and x
  TensorList escaped;   // the escaped values read after the backward pass
  std::vector<bool> requires_grad;  // of the escaped values after the forward
  size_t list_size = 0;
  std::string error;
};

TensorList copies(const TensorList& values) {
  TensorList out;
  for (const auto& v : values) out.push_back(v.defined() ? v.detach().contiguous().to(v.device()) : Tensor());
  return out;
}

// `steps` steps of the auxiliary loss under `policy`: each a forward, a backward into .grad() and
// an SGD update, so that a second step sees other weights. The last step's result.
StepResult run_steps(AuxModel& model, Tensor x, const Policy& policy, int steps) {
  StepResult r;
  try {
    ScopedPolicy scope(policy);
    for (int s = 0; s < steps; ++s) {
      model.zero_grad();
      x.zero_grad();
      manual_seed(11 + static_cast<uint64_t>(s));
      Tensor l = model.loss(x);
      r.requires_grad.clear();
      for (const auto& v : model.escaped()) r.requires_grad.push_back(v.requires_grad());
      l.backward();
      r.grads.clear();
      for (const auto& p : model.parameters()) r.grads.push_back(p.grad().defined() ? p.grad().contiguous() : Tensor());
      r.grads.push_back(x.grad());
      r.escaped = copies(model.escaped());
      r.list_size = model.sink.size();
      NoGradGuard no_grad;
      for (auto& p : model.parameters())
        if (p.grad().defined()) p.copy_(sub(p, mul_scalar(p.grad(), 0.1)));
    }
  } catch (const Error& e) {
    r.error = e.what();
  }
  return r;
}

void expect_same(const StepResult& got, const StepResult& ref, const std::string& what) {
  ASSERT_EQ(got.error, "") << what;
  ASSERT_EQ(got.grads.size(), ref.grads.size()) << what;
  for (size_t i = 0; i < got.grads.size(); ++i)
    EXPECT_TRUE(bitwise_equal(got.grads[i], ref.grads[i])) << what << ": gradient " << i;
  EXPECT_EQ(got.list_size, ref.list_size) << what << ": the list the layer appends to";
  ASSERT_EQ(got.escaped.size(), ref.escaped.size()) << what;
  for (size_t i = 0; i < got.escaped.size(); ++i)
    EXPECT_TRUE(bitwise_equal(got.escaped[i], ref.escaped[i])) << what << ": escaped value " << i << " after the backward";
  EXPECT_EQ(got.requires_grad, ref.requires_grad) << what;
}

std::unique_ptr<AuxModel> fresh_model() { return std::make_unique<AuxModel>(6, DType::f64); }

Tensor input() { return randn({3, 6}, DType::f64, RngState{21, 0}).requires_grad_(); }

}  // namespace

namespace {

// The model: one stashing block between two plain ones; the loss adds
// mean(square(cache)) to the mean of the output.
class OneStash : public nn::Module {
 public:
  OneStash() {
    first = register_module("first", std::make_shared<remat::testing::TanhBlock>(4, DType::f32));
    block = register_module("block", std::make_shared<StashBlock>(4, DType::f32));
    last = register_module("last", std::make_shared<remat::testing::TanhBlock>(4, DType::f32));
    reset_parameters(1);
  }
  Tensor forward_impl(const Tensor& x) override { return last->forward(block->forward(first->forward(x))); }
  Tensor loss(const Tensor& x) {
    Tensor out = mean(forward(x));
    return add(out, mean(square(block->cache)));
  }
  std::shared_ptr<remat::testing::TanhBlock> first, last;
  std::shared_ptr<StashBlock> block;
};

struct OneStashResult {
  float first_weight_grad = 0;  // element [0, 0] of the stashing block's weight gradient
  Tensor grad, cache_after;
  bool requires_grad = false;
  std::string error;
};

// `steps` steps (forward, backward, SGD) of OneStash under `policy`; the last step's result.
OneStashResult one_stash(const Policy& policy, int steps) {
  OneStashResult r;
  OneStash model;
  Tensor x = randn({2, 4}, DType::f32, RngState{3, 0});
  reset_counters();
  try {
    ScopedPolicy scope(policy);
    for (int s = 0; s < steps; ++s) {
      model.zero_grad();
      Tensor loss = model.loss(x);
      r.requires_grad = model.block->cache.requires_grad();
      loss.backward();
      r.cache_after = model.block->cache.contiguous().clone();
      r.grad = model.block->fc->weight.grad().contiguous().clone();
      NoGradGuard no_grad;
      for (auto& p : model.parameters()) p.copy_(sub(p, mul_scalar(p.grad(), 0.5)));
    }
  } catch (const Error& e) {
    r.error = e.what();
  }
  if (r.grad.defined()) r.first_weight_grad = static_cast<float>(r.grad.to_vector()[0]);
  return r;
}

}  // namespace

// The block under every policy: the stashed intermediate carries save-all's gradient
// (the stashing block's weight gradient is save-all's, bitwise) and reads save-all's value after
// the backward pass, at the first step and the next ones; budgets from the smallest feasible one
// up to save-all's peak, budget:auto from its first (profiling) step, dynamic: from its smallest
// feasible budget, offload and the compositions.
TEST(EscapedValues, TheStashedIntermediateOfOneBlockIsSaveAllsUnderEveryPolicy) {
  const int steps = BudgetPlanner::kProfilingSteps + 2;
  std::vector<OneStashResult> reference;
  for (int s = 1; s <= steps; ++s) reference.push_back(one_stash(Policy::save_all(), s));
  ::testing::Test::RecordProperty("save_all_first_weight_grad", std::to_string(reference[0].first_weight_grad));
  ASSERT_TRUE(reference[0].requires_grad);
  std::vector<Policy> policies;
  for (const char* p : {"every-layer", "every-k:2", "selective:matmul", "budget:auto"}) policies.push_back(Policy::parse(p));
  {
    OneStash probe;
    Tensor x = randn({2, 4}, DType::f32, RngState{3, 0});
    for (int s = 0; s < BudgetPlanner::kProfilingSteps; ++s) {
      ScopedPolicy scope(Policy::budget(size_t{1} << 40));
      probe.loss(x).backward();
    }
    const auto range = probe.planner()->feasible_range();
    ASSERT_TRUE(range.has_value());
    const size_t lo = range->smallest_budget_bytes, hi = range->save_all_peak_bytes;
    for (size_t b : {lo, (lo + hi) / 2, hi}) policies.push_back(Policy::budget(b));
  }
  {
    // dynamic: from the smallest budget a step runs under (raised to what each failed try needed)
    one_stash(Policy::dynamic(size_t{1} << 30), 1);
    size_t smallest = std::max<size_t>(1, counters().dynamic.smallest_feasible_bytes);
    for (int attempt = 0; attempt < 30 && !one_stash(Policy::dynamic(smallest), 1).error.empty(); ++attempt)
      smallest = std::max(counters().dynamic.smallest_feasible_bytes, smallest + smallest / 4 + 1);
    for (size_t b : {smallest, smallest + smallest / 4, size_t{1} << 20}) policies.push_back(Policy::dynamic(b));
  }
  policies.push_back(Policy::offload(::testing::TempDir(), 0));
  policies.push_back(Policy::every_layer().with_offload({::testing::TempDir(), 0, 0}));
  policies.push_back(Policy::parse("budget:auto").with_offload({::testing::TempDir(), 0, 0}));
  int compared = 0;
  for (const Policy& policy : policies) {
    for (int s = 1; s <= steps; ++s) {
      const OneStashResult got = one_stash(policy, s);
      const std::string what = policy.to_string() + ", step " + std::to_string(s);
      ASSERT_EQ(got.error, "") << what;
      EXPECT_TRUE(bitwise_equal(got.grad, reference[static_cast<size_t>(s - 1)].grad))
          << what << ": first weight gradient " << got.first_weight_grad << ", save-all's "
          << reference[static_cast<size_t>(s - 1)].first_weight_grad;
      EXPECT_EQ(got.requires_grad, reference[static_cast<size_t>(s - 1)].requires_grad) << what;
      EXPECT_TRUE(bitwise_equal(got.cache_after, reference[static_cast<size_t>(s - 1)].cache_after))
          << what << ": the member read after the backward pass";
      ++compared;
    }
  }
  EXPECT_GE(compared, static_cast<int>(policies.size()) * steps);
}

TEST(EscapedValues, EveryEscapeRouteUnderTheRegionPoliciesMatchesSaveAll) {
  auto ref_model = fresh_model();
  const StepResult reference = run_steps(*ref_model, input(), Policy::save_all(), 1);
  ASSERT_EQ(reference.error, "");
  for (const char* p : {"every-layer", "every-k:2", "every-k:3", "selective:matmul", "selective:tanh,add"}) {
    auto model = fresh_model();
    reset_counters();
    expect_same(run_steps(*model, input(), Policy::parse(p), 1), reference, p);
  }
}

TEST(EscapedValues, ASecondStepReadsSaveAllsValues) {
  auto ref_model = fresh_model();
  const StepResult reference = run_steps(*ref_model, input(), Policy::save_all(), 2);
  ASSERT_EQ(reference.error, "");
  for (const char* p : {"every-layer", "every-k:2", "selective:matmul"}) {
    auto model = fresh_model();
    expect_same(run_steps(*model, input(), Policy::parse(p), 2), reference, std::string(p) + ", second step");
  }
}

// budget:auto from its first step (the profiling steps run every layer call as a region), and
// budgets from the smallest feasible one up to save-all's peak, each from its first step on.
TEST(EscapedValues, BudgetPlansFromTheFirstStepAndEveryFeasibleBudgetMatchSaveAll) {
  const int steps = BudgetPlanner::kProfilingSteps + 2;
  auto ref_model = fresh_model();
  std::vector<StepResult> reference;
  for (int s = 1; s <= steps; ++s) {
    auto m = fresh_model();
    reference.push_back(run_steps(*m, input(), Policy::save_all(), s));
    ASSERT_EQ(reference.back().error, "");
  }
  for (int s = 1; s <= steps; ++s) {
    auto model = fresh_model();
    expect_same(run_steps(*model, input(), Policy::parse("budget:auto"), s), reference[static_cast<size_t>(s - 1)],
                "budget:auto, step " + std::to_string(s));
  }
  // the feasible range, from a profiled model
  auto probe = fresh_model();
  run_steps(*probe, input(), Policy::budget(size_t{1} << 40), BudgetPlanner::kProfilingSteps);
  const auto range = probe->planner()->feasible_range();
  ASSERT_TRUE(range.has_value());
  const size_t lo = range->smallest_budget_bytes, hi = range->save_all_peak_bytes;
  int planned = 0;
  for (size_t budget : {lo, lo + (hi - lo) / 4, (lo + hi) / 2, hi}) {
    for (int s = 1; s <= steps; ++s) {
      auto model = fresh_model();
      const StepResult got = run_steps(*model, input(), Policy::budget(budget), s);
      if (got.error.find("smallest feasible budget") != std::string::npos) continue;
      expect_same(got, reference[static_cast<size_t>(s - 1)],
                  "budget:" + std::to_string(budget) + ", step " + std::to_string(s));
      planned += s > BudgetPlanner::kProfilingSteps;
    }
  }
  EXPECT_GT(planned, 0) << "no budget ran a plan";
}

TEST(EscapedValues, DynamicAndOffloadAndTheirCompositionsMatchSaveAll) {
  auto ref_model = fresh_model();
  const StepResult reference = run_steps(*ref_model, input(), Policy::save_all(), 2);
  ASSERT_EQ(reference.error, "");
  std::vector<Policy> policies{Policy::offload(::testing::TempDir(), 0),
                               Policy::every_layer().with_offload({::testing::TempDir(), 0, 0}),
                               Policy::parse("every-k:2").with_offload({::testing::TempDir(), 0, 0}),
                               Policy::parse("selective:matmul").with_offload({::testing::TempDir(), 0, 0})};
  // dynamic: from the smallest budget a step runs under (raised to what each failed try needed)
  // to one that keeps everything
  {
    auto probe = fresh_model();
    run_steps(*probe, input(), Policy::dynamic(size_t{1} << 30), 1);
    size_t smallest = std::max<size_t>(1, counters().dynamic.smallest_feasible_bytes);
    for (int attempt = 0; attempt < 30; ++attempt) {
      auto m = fresh_model();
      if (run_steps(*m, input(), Policy::dynamic(smallest), 1).error.empty()) break;
      smallest = std::max(counters().dynamic.smallest_feasible_bytes, smallest + smallest / 4 + 1);
    }
    for (size_t budget : {smallest, smallest + smallest / 2, size_t{1} << 30}) policies.push_back(Policy::dynamic(budget));
  }
  uint64_t rematerializations = 0;
  for (const Policy& policy : policies) {
    auto model = fresh_model();
    reset_counters();
    const StepResult got = run_steps(*model, input(), policy, 2);
    rematerializations += counters().dynamic.rematerializations;
    expect_same(got, reference, policy.to_string());
  }
  EXPECT_GT(rematerializations, 0u) << "no dynamic: budget evicted anything";
}

namespace {

// Reads what another layer kept, through the member (not as an input): h + cache * fc(h).
class Reader : public nn::Module {
 public:
  Reader(std::shared_ptr<StashBlock> source, int64_t width, DType dtype) : source_(std::move(source)) {
    fc = register_module("fc", std::make_shared<nn::Linear>(width, width, true, dtype));
  }
  Tensor forward_impl(const Tensor& x) override { return add(x, mul(source_->cache, fc->forward(x))); }
  std::shared_ptr<nn::Linear> fc;

 private:
  std::shared_ptr<StashBlock> source_;
};

// Keeps a value computed under no-grad (a statistic): no gradient under save-all either.
class NoGradStash : public nn::Module {
 public:
  NoGradStash(int64_t width, DType dtype) { fc = register_module("fc", std::make_shared<nn::Linear>(width, width, true, dtype)); }
  Tensor forward_impl(const Tensor& x) override {
    Tensor h = fc->forward(x);
    {
      NoGradGuard no_grad;
      statistic = mean(square(h));
    }
    return tanh(h);
  }
  std::shared_ptr<nn::Linear> fc;
  Tensor statistic;
};

class CrossModel : public nn::Module {
 public:
  CrossModel() {
    a = register_module("a", std::make_shared<StashBlock>(5, DType::f64));
    mid = register_module("mid", std::make_shared<NoGradStash>(5, DType::f64));
    reader = register_module("reader", std::make_shared<Reader>(a, 5, DType::f64));
    last = register_module("last", std::make_shared<remat::testing::TanhBlock>(5, DType::f64));
    reset_parameters(12);
  }
  Tensor forward_impl(const Tensor& x) override { return last->forward(reader->forward(mid->forward(a->forward(x)))); }
  std::shared_ptr<StashBlock> a;
  std::shared_ptr<NoGradStash> mid;
  std::shared_ptr<Reader> reader;
  std::shared_ptr<remat::testing::TanhBlock> last;
};

}  // namespace

// A later layer that reads an earlier layer's member (inside one every-k group, or across
// regions), and a value kept under no-grad (it requires no grad, as under save-all), under every
// region policy and budget plans: gradients and the kept values are save-all's.
TEST(EscapedValues, ALaterLayerReadingAKeptValueAndANoGradValueMatchSaveAll) {
  auto run = [](const Policy& policy, bool& stat_requires_grad) {
    CrossModel model;
    Tensor x = randn({3, 5}, DType::f64, RngState{13, 0}).requires_grad_();
    TensorList out;
    ScopedPolicy scope(policy);
    for (int s = 0; s < (policy.keep.kind == Policy::Kind::budget ? BudgetPlanner::kProfilingSteps + 1 : 1); ++s) {
      model.zero_grad();
      Tensor out = mean(model.forward(x));
      Tensor loss = add(out, mean(model.a->cache));
      stat_requires_grad = model.mid->statistic.requires_grad();
      loss.backward();
    }
    for (const auto& p : model.parameters()) out.push_back(p.grad());
    out.push_back(model.a->cache.contiguous());
    out.push_back(model.mid->statistic.contiguous());
    return out;
  };
  bool reference_requires = true;
  const TensorList reference = run(Policy::save_all(), reference_requires);
  EXPECT_FALSE(reference_requires);
  std::vector<Policy> policies;
  for (const char* p : {"every-layer", "every-k:2", "every-k:4", "selective:matmul", "budget:auto"})
    policies.push_back(Policy::parse(p));
  {
    CrossModel probe;
    Tensor x = randn({3, 5}, DType::f64, RngState{13, 0}).requires_grad_();
    for (int s = 0; s < BudgetPlanner::kProfilingSteps; ++s) {
      ScopedPolicy scope(Policy::budget(size_t{1} << 40));
      Tensor out = mean(probe.forward(x));
      add(out, mean(probe.a->cache)).backward();
    }
    policies.push_back(Policy::budget(probe.planner()->feasible_range().value().smallest_budget_bytes));
  }
  for (const Policy& policy : policies) {
    const std::string p = policy.to_string();
    bool needs_grad = true;
    const TensorList got = run(policy, needs_grad);
    EXPECT_EQ(needs_grad, reference_requires) << p;
    ASSERT_EQ(got.size(), reference.size()) << p;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], reference[i])) << p << ": result " << i;
  }
}

namespace {

// A layer with a custom op that draws noise from remat's generator inside its forward (so a replay
// must start it at the first run's RNG state) and dropout, keeping the noisy value.
class NoisyStash : public nn::Module {
 public:
  explicit NoisyStash(int64_t width) {
    fc = register_module("fc", std::make_shared<nn::Linear>(width, width, true, DType::f64));
    noisy = CustomOp{"noisy",
                     [](const TensorList& in, SaveContext&) {
                       return TensorList{add(in[0], mul_scalar(randn(in[0].shape(), in[0].dtype()), 0.1))};
                     },
                     [](const TensorList& grads, const SavedValues&) { return TensorList{grads[0]}; }};
  }
  Tensor forward_impl(const Tensor& x) override {
    cache = noisy({dropout(fc->forward(x), 0.3, training())})[0];
    return tanh(cache);
  }
  std::shared_ptr<nn::Linear> fc;
  CustomOp noisy;
  Tensor cache;
};

}  // namespace

TEST(EscapedValues, ARandomCustomOpAndDropoutInALayerThatKeepsAValueReplayTheirDraws) {
  auto run = [](const Policy& policy) {
    auto root = std::make_shared<nn::Sequential>();
    auto a = std::make_shared<NoisyStash>(5);
    root->add(std::make_shared<remat::testing::TanhBlock>(5, DType::f64));
    root->add(a);
    root->add(std::make_shared<remat::testing::TanhBlock>(5, DType::f64));
    root->reset_parameters(21);
    Tensor x = randn({4, 5}, DType::f64, RngState{22, 0});
    ScopedPolicy scope(policy);
    manual_seed(23);
    Tensor out = mean(root->forward(x));
    Tensor loss = add(out, mean(square(a->cache)));
    loss.backward();
    TensorList r;
    for (const auto& p : root->parameters()) r.push_back(p.grad());
    r.push_back(a->cache.contiguous());
    return r;
  };
  const TensorList reference = run(Policy::save_all());
  for (const char* p : {"every-layer", "every-k:2", "selective:matmul"}) {
    reset_counters();
    const TensorList got = run(Policy::parse(p));
    ASSERT_EQ(got.size(), reference.size()) << p;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], reference[i])) << p << ": result " << i;
  }
}

namespace {

// A convolution block that keeps its batch norm's output: the running statistics are updated once
// per step (a declared side effect, which no recomputation repeats).
class BnStash : public nn::Module {
 public:
  BnStash() {
    conv = register_module("conv", std::make_shared<nn::Conv2d>(3, 4, Size2{3, 3}, Size2{1, 1}, Size2{1, 1}));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(4));
  }
  Tensor forward_impl(const Tensor& x) override {
    normalized = bn->forward(conv->forward(x));
    return relu(normalized);
  }
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::BatchNorm2d> bn;
  Tensor normalized;
};

}  // namespace

TEST(EscapedValues, ALayerThatKeepsItsBatchNormOutputUpdatesTheRunningStatisticsOnce) {
  auto run = [](const Policy& policy) {
    auto root = std::make_shared<nn::Sequential>();
    auto block = std::make_shared<BnStash>();
    root->add(block);
    root->add(std::make_shared<nn::Conv2d>(4, 2, Size2{3, 3}));
    root->reset_parameters(31);
    const Tensor x = randn({2, 3, 6, 6}, DType::f32, RngState{32, 0});
    ScopedPolicy scope(policy);
    TensorList r;
    for (int step = 0; step < 2; ++step) {
      root->zero_grad();
      Tensor out = mean(root->forward(x));
      add(out, mean(square(block->normalized))).backward();
    }
    for (const auto& p : root->parameters()) r.push_back(p.grad());
    for (const auto& [name, b] : root->named_buffers()) r.push_back(b.contiguous().clone());
    r.push_back(block->normalized.contiguous());
    return r;
  };
  const TensorList reference = run(Policy::save_all());
  for (const char* p : {"every-layer", "every-k:2", "selective:conv2d"}) {
    reset_counters();
    const TensorList got = run(Policy::parse(p));
    ASSERT_EQ(got.size(), reference.size()) << p;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], reference[i])) << p << ": result " << i;
  }
}

// A forward pass whose backward never runs (an evaluation with grad mode on, an error before the
// backward): the kept value's history points at its region, and the region does not hold the
// module, so the model is freed with the last handle to it.
TEST(EscapedValues, AModelWhoseBackwardNeverRunsIsFreed) {
  for (const char* p : {"every-layer", "every-k:2", "selective:matmul"}) {
    std::weak_ptr<nn::Module> alive, block;
    {
      auto model = fresh_model();
      std::shared_ptr<AuxModel> shared(model.release());
      alive = shared;
      block = shared->a;
      ScopedPolicy scope(Policy::parse(p));
      Tensor loss = shared->loss(input());
      EXPECT_TRUE(shared->a->cache.requires_grad()) << p;
    }
    EXPECT_TRUE(alive.expired()) << p << ": the model outlived its last handle";
    EXPECT_TRUE(block.expired()) << p << ": the layer that kept a value outlived the model";
  }
}
