// Issue 54, "Silently wrong", items 1-8: programs of a few lines whose results differed from
// save-all's with no error under every-k:K and budget plans (and, for some, every-layer). Each
// runs under save-all and every policy of the acceptance list and must give save-all's bits.
#include <future>

#include "never_silent.h"

using namespace remat;
using namespace remat::never_silent;

namespace {

Tensor mse(const Tensor& a) { return mean(square(a)); }

// Item 1a: a stop-gradient normaliser between two layer calls.
class StopGradNormaliser : public nn::Module {
 public:
  StopGradNormaliser() {
    l0 = register_module("l0", std::make_shared<Block>());
    l1 = register_module("l1", std::make_shared<Block>());
  }
  Tensor forward_impl(const Tensor& x) override {
    Tensor h = l0->forward(x);
    Tensor s;
    {
      NoGradGuard no_grad;
      s = mean(square(h));
    }
    return l1->forward(div(h, s));
  }
  std::shared_ptr<Block> l0, l1;
};

// Item 1b: three frozen layers, then a no-grad feature scaling, then a trained head: the scaling
// cuts the gradient, so the three layers get none.
class FrozenTrunk : public nn::Module {
 public:
  FrozenTrunk() {
    for (int i = 0; i < 3; ++i) frozen.push_back(register_module("frozen" + std::to_string(i), std::make_shared<Block>()));
    head = register_module("head", std::make_shared<Block>());
  }
  Tensor forward_impl(const Tensor& x) override {
    Tensor h = x;
    for (auto& l : frozen) h = l->forward(h);
    {
      NoGradGuard no_grad;
      h = mul_scalar(h, 2.0);
    }
    return head->forward(h);
  }
  std::vector<std::shared_ptr<Block>> frozen;
  std::shared_ptr<Block> head;
};

// Item 1c: distillation: a teacher called under no-grad between the student and its head.
class Distillation : public nn::Module {
 public:
  Distillation() {
    student = register_module("student", std::make_shared<Block>());
    teacher = register_module("teacher", std::make_shared<Block>());
    head = register_module("head", std::make_shared<Block>());
  }
  TensorList forward_list_impl(const TensorList& in) override {
    Tensor h = student->forward(in[0]);
    Tensor target;
    {
      NoGradGuard no_grad;
      target = teacher->forward(h);
    }
    return {head->forward(h), target};
  }
  std::shared_ptr<Block> student, teacher, head;
};

}  // namespace

TEST(NeverSilentItem1, StopGradientNormaliserBetweenLayerCalls) {
  expect_matches_save_all([](Recorder& rec) {
    auto model = std::make_shared<StopGradNormaliser>();
    train(rec, model, {}, [&](Recorder&, const Tensor& x, int) { return mean(abs(model->forward(x))); });
  });
}

TEST(NeverSilentItem1, FrozenLayersBeforeANoGradScalingGetNoGradient) {
  expect_matches_save_all([](Recorder& rec) {
    auto model = std::make_shared<FrozenTrunk>();
    train(rec, model, {}, [&](Recorder&, const Tensor& x, int) { return mse(model->forward(x)); });
  });
}

TEST(NeverSilentItem1, ATeacherCalledUnderNoGradIsNotTrained) {
  expect_matches_save_all([](Recorder& rec) {
    auto model = std::make_shared<Distillation>();
    train(rec, model, {.optimizer = 2}, [&](Recorder& r, const Tensor& x, int) {
      const TensorList out = model->forward(TensorList{x});
      r.value("target", out[1]);
      return mse(sub(out[0], out[1]));
    });
  });
}

namespace {

// Item 2: a detach between layer calls; the model returns the detached value too.
class DetachBetween : public nn::Module {
 public:
  DetachBetween() {
    l0 = register_module("l0", std::make_shared<Block>());
    l1 = register_module("l1", std::make_shared<Block>());
  }
  TensorList forward_list_impl(const TensorList& in) override {
    const Tensor d = l0->forward(in[0]).detach();
    return {l1->forward(d), d};
  }
  std::shared_ptr<Block> l0, l1;
};

}  // namespace

