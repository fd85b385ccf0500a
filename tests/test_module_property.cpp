// Property test over module-structured random models, written the way users write them: their own
// classes with loops over layers, residual trees in their own code, parallel branches, layers with
// several inputs or outputs, shared sub-modules, dropout, custom ops, explicit regions inside
// layers, the library's containers, layers that keep an intermediate (in a member, or appended to
// the model's list) for an auxiliary loss, and random per-module overrides (policies,
// transparent, layer). The loss is the output's mean plus mean(square(v)) of every kept value.
// Under random policies: gradients bitwise equal to save-all, and the kept values read after the
// backward pass are save-all's bits; every region recomputed exactly once; no op recomputed more
// than once unless a nested region was asked for; peak saved bytes within the header's bound;
// selective never above save-all, except by the inputs of layers whose input no op saves
// (remat/call.h). Then every case under every policy, budgets from the smallest feasible one up,
// dynamic: and offload: included, against save-all's gradients, kept values and errors (the same
// kind and message).
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <random>

#include "module_models.h"

using namespace remat;
using remat::testing::TwoOut;
using remat::testing::measure_step;
using remat::testing::StepMeasure;
using remat::testing::region_bound;
using remat::testing::bitwise_equal;

namespace {

using ModulePtr = std::shared_ptr<nn::Module>;

class Dense : public nn::Module {
 public:
  Dense(int64_t width, DType dtype, int act) : act_(act) {
    fc = register_module("fc", std::make_shared<nn::Linear>(width, width, true, dtype));
  }
  Tensor forward_impl(const Tensor& x) override {
    Tensor z = fc->forward(x);
    switch (act_) {
      case 0: return tanh(z);
      case 1: return gelu(z, true);
      case 2: return silu(z);
      case 3: return sigmoid(z);
      default: return gelu(z);
    }
  }
  std::shared_ptr<nn::Linear> fc;

 private:
  int act_;
};

class DropoutBlock : public nn::Module {
 public:
  DropoutBlock(ModulePtr inner, double p) : p_(p) { inner_ = register_module("inner", std::move(inner)); }
  Tensor forward_impl(const Tensor& x) override { return dropout(inner_->forward(x), p_, training()); }

 private:
  ModulePtr inner_;
  double p_;
};

// Layers that begin with something other than a Linear: an op that keeps nothing of its input
// (dropout keeps its mask; add and mul_scalar keep nothing), then the inner layer.
class DropoutFirst : public nn::Module {
 public:
  DropoutFirst(ModulePtr inner, double p) : p_(p) { inner_ = register_module("inner", std::move(inner)); }
  Tensor forward_impl(const Tensor& x) override { return inner_->forward(dropout(x, p_, training())); }

 private:
  ModulePtr inner_;
  double p_;
};

class AddFirst : public nn::Module {
 public:
  explicit AddFirst(ModulePtr inner) { inner_ = register_module("inner", std::move(inner)); }
  Tensor forward_impl(const Tensor& x) override { return inner_->forward(add(x, mul_scalar(x, 0.5))); }

 private:
  ModulePtr inner_;
};

class CustomBlock : public nn::Module {
 public:
  explicit CustomBlock(ModulePtr inner) : op_(remat::testing::fused_silu()) { inner_ = register_module("inner", std::move(inner)); }
  Tensor forward_impl(const Tensor& x) override { return op_({inner_->forward(x)})[0]; }

 private:
  ModulePtr inner_;
  CustomOp op_;
};

// The user's own residual loop: h = h + dropout(0.5 * child(h)), the add and the dropout (which
// draws from the generator between layer calls) in the model's code.
class ResidualLoop : public nn::Module {
 public:
  ResidualLoop(std::vector<ModulePtr> children, double p) : p_(p) {
    for (size_t i = 0; i < children.size(); ++i) children_.push_back(register_module("r" + std::to_string(i), children[i]));
  }
  Tensor forward_impl(const Tensor& x) override {
    Tensor h = x;
    for (auto& c : children_) h = add(h, dropout(mul_scalar(c->forward(h), 0.5), p_, training()));
    return h;
  }

 private:
  std::vector<ModulePtr> children_;
  double p_;
};

// Two branches on the same input, summed in user code.
class Branches : public nn::Module {
 public:
  Branches(ModulePtr a, ModulePtr b) {
    a_ = register_module("a", std::move(a));
    b_ = register_module("b", std::move(b));
  }
  Tensor forward_impl(const Tensor& x) override { return add(a_->forward(x), b_->forward(x)); }

