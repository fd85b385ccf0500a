// Issue 54, "An error save-all raises, missing" (items 9 and 10) and "Refused with a false
// reason": save-all's error must be raised under every policy, and a refusal must be true.
#include <chrono>
#include <thread>

#include "never_silent.h"

using namespace remat;
using namespace remat::never_silent;

namespace {

Tensor mse(const Tensor& a) { return mean(square(a)); }

void scale_in_place(const Tensor& t, double by) {
  NoGradGuard no_grad;
  Tensor target = t;
  target.copy_(mul_scalar(t.detach(), by));
}

// Two layers; the model also returns the first layer's output, which the second (a Linear) saves.
class TwoLayers : public nn::Module {
 public:
  TwoLayers() {
    l0 = register_module("l0", std::make_shared<Block>());
    l1 = register_module("l1", std::make_shared<Block>());
    l2 = register_module("l2", std::make_shared<Block>());
  }
  TensorList forward_list_impl(const TensorList& in) override {
    const Tensor h = l0->forward(in[0]);
    return {l2->forward(l1->forward(h)), h};
  }
  std::shared_ptr<Block> l0, l1, l2;
};

// Item 9 (and 10 with `wait`): the first layer's output, saved by the next layer, is modified in
// place by the model's code after the forward pass.
Body modified_after_forward(std::chrono::milliseconds wait) {
  return [wait](Recorder& rec) {
    auto model = std::make_shared<TwoLayers>();
    train(rec, model, {}, [&](Recorder&, const Tensor& x, int) {
      const TensorList out = model->forward(TensorList{x});
      if (wait.count() > 0) std::this_thread::sleep_for(wait);  // an offload write finishes first
      scale_in_place(out[1], 0.5);
      return mse(out[0]);
    });
  };
}

}  // namespace

TEST(NeverSilentItem9, ALayerOutputSavedByTheNextLayerAndModifiedInPlace) {
  expect_raises_like_save_all(modified_after_forward(std::chrono::milliseconds(0)), "in place", {Rule::in_place});
}

// Item 10: raised or not depending on whether the background write finished first. Repeated, with
// and without giving the write time to finish, under the policies that offload.
TEST(NeverSilentItem10, ASavedValueModifiedInPlaceAfterItWasOffloaded) {
  const std::vector<std::string> offloading = {"offload", "every-layer+offload", "budget:large", "budget+offload",
                                               "every-k:2+offload"};
  for (int rep = 0; rep < 6; ++rep) {
    const auto wait = std::chrono::milliseconds(rep % 2 == 0 ? 0 : 30);
    program_fuzz::MatrixOptions o;
    o.policies = offloading;
    o.broken_rules = {Rule::in_place};
    const program_fuzz::MatrixResult m = program_fuzz::run_matrix(modified_after_forward(wait), o);
    ASSERT_TRUE(m.save_all.error.has_value());
    for (const auto& p : m.pairs)
      EXPECT_TRUE(p.verdict.kind == program_fuzz::VerdictKind::ok || p.verdict.kind == program_fuzz::VerdictKind::refused)
          << "repetition " << rep << ": " << program_fuzz::describe(p);
  }
}

namespace {

// False reason 1: the model's code reads the next layer's parameter before calling it (a gate
// tied to that layer).
class TiedGate : public nn::Module {
 public:
  TiedGate() {
    l0 = register_module("l0", std::make_shared<Block>());
    l1 = register_module("l1", std::make_shared<Block>());
  }
  Tensor forward_impl(const Tensor& x) override {
    const Tensor h = l0->forward(x);
    return l1->forward(mul(h, sigmoid(l1->fc->bias)));
  }
  std::shared_ptr<Block> l0, l1;
};

}  // namespace

TEST(NeverSilentFalseReason, AGateReadingTheNextLayersParameterIsNotRefused) {
  expect_matches_save_all([](Recorder& rec) {
    auto model = std::make_shared<TiedGate>();
    train(rec, model, {}, [&](Recorder&, const Tensor& x, int) { return mse(model->forward(x)); });
  });
}

// False reason 2: a parameter that no op saves is modified in place between the forward and the
// backward pass. Save-all does not raise; a recomputing policy cannot give save-all's bits (the
// recomputation would read the new bias), so it may refuse, but its message must not claim that
// save-all raises, and must name the parameter it knows.
TEST(NeverSilentFalseReason, AnInPlaceRefusalNamesTheParameterAndDoesNotClaimSaveAllRaises) {
  const program_fuzz::MatrixResult m = expect_matches_save_all(
      [](Recorder& rec) {
        auto model = std::make_shared<TwoLayers>();
        train(rec, model, {}, [&](Recorder&, const Tensor& x, int) {
          const Tensor loss = mse(model->forward(TensorList{x})[0]);
          scale_in_place(model->l1->fc->bias, 0.5);
          return loss;
        });
      },
      {Rule::in_place});
  for (const auto& p : m.pairs) {
    if (p.verdict.kind != program_fuzz::VerdictKind::refused) continue;
    EXPECT_NE(p.verdict.detail.find("bias"), std::string::npos) << program_fuzz::describe(p);
  }
}

namespace {

// The warnings of one forward and two backward passes through a retained graph, on a thread of
// its own (the "met no checkpoint region" warning is given once per thread).
std::vector<std::string> warnings_of_retained_backward(const std::string& scoped, bool model_save_all) {
  std::vector<std::string> warnings;
  std::thread worker([&] {
    set_warning_handler([&](const std::string& m) { warnings.push_back(m); });
    try {
      ScopedPolicy policy(program_fuzz::policy_text(scoped, {}, program_fuzz::scratch_directory()));
      auto model = std::make_shared<TwoLayers>();
      if (model_save_all) model->set_policy(Policy::save_all());
      const Tensor x = randn({3, kWidth}, DType::f32, RngState{3, 0});
      const Tensor loss = mse(model->forward(TensorList{x})[0]);
      loss.backward(Tensor(), true);
      loss.backward();
    } catch (const std::exception& e) {
      warnings.push_back(std::string("raised: ") + e.what());
    }
    set_warning_handler(nullptr);
  });
  worker.join();
  return warnings;
}

}  // namespace

// False reason 3: "ran under policy every-layer but met no checkpoint region" for a model set to
// save-all (or run under dynamic: or offload:) running a second backward through a retained graph.
TEST(NeverSilentFalseReason, NoFalseWarningForASecondBackwardOfAModelThatRecomputesNothing) {
  const struct {
    const char* scoped;
    bool model_save_all;
  } cases[] = {{"every-layer", true}, {"dynamic:1073741824", false}, {"offload", false}};
  for (const auto& c : cases) {
    for (const std::string& w : warnings_of_retained_backward(c.scoped, c.model_save_all)) {
      EXPECT_EQ(w.find("met no checkpoint region"), std::string::npos)
          << c.scoped << (c.model_save_all ? ", model set to save-all" : "") << ": " << w;
      EXPECT_NE(w.rfind("raised: ", 0), 0u) << c.scoped << ": " << w;
    }
  }
}