TEST(NeverSilentItem2, ADetachBetweenLayerCallsStaysDetached) {
  expect_matches_save_all([](Recorder& rec) {
    auto model = std::make_shared<DetachBetween>();
    train(rec, model, {}, [&](Recorder& r, const Tensor& x, int) {
      const TensorList out = model->forward(TensorList{x});
      r.value("detached", out[1]);  // requires_grad false, no grad_fn
      // code that branches on it: a user's "is it trainable?" test
      return out[1].requires_grad() ? add(mse(out[0]), mse(out[1])) : mse(out[0]);
    });
  });
}

TEST(NeverSilentItem2, ABackwardOfOnlyTheDetachedValueRaisesAsUnderSaveAll) {
  expect_raises_like_save_all(
      [](Recorder& rec) {
        auto model = std::make_shared<DetachBetween>();
        train(rec, model, {}, [&](Recorder&, const Tensor& x, int) { return mse(model->forward(TensorList{x})[1]); });
      },
      "does not require grad");
}

namespace {

// Item 3: FiLM-style conditioning: a member reassigned between two calls of one layer, to tensors
// of equal values from two sources.
class Film : public nn::Module {
 public:
  Film() { fc = register_module("fc", std::make_shared<nn::Linear>(kWidth, kWidth)); }
  Tensor forward_impl(const Tensor& x) override { return tanh(mul(fc->forward(x), cond)); }
  std::shared_ptr<nn::Linear> fc;
  Tensor cond;
};

class FilmModel : public nn::Module {
 public:
  explicit FilmModel(bool scaled) : scaled_(scaled) {
    gamma_a = register_parameter("gamma_a", {kWidth}, DType::f32, nn::Init::uniform(0.5, 1.5));
    gamma_b = register_parameter("gamma_b", {kWidth}, DType::f32, nn::Init::keep());
    block = register_module("block", std::make_shared<Film>());
  }
  Tensor forward_impl(const Tensor& x) override {
    block->cond = scaled_ ? mul_scalar(gamma_a, 1.0) : gamma_a;
    const Tensor h = block->forward(x);
    block->cond = scaled_ ? mul_scalar(gamma_b, 1.0) : gamma_b;  // equal values, another source
    return block->forward(h);
  }
  Tensor gamma_a, gamma_b;
  std::shared_ptr<Film> block;

 private:
  bool scaled_;
};

Body film_body(bool scaled) {
  return [scaled](Recorder& rec) {
    auto model = std::make_shared<FilmModel>(scaled);
    train(rec, model, {}, [&](Recorder&, const Tensor& x, int step) {
      if (step == 0) {
        NoGradGuard no_grad;
        model->gamma_b.copy_(model->gamma_a);  // equal values before the first step
      }
      return mse(model->forward(x));
    });
  };
}

}  // namespace

// The layer reads a member that the model changes after the call: a recomputation that reads it
// again cannot give the first run's value (the issue: every-layer raises, as it should), so a
// refusal naming the determinism rule is accepted; a gradient routed to the other source is not.
TEST(NeverSilentItem3, AMemberReassignedBetweenTwoCallsOfOneLayer) {
  expect_matches_save_all(film_body(false), {Rule::deterministic});
}

TEST(NeverSilentItem3, AMemberReassignedBetweenTwoCallsOfOneLayerToValuesMadeByTheModel) {
  expect_matches_save_all(film_body(true), {Rule::deterministic});
}

namespace {

// Item 4: constants made by factories between layer calls (noise with an explicit RngState, the
// guide's advice; a full()).
class FactoryConstants : public nn::Module {
 public:
  FactoryConstants() {
    l0 = register_module("l0", std::make_shared<Block>());
    l1 = register_module("l1", std::make_shared<Block>());
  }
  Tensor forward_impl(const Tensor& x) override {
    Tensor h = l0->forward(x);
    h = add(h, mul_scalar(randn(h.shape(), DType::f32, RngState{7, 0}), 0.1));
    h = mul(h, full(h.shape(), 0.5));
    return l1->forward(h);
  }
  std::shared_ptr<Block> l0, l1;
};

}  // namespace