 private:
  ModulePtr a_, b_;
};

// A layer with two inputs, called by user code.
class TwoIn : public nn::Module {
 public:
  TwoIn(int64_t width, DType dtype) {
    a = register_module("a", std::make_shared<nn::Linear>(width, width, true, dtype));
    b = register_module("b", std::make_shared<nn::Linear>(width, width, true, dtype));
  }
  TensorList forward_list_impl(const TensorList& in) override {
    return {tanh(add(mul(a->forward(in[0]), in[1]), b->forward(in[1])))};
  }
  std::shared_ptr<nn::Linear> a, b;
};
class TwoInUser : public nn::Module {
 public:
  TwoInUser(int64_t width, DType dtype) { mix = register_module("mix", std::make_shared<TwoIn>(width, dtype)); }
  Tensor forward_impl(const Tensor& x) override { return mix->forward(x, mul_scalar(x, 0.5)); }
  std::shared_ptr<TwoIn> mix;
};

class TwoOutUser : public nn::Module {
 public:
  TwoOutUser(int64_t width, DType dtype) { split = register_module("split", std::make_shared<TwoOut>(width, dtype)); }
  Tensor forward_impl(const Tensor& x) override {
    TensorList parts = split->forward(TensorList{x});
    return add(parts[0], mul_scalar(parts[1], 0.25));
  }
  std::shared_ptr<TwoOut> split;
};

// One sub-module called twice.
class Twice : public nn::Module {
 public:
  explicit Twice(ModulePtr child) { child_ = register_module("child", std::move(child)); }
  Tensor forward_impl(const Tensor& x) override { return child_->forward(child_->forward(x)); }

 private:
  ModulePtr child_;
};

// An explicit region inside a layer (multi-level).
class Explicit : public nn::Module {
 public:
  explicit Explicit(ModulePtr child) { child_ = register_module("child", std::move(child)); }
  Tensor forward_impl(const Tensor& x) override {
    ModulePtr c = child_;
    return checkpoint([c](const Tensor& h) { return c->forward(h); }, x);
  }

 private:
  ModulePtr child_;
};

// What layers keep for the loss: the model's list, and the layers with a member.
struct Kept {
  TensorList list;
  std::vector<const Tensor*> members;
  TensorList values() const {
    TensorList v;
    for (const Tensor* m : members)
      if (m->defined()) v.push_back(*m);
    v.insert(v.end(), list.begin(), list.end());
    return v;
  }
};

// A layer that keeps sigmoid(inner(x)) for an auxiliary loss, in a member or appended to the
// model's list, and returns inner(x) + 0.25 * that value.
class Stash : public nn::Module {
 public:
  Stash(ModulePtr inner, Kept* kept, bool to_list) : kept_(kept), to_list_(to_list) {
    inner_ = register_module("inner", std::move(inner));
    if (!to_list_) kept_->members.push_back(&cache);
  }
  Tensor forward_impl(const Tensor& x) override {
    Tensor h = inner_->forward(x);
    Tensor s = sigmoid(h);
    if (to_list_)
      kept_->list.push_back(s);
    else
      cache = s;
    return add(h, mul_scalar(s, 0.25));
  }
  Tensor cache;

 private:
  ModulePtr inner_;
  Kept* kept_;
  bool to_list_;
};

// The model: a loop over its layers, with dropout between them in its own code (so the generator
// is drawn from between layer calls, inside every-k groups too).
class Root : public nn::Module {
 public:
  Root(std::vector<ModulePtr> layers, double p, std::shared_ptr<Kept> kept = std::make_shared<Kept>())
      : p_(p), kept_(std::move(kept)) {
    for (size_t i = 0; i < layers.size(); ++i) layers_.push_back(register_module("l" + std::to_string(i), layers[i]));
  }
  Tensor forward_impl(const Tensor& x) override {
    kept_->list.clear();
    Tensor h = x;
    for (auto& l : layers_) h = dropout(l->forward(h), p_, training());
    return h;
  }
  // mean(forward(x)) + the auxiliary losses of what the layers kept
  Tensor loss(const Tensor& x) {
    Tensor l = mean(forward(x));
    for (const Tensor& v : kept_->values()) l = add(l, mean(square(v)));
    return l;
  }
  const Kept& kept() const { return *kept_; }

