// Issue 54, "Budgets silently exceeded": programs whose measured peak of saved bytes passed the
// budget with no warning and bytes_over_plan 0. Under budget:small, budget:medium, budget:large,
// budget:auto and budget+offload the matrix compares every step's allocator peak with the budget
// (a pass must come with a warning naming the budget, bytes_over_plan or counters().budget); every
// policy must also give save-all's bits.
#include "never_silent.h"

using namespace remat;
using namespace remat::never_silent;

namespace {

Tensor mse(const Tensor& a) { return mean(square(a)); }

// Four steps of layers chosen by the data: narrow ones while the budget profiles (the first two
// steps), wide ones after (same number of calls, same shapes).
class Router : public nn::Module {
 public:
  Router() {
    for (int i = 0; i < 4; ++i) {
      narrow.push_back(register_module("narrow" + std::to_string(i), std::make_shared<Block>()));
      wide.push_back(register_module("wide" + std::to_string(i), std::make_shared<Wide>()));
    }
  }
  Tensor forward_impl(const Tensor& x) override {
    const bool go_wide = mean(x).item() > 0;
    Tensor h = x;
    for (size_t i = 0; i < narrow.size(); ++i) h = go_wide ? wide[i]->forward(h) : narrow[i]->forward(h);
    return h;
  }
  std::vector<std::shared_ptr<nn::Module>> narrow, wide;
};

// Wide layers in a residual loop; each may stash an intermediate for an auxiliary loss, and one
// more layer may return a view of its input, used residually.
class StashingWide : public Wide {
 public:
  Tensor forward_impl(const Tensor& x) override {
    const Tensor inner = tanh(up->forward(x));
    if (keep) stash = inner;
    return down->forward(inner);
  }
  bool keep = false;
  Tensor stash;
};

class ViewOfInput : public nn::Module {
 public:
  Tensor forward_impl(const Tensor& x) override { return x.slice(-1, 0, x.size(-1)); }
};

class Residual : public nn::Module {
 public:
  Residual(bool keep, bool view) {
    for (int i = 0; i < 4; ++i) {
      auto layer = std::make_shared<StashingWide>();
      layer->keep = keep;
      layers.push_back(register_module("layer" + std::to_string(i), layer));
    }
    if (view) viewer = register_module("view", std::make_shared<ViewOfInput>());
  }
  Tensor forward_impl(const Tensor& x) override {
    Tensor h = x;
    for (auto& l : layers) {
      h = add(h, l->forward(h));
      if (viewer) h = add(h, viewer->forward(h));
    }
    return h;
  }
  Tensor aux() const {
    Tensor total;
    for (auto& l : layers)
      if (l->stash.defined()) total = total.defined() ? add(total, mean(l->stash)) : mean(l->stash);
    return total;
  }
  std::vector<std::shared_ptr<StashingWide>> layers;
  std::shared_ptr<ViewOfInput> viewer;
};

Body residual_body(bool keep, bool view, Steps steps, const Backward& backward = {}) {
  return [=](Recorder& rec) {
    auto model = std::make_shared<Residual>(keep, view);
    train(
        rec, model, steps,
        [&](Recorder& r, const Tensor& x, int) {
          Tensor loss = mse(model->forward(x));
          if (keep) {
            const Tensor aux = model->aux();
            r.value("aux", aux);
            loss = add(loss, mul_scalar(aux, 0.01));
          }
          return loss;
        },
        backward);
  };
}

}  // namespace

TEST(NeverSilentBudget, ARouterThatPicksOtherLayersAfterProfiling) {
  expect_matches_save_all([](Recorder& rec) {
    auto model = std::make_shared<Router>();
    train(rec, model, {.steps = 5}, [&](Recorder&, const Tensor& x, int step) {
      const Tensor signed_x = step < 2 ? neg(abs(x)) : abs(x);
      return mse(model->forward(signed_x));
    });
  });
}

TEST(NeverSilentBudget, AlternatingInputShapes) {
  expect_matches_save_all(residual_body(false, false, {.steps = 6, .batch = {2, 5}}));
}

TEST(NeverSilentBudget, LayersThatStashAValueForAnAuxiliaryLoss) {
  expect_matches_save_all(residual_body(true, false, {}));
}

TEST(NeverSilentBudget, ASecondBackwardThroughARetainedGraph) {
  expect_matches_save_all(residual_body(false, false, {}, [](Recorder& r, const Tensor& loss, int) {
    loss.backward(Tensor(), true);
    r.phase("backward2");
    loss.backward();
  }));
}

TEST(NeverSilentBudget, GradOfAnIntermediateThenBackward) {
  expect_matches_save_all([](Recorder& rec) {
    auto model = std::make_shared<Residual>(true, false);
    train(
        rec, model, {},
        [&](Recorder&, const Tensor& x, int) {
          const Tensor loss = mse(model->forward(x));
          return add(loss, model->aux());
        },
        [&](Recorder& r, const Tensor& loss, int) {
          r.phase("grad");
          const Tensor g = remat::grad({loss}, {model->layers[1]->stash}, {}, true)[0];
          r.value("grad.stash", g, false);
          r.phase("backward");
          loss.backward();
        });
  });
}

TEST(NeverSilentBudget, ALayerReturningAViewOfItsInputUsedResidually) {
  expect_matches_save_all(residual_body(false, true, {}));
}