TEST(NeverSilentItem4, ConstantsMadeByFactoriesBetweenLayerCalls) {
  expect_matches_save_all([](Recorder& rec) {
    auto model = std::make_shared<FactoryConstants>();
    train(rec, model, {}, [&](Recorder&, const Tensor& x, int) { return mse(model->forward(x)); });
  });
}

TEST(NeverSilentItem4, ConstantsMadeByFactoriesWithTheRecomputationCheckOff) {
  struct CheckOff {
    CheckOff() { set_recomputation_check(false); }
    ~CheckOff() { set_recomputation_check(true); }
  } check_off;
  expect_matches_save_all([](Recorder& rec) {
    auto model = std::make_shared<FactoryConstants>();
    train(rec, model, {}, [&](Recorder&, const Tensor& x, int) { return mse(model->forward(x)); });
  });
}

namespace {

// Item 5: a parameter used by a layer and again by the model's code after that call.
class ParameterUsedAfterItsLayer : public nn::Module {
 public:
  ParameterUsedAfterItsLayer() {
    l0 = register_module("l0", std::make_shared<nn::Linear>(kWidth, kWidth));
    l1 = register_module("l1", std::make_shared<Block>());
  }
  Tensor forward_impl(const Tensor& x) override {
    const Tensor h = tanh(l0->forward(x));
    return l1->forward(tanh(linear(h, l0->weight)));
  }
  std::shared_ptr<nn::Linear> l0;
  std::shared_ptr<Block> l1;
};

}  // namespace

// The same parameter used by three layer calls and twice by the model's code, all in one group.
class ParameterUsedAcrossAGroup : public nn::Module {
 public:
  ParameterUsedAcrossAGroup() {
    for (int i = 0; i < 3; ++i)
      layers.push_back(register_module("l" + std::to_string(i), std::make_shared<nn::Linear>(kWidth, kWidth)));
    for (int i = 1; i < 3; ++i) layers[i]->tie_weight(layers[0]->weight);
  }
  Tensor forward_impl(const Tensor& x) override {
    Tensor h = x;
    for (auto& l : layers) {
      h = tanh(l->forward(h));
      h = add(h, mul(sigmoid(linear(h, layers[0]->weight)), layers[0]->bias));
    }
    return h;
  }
  std::vector<std::shared_ptr<nn::Linear>> layers;
};

TEST(NeverSilentItem5, AParameterUsedByLayersAndTheModelAcrossAGroup) {
  expect_matches_save_all([](Recorder& rec) {
    auto model = std::make_shared<ParameterUsedAcrossAGroup>();
    train(rec, model, {.batch = {7}}, [&](Recorder&, const Tensor& x, int) { return mse(model->forward(x)); });
  });
}

TEST(NeverSilentItem5, AParameterUsedByALayerAndByTheModelAfterIt) {
  expect_matches_save_all([](Recorder& rec) {
    auto model = std::make_shared<ParameterUsedAfterItsLayer>();
    train(rec, model, {}, [&](Recorder&, const Tensor& x, int) { return mse(model->forward(x)); });
  });
}

namespace {

// Item 6: a layer that returns its own parameter (learned queries, a position table).
class Queries : public nn::Module {
 public:
  Queries() { p = register_parameter("p", {kWidth}, DType::f32, nn::Init::uniform(-0.5, 0.5)); }
  Tensor forward_impl(const Tensor&) override { return p; }
  Tensor p;
};

class WithQueries : public nn::Module {
 public:
  WithQueries() {
    queries = register_module("queries", std::make_shared<Queries>());
    l1 = register_module("l1", std::make_shared<Block>());
  }
  Tensor forward_impl(const Tensor& x) override { return l1->forward(add(x, queries->forward(x))); }
  std::shared_ptr<Queries> queries;
  std::shared_ptr<Block> l1;
};

}  // namespace