 private:
  std::vector<ModulePtr> layers_;
  double p_;
  std::shared_ptr<Kept> kept_;
};

// One step of root.loss(x) under `policy` (dropout seeded): the gradients of every parameter and
// x, then (appended) the values the layers kept, read after the backward pass.
TensorList step_with_kept(Root& model, const Tensor& x, const Policy& policy, uint64_t dropout_seed) {
  TensorList wrt = model.parameters();
  if (x.requires_grad()) wrt.push_back(x);
  manual_seed(dropout_seed);
  TensorList out = remat::grad([&](const TensorList&) { return model.loss(x); }, wrt, GradOptions{policy});
  for (const Tensor& v : model.kept().values()) out.push_back(v.detach().contiguous());
  return out;
}

struct Builder {
  std::mt19937_64 rng;
  DType dtype;
  int64_t width;
  std::vector<std::function<void(bool)>> overrides;  // apply (true) or clear (false)
  bool multilevel = false;       // an explicit region or a set_layer() override exists
  std::string trace;
  std::shared_ptr<Kept> kept = std::make_shared<Kept>();  // for the Root

  explicit Builder(uint64_t seed) : rng(seed) {
    dtype = pick(2) == 0 ? DType::f32 : DType::f64;
    width = 3 + pick(6);
  }
  int pick(int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); }

  std::optional<Policy> random_policy() {
    switch (pick(5)) {
      case 0: return Policy::save_all();
      case 1: return Policy::every_layer();
      case 2: return Policy::every_k(2);
      case 3: return Policy::parse("selective:matmul");
      default: return std::nullopt;
    }
  }

  // Random overrides on m, applied only in the run under test.
  void maybe_override(const ModulePtr& m, bool container) {
    switch (pick(8)) {
      case 0: {
        auto p = random_policy();
        overrides.push_back([m, p](bool on) { m->set_policy(on ? p : std::nullopt); });
        trace += "[" + (p ? p->to_string() : std::string("inherit")) + "]";
        break;
      }
      case 1:
        if (container) {
          CallRole previous = m->role();
          overrides.push_back([m, previous](bool on) { m->set_role(on ? CallRole::transparent : previous); });
          trace += "[transparent]";
        }
        break;
      case 2: {
        CallRole previous = m->role();
        overrides.push_back([m, previous](bool on) { m->set_role(on ? CallRole::layer : previous); });
        multilevel = true;
        trace += "[layer]";
        break;
      }
      default: break;
    }
  }

  ModulePtr dense() {
    trace += "dense ";
    ModulePtr m = std::make_shared<Dense>(width, dtype, pick(5));
    maybe_override(m, false);
    return m;
  }

  ModulePtr block(int depth) {
    int kind = depth <= 0 ? pick(5) : pick(16);
    if (depth <= 0 && kind >= 3) kind += 11;  // a leaf: dense, dropout, custom or a stash
    ModulePtr m;
    switch (kind) {
      case 0: return dense();
      case 14:
      case 15:
        trace += kind == 15 ? "stash-list(" : "stash(";
        m = std::make_shared<Stash>(depth <= 0 ? dense() : block(depth - 1), kept.get(), kind == 15);
        trace += ") ";
        break;
      case 1:
        trace += "dropout(";
        m = std::make_shared<DropoutBlock>(dense(), 0.1 + 0.1 * pick(3));
        trace += ") ";
        break;
      case 2:
        trace += "custom(";
        m = std::make_shared<CustomBlock>(dense());
        trace += ") ";
        break;
      case 3: {
        trace += "resloop(";
        std::vector<ModulePtr> children;
        for (int i = 0, n = 1 + pick(3); i < n; ++i) children.push_back(block(depth - 1));
        m = std::make_shared<ResidualLoop>(children, pick(2) == 0 ? 0.0 : 0.2);
        trace += ") ";
        maybe_override(m, true);
        return m;
      }
      case 4:
        trace += "branches(";
        m = std::make_shared<Branches>(block(depth - 1), block(depth - 1));
        trace += ") ";
        maybe_override(m, true);
        return m;
      case 5:
        trace += "two-in ";
        m = std::make_shared<TwoInUser>(width, dtype);
        break;
      case 6:
        trace += "two-out ";
        m = std::make_shared<TwoOutUser>(width, dtype);
        maybe_override(m, true);
        return m;
      case 7:
        trace += "twice(";
        m = std::make_shared<Twice>(block(depth - 1));
        trace += ") ";
        break;
      case 8:
        trace += "explicit(";
        m = std::make_shared<Explicit>(block(depth - 1));
        multilevel = true;
        trace += ") ";
        break;
      case 9: {
        trace += "sequential(";
        auto seq = std::make_shared<nn::Sequential>();
        for (int i = 0, n = 1 + pick(3); i < n; ++i) seq->add(block(depth - 1));
        trace += ") ";
        m = seq;
        break;
      }
      case 10:
        trace += "residual(";
        m = std::make_shared<nn::Residual>(block(depth - 1));
        trace += ") ";
        break;
      case 12:
        trace += "dropout-first(";
        m = std::make_shared<DropoutFirst>(block(depth - 1), 0.2);
        trace += ") ";
        break;
      case 13:
        trace += "add-first(";
        m = std::make_shared<AddFirst>(block(depth - 1));
        trace += ") ";
        break;
      default: {
        trace += "parallel(";
        auto par = std::make_shared<nn::Parallel>();
        par->add(block(depth - 1));
        par->add(block(depth - 1));
        auto seq = std::make_shared<nn::Sequential>();
        seq->add(par);
        seq->add(std::make_shared<nn::Linear>(2 * width, width, true, dtype));
        trace += ") ";
        m = seq;
        break;
      }
    }
    maybe_override(m, false);
    return m;
  }

  void apply_overrides(bool on) {
    for (auto& o : overrides) o(on);
  }
};

Policy random_policy(std::mt19937_64& rng) {
  static const char* policies[] = {"every-layer", "every-k:2", "every-k:3", "selective:matmul", "selective:tanh,add",
                                   "save-all"};
  return Policy::parse(policies[rng() % 6]);
}

}  // namespace

TEST(ModuleProperty, RandomModuleModelsUnderRandomPoliciesMatchSaveAllBitwise) {
  const int cases = 240;
  std::mt19937_64 policy_rng(2026);
  int with_overrides = 0, multilevel_cases = 0, beyond_save_all = 0;
  size_t kept_values = 0;
  // To reproduce one case by hand: REMAT_PROPERTY_CASE=N (and REMAT_PROPERTY_POLICY=... to try
  // another policy on it); the case then prints its regions.
  const char* only = std::getenv("REMAT_PROPERTY_CASE");
  for (int c = 0; c < cases; ++c) {
    if (only != nullptr && c != std::atoi(only)) continue;
    Builder builder(5000 + static_cast<uint64_t>(c));
    std::vector<ModulePtr> layers;
    for (int i = 0, n = 1 + builder.pick(5); i < n; ++i) layers.push_back(builder.block(3));
    Root model(layers, builder.pick(3) == 0 ? 0.0 : 0.15, builder.kept);
    model.reset_parameters(static_cast<uint64_t>(c));
    const int64_t batch = 1 + builder.pick(4);
    Tensor x = randn({batch, builder.width}, builder.dtype, RngState{static_cast<uint64_t>(c), 7}).requires_grad_();
    Policy policy = random_policy(policy_rng);
    if (const char* p = std::getenv("REMAT_PROPERTY_POLICY")) policy = Policy::parse(p);
    const bool overrides = !builder.overrides.empty() && builder.pick(2) == 1;
    const std::string what = "case " + std::to_string(c) + " policy " + policy.to_string() +
                             (overrides ? " with overrides" : "") + "; model: " + builder.trace;

    builder.apply_overrides(false);
    TensorList reference = step_with_kept(model, x, Policy::save_all(), 77 + static_cast<uint64_t>(c));
    builder.apply_overrides(overrides);
    TensorList got = step_with_kept(model, x, policy, 77 + static_cast<uint64_t>(c));
    ASSERT_EQ(got.size(), reference.size()) << what;  // the kept values too: the list is as long
    for (size_t i = 0; i < got.size(); ++i) {
      if (only != nullptr && !bitwise_equal(got[i], reference[i]))
        std::printf("result %zu (%s) differs: max abs diff %g\n", i,
                    i < model.named_parameters().size() ? model.named_parameters()[i].first.c_str() : "x or kept",
                    max(abs(sub(got[i], reference[i]))).item());
      ASSERT_TRUE(bitwise_equal(got[i], reference[i])) << what << ": gradient or kept value " << i;
    }
    kept_values += got.size() - model.parameters().size() - 1;

    // no region recomputed twice (one that dropped nothing a node saved, or whose values all still
    // live, is not recomputed at all); without nesting, no op more than once
    auto m = measure_step(model, x, policy, 77 + static_cast<uint64_t>(c));
    if (only != nullptr) std::printf("%s", memory_report().c_str());
    EXPECT_LE(m.counters.regions_recomputed, m.counters.regions.size()) << what;
    for (const auto& r : m.counters.regions) {
      EXPECT_LE(r.recomputations, 1u) << what << ": region " << r.label;
      if (r.recomputed_saved_bytes > 0) EXPECT_EQ(r.recomputations, 1u) << what << ": region " << r.label;
    }
    const bool nested = builder.multilevel;
    if (!nested) {
      const uint64_t first_run = m.counters.ops.forward_ops - m.counters.ops.recomputed_ops;
      EXPECT_LE(m.counters.ops.recomputed_ops, first_run) << what;
      // the bound of the header: what the regions keep + one re-run (the ops outside regions here
      // keep nothing; overrides may run layers plain, outside any region)
      if (!overrides && policy.recomputes()) EXPECT_LE(m.peak_saved, region_bound(m.counters)) << what;
    }
    builder.apply_overrides(false);
    if (!nested) {
      // selective keeps a subset of what save-all keeps, plus (remat/call.h) the inputs of layers
      // whose input no op saves (here: the layers that begin with dropout or an add)
      const size_t save_all = measure_step(model, x, Policy::save_all()).peak_saved;
      const StepMeasure selective = measure_step(model, x, Policy::parse("selective:matmul"));
      size_t boundaries = 0;
      for (const auto& r : selective.counters.regions) boundaries += r.boundary_bytes;
      if (builder.trace.find("-first") == std::string::npos) {
        EXPECT_LE(selective.peak_saved, save_all) << what;
      } else {
        EXPECT_LE(selective.peak_saved, save_all + boundaries) << what;
        beyond_save_all += selective.peak_saved > save_all ? 1 : 0;
      }
    }
    with_overrides += overrides ? 1 : 0;
    multilevel_cases += nested ? 1 : 0;
  }
  RecordProperty("cases_with_overrides", with_overrides);
  RecordProperty("cases_with_nested_regions", multilevel_cases);
  RecordProperty("cases_where_selective_keeps_layer_inputs_save_all_does_not", beyond_save_all);
  RecordProperty("kept_values_compared", static_cast<int>(kept_values));
  EXPECT_GT(with_overrides, cases / 10);
  EXPECT_GT(kept_values, static_cast<size_t>(cases)) << "few models kept values: the auxiliary losses prove little";
}