TEST(NeverSilentItem6, ALayerReturningItsParameterWithAnInputWithoutGrad) {
  expect_matches_save_all([](Recorder& rec) {
    auto model = std::make_shared<WithQueries>();
    train(rec, model, {}, [&](Recorder&, const Tensor& x, int) { return mse(model->forward(x)); });
  });
}

TEST(NeverSilentItem6, ALayerReturningItsParameterWithAnInputThatRequiresGrad) {
  expect_matches_save_all([](Recorder& rec) {
    auto model = std::make_shared<WithQueries>();
    train(rec, model, {.input_requires_grad = true},
          [&](Recorder&, const Tensor& x, int) { return mse(model->forward(x)); });
  });
}

namespace {

// Item 7: remat::grad with respect to intermediates made inside a region: a value a layer
// stashes, and a value the model makes between two calls of one group.
class Stasher : public nn::Module {
 public:
  Stasher() { fc = register_module("fc", std::make_shared<nn::Linear>(kWidth, kWidth)); }
  Tensor forward_impl(const Tensor& x) override {
    stash = tanh(fc->forward(x));
    return sigmoid(mul_scalar(stash, 2.0));
  }
  std::shared_ptr<nn::Linear> fc;
  Tensor stash;
};

class Intermediates : public nn::Module {
 public:
  Intermediates() {
    l0 = register_module("l0", std::make_shared<Stasher>());
    l1 = register_module("l1", std::make_shared<Block>());
    l2 = register_module("l2", std::make_shared<Block>());
  }
  Tensor forward_impl(const Tensor& x) override {
    const Tensor h = l0->forward(x);
    between = tanh(l1->forward(h));
    return l2->forward(between);
  }
  std::shared_ptr<Stasher> l0;
  std::shared_ptr<Block> l1, l2;
  Tensor between;
};

}  // namespace

TEST(NeverSilentItem7, GradOfIntermediatesMadeInsideARegion) {
  expect_matches_save_all([](Recorder& rec) {
    auto model = std::make_shared<Intermediates>();
    train(
        rec, model, {}, [&](Recorder&, const Tensor& x, int) { return mse(model->forward(x)); },
        [&](Recorder& r, const Tensor& loss, int) {
          r.phase("grad");
          const TensorList g = remat::grad({loss}, {model->l0->stash, model->between}, {}, true);
          r.value("grad.stash", g[0], false);
          r.value("grad.between", g[1], false);
          r.phase("backward");
          loss.backward();
        });
  });
}

namespace {

// Item 8: a value computed on a second thread inside forward_impl.
class Threaded : public nn::Module {
 public:
  Threaded() { fc = register_module("fc", std::make_shared<nn::Linear>(kWidth, kWidth)); }
  Tensor forward_impl(const Tensor& x) override {
    const Tensor w = fc->weight;
    const Tensor side = std::async(std::launch::async, [x, w] { return tanh(linear(x, w)); }).get();
    return add(tanh(fc->forward(x)), side);
  }
  std::shared_ptr<nn::Linear> fc;
};

class ThreadedModel : public nn::Module {
 public:
  ThreadedModel() {
    l0 = register_module("l0", std::make_shared<Block>());
    l1 = register_module("l1", std::make_shared<Threaded>());
    l2 = register_module("l2", std::make_shared<Block>());
  }
  Tensor forward_impl(const Tensor& x) override { return l2->forward(l1->forward(l0->forward(x))); }
  std::shared_ptr<Block> l0, l2;
  std::shared_ptr<Threaded> l1;
};

}  // namespace

TEST(NeverSilentItem8, AValueMadeOnAnotherThreadInsideALayer) {
  expect_matches_save_all(
      [](Recorder& rec) {
        auto model = std::make_shared<ThreadedModel>();
        train(rec, model, {}, [&](Recorder&, const Tensor& x, int) { return mse(model->forward(x)); });
      },
      {Rule::thread});
}