namespace {

// The gradients and kept values of one step of `model` under `policy` (a budget plan: after its
// profiling steps), or the error it raised: its kind and message.
std::string grads_or_error(Root& model, const Tensor& x, const Policy& policy, uint64_t seed, TensorList& grads) {
  try {
    if (policy.keep.kind == Policy::Kind::budget)
      for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) step_with_kept(model, x, policy, seed);
    grads = step_with_kept(model, x, policy, seed);
  } catch (const OutOfMemory& e) {
    return std::string("out of memory: ") + e.what();
  } catch (const Error& e) {
    return std::string("error: ") + e.what();
  }
  return "";
}

// The smallest budget the planner plans from (BudgetPlanner::feasible_range after the profiling
// steps), or 0 where the step raised.
size_t smallest_feasible_budget(Root& model, const Tensor& x, uint64_t seed) {
  TensorList ignored;
  if (!grads_or_error(model, x, Policy::budget(size_t{1} << 40), seed, ignored).empty()) return 0;
  const auto range = model.planner()->feasible_range();
  return range ? range->smallest_budget_bytes : 0;
}

// The smallest dynamic: budget a step needs: the lower bound a generous run reports, raised to the
// need each failed try reports.
size_t smallest_dynamic_budget(Root& model, const Tensor& x, uint64_t seed) {
  TensorList ignored;
  grads_or_error(model, x, Policy::dynamic(size_t{1} << 40), seed, ignored);
  size_t budget = std::max<size_t>(1, counters().dynamic.smallest_feasible_bytes);
  for (int attempt = 0; attempt < 30; ++attempt) {
    if (grads_or_error(model, x, Policy::dynamic(budget), seed, ignored).empty()) return budget;
    const size_t need = counters().dynamic.smallest_feasible_bytes;
    budget = need > budget ? need : budget + budget / 4 + 1;
  }
  return budget;
}

// A policy's run against save-all's: a budget below the smallest feasible one is skipped; where
// save-all raised (`bad_input`) the policy must raise the same error (kind and message); else its
// gradients and kept values must be bitwise save-all's (fatal failures: the caller returns on
// HasFatalFailure()).
enum class Outcome { infeasible_budget, raised, matched };
void check_against_save_all(const Policy& policy, const std::string& error, const TensorList& got, bool bad_input,
                            const TensorList& reference, const std::string& reference_error, const std::string& under,
                            Outcome& outcome) {
  outcome = Outcome::infeasible_budget;
  if (policy.keep.kind == Policy::Kind::budget && error.find("smallest feasible budget") != std::string::npos) return;
  outcome = Outcome::raised;
  if (bad_input) {
    EXPECT_EQ(error, reference_error) << under << ": not save-all's error";
    return;
  }
  ASSERT_EQ(error, "") << under;
  ASSERT_EQ(got.size(), reference.size()) << under;
  for (size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(bitwise_equal(got[i], reference[i])) << under << ": gradient " << i;
  outcome = Outcome::matched;
}

}  // namespace

// Every case under every policy: the region policies, budget plans at four budgets from the
// smallest feasible one (the planner's) to save-all's peak, dynamic: from the smallest feasible
// budget to save-all's peak, and offload:. Gradients and kept values bitwise equal to save-all's,
// and where save-all raises (a quarter of the cases get an input of the wrong width) every policy
// raises the same error. Some layers begin with something other than a Linear (dropout, a
// residual add).
TEST(ModuleProperty, EveryCaseUnderEveryPolicyMatchesSaveAllGradientsAndErrors) {
  const int cases = 40;
  int raising = 0, planned = 0;
  uint64_t rematerializations = 0;
  for (int c = 0; c < cases; ++c) {
    Builder builder(9000 + static_cast<uint64_t>(c));
    std::vector<ModulePtr> layers;
    for (int i = 0, n = 1 + builder.pick(4); i < n; ++i) layers.push_back(builder.block(2));
    Root model(layers, builder.pick(3) == 0 ? 0.0 : 0.15, builder.kept);
    model.reset_parameters(static_cast<uint64_t>(c));
    const bool bad_input = builder.pick(4) == 0;
    const int64_t batch = 1 + builder.pick(4);
    Tensor x = randn({batch, builder.width + (bad_input ? 1 : 0)}, builder.dtype, RngState{static_cast<uint64_t>(c), 7})
                   .requires_grad_();
    const uint64_t seed = 90 + static_cast<uint64_t>(c);
    const std::string what = "case " + std::to_string(c) + "; model: " + builder.trace;
    TensorList reference;
    const std::string reference_error = grads_or_error(model, x, Policy::save_all(), seed, reference);
    ASSERT_EQ(reference_error.empty(), !bad_input) << what << ": " << reference_error;
    raising += bad_input ? 1 : 0;

    std::vector<Policy> policies;
    for (const char* p : {"every-layer", "every-k:2", "every-k:3", "selective:matmul", "selective:tanh,add"})
      policies.push_back(Policy::parse(p));
    policies.push_back(Policy::offload(::testing::TempDir(), 0));
    if (!bad_input) {
      const size_t save_all_peak = measure_step(model, x, Policy::save_all(), seed).peak_saved;
      const size_t smallest_budget = std::max<size_t>(smallest_feasible_budget(model, x, seed), 1);
      const size_t roof = std::max(save_all_peak, smallest_budget);
      for (size_t b : {smallest_budget, smallest_budget + (roof - smallest_budget) / 4, (smallest_budget + roof) / 2, roof})
        policies.push_back(Policy::budget(b));
      const size_t smallest = smallest_dynamic_budget(model, x, seed);
      const size_t top = std::max(save_all_peak, smallest);
      for (size_t b : {smallest, (smallest + top) / 2, top}) policies.push_back(Policy::dynamic(b));
    } else {
      policies.push_back(Policy::budget(1 << 20));
      policies.push_back(Policy::dynamic(1 << 20));
    }
    for (const Policy& policy : policies) {
      TensorList got;
      reset_counters();
      const std::string error = grads_or_error(model, x, policy, seed, got);
      rematerializations += counters().dynamic.rematerializations;
      Outcome outcome;
      check_against_save_all(policy, error, got, bad_input, reference, reference_error,
                             what + " under " + policy.to_string(), outcome);
      if (::testing::Test::HasFatalFailure()) return;
      if (outcome != Outcome::infeasible_budget && policy.keep.kind == Policy::Kind::budget) ++planned;
    }
  }
  EXPECT_GT(raising, 0);
  EXPECT_GT(planned, cases);
  EXPECT_GT(rematerializations, 0u) << "dynamic: never recomputed; the budgets prove nothing";
}

// The two axes composed: every keep form (save-all, every-layer, every-k, selective, a budget
// between the smallest feasible one and save-all's peak, budget:auto, dynamic: between its
// smallest feasible budget and save-all's peak) with its kept (or, for dynamic:, evicted) values
// in memory and in files (every value, and those of 256 bytes and more). Gradients and kept
// values bitwise equal to save-all's; where save-all raises, every composition raises its error.
TEST(ModuleProperty, EveryCompositionOfKeepAndOffloadMatchesSaveAll) {
  const int cases = 16;
  uint64_t offloaded = 0, offloaded_by_regions = 0;  // values written; those under policies that make regions
  int compared = 0;
  for (int c = 0; c < cases; ++c) {
    Builder builder(7000 + static_cast<uint64_t>(c));
    std::vector<ModulePtr> layers;
    for (int i = 0, n = 2 + builder.pick(3); i < n; ++i) layers.push_back(builder.block(2));
    Root model(layers, builder.pick(3) == 0 ? 0.0 : 0.15, builder.kept);
    model.reset_parameters(static_cast<uint64_t>(c));
    const bool bad_input = c % 5 == 4;
    Tensor x = randn({1 + builder.pick(3), builder.width + (bad_input ? 1 : 0)}, builder.dtype,
                     RngState{static_cast<uint64_t>(c), 9})
                   .requires_grad_();
    const uint64_t seed = 70 + static_cast<uint64_t>(c);
    const std::string what = "case " + std::to_string(c) + "; model: " + builder.trace;
    TensorList reference;
    const std::string reference_error = grads_or_error(model, x, Policy::save_all(), seed, reference);
    ASSERT_EQ(reference_error.empty(), !bad_input) << what << ": " << reference_error;

    std::vector<Policy> keeps;
    for (const char* p : {"save-all", "every-layer", "every-k:2", "selective:matmul", "budget:auto"})
      keeps.push_back(Policy::parse(p));
    if (!bad_input) {
      const size_t save_all_peak = measure_step(model, x, Policy::save_all(), seed).peak_saved;
      const size_t smallest_budget = smallest_feasible_budget(model, x, seed);
      keeps.push_back(Policy::budget(std::max<size_t>((smallest_budget + std::max(save_all_peak, smallest_budget)) / 2, 1)));
      // between the smallest feasible budget and save-all's peak: it evicts (to the file, too)
      keeps.push_back(Policy::dynamic(std::max<size_t>((smallest_dynamic_budget(model, x, seed) + save_all_peak) / 2, 1)));
    } else {
      keeps.push_back(Policy::dynamic(size_t{1} << 20));
    }
    for (const Policy& keep : keeps) {
      for (const std::optional<size_t> threshold : {std::optional<size_t>{}, std::optional<size_t>{0}, std::optional<size_t>{256}}) {
        const Policy policy = threshold ? keep.with_offload({::testing::TempDir(), *threshold, 0}) : keep;
        ASSERT_EQ(Policy::parse(policy.to_string()), policy) << policy.to_string();
        TensorList got;
        reset_counters();
        const std::string error = grads_or_error(model, x, policy, seed, got);
        offloaded += counters().dynamic.offloaded;
        if (policy.keep.recomputes() && !policy.keep.budget_auto) offloaded_by_regions += counters().dynamic.offloaded;
        Outcome outcome;
        check_against_save_all(policy, error, got, bad_input, reference, reference_error,
                               what + " under " + policy.to_string(), outcome);
        if (::testing::Test::HasFatalFailure()) return;
        compared += outcome == Outcome::matched;
      }
    }
  }
  EXPECT_GT(offloaded, 0u) << "no composition wrote a value: the offload axis proves nothing";
  EXPECT_GT(offloaded_by_regions, 0u) << "no region policy wrote its kept boundaries: the compositions prove nothing";
  EXPECT_GE(compared, 12 * 7 * 3 * 3 / 4);
}
