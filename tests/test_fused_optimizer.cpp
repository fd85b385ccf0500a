// GradReadyHook (remat/grad_ready.h) and the optimizer inside the backward
// (nn::FusedOptimizerStep): each leaf is reported once, at its final point, with its whole
// gradient, under every policy (contributions that arrive during a region's recomputation
// included); fused SGD/AdamW steps leave the parameters and the optimizer state bitwise equal to
// the unfused loop; at most one gradient is alive at a time (allocator counters).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "module_models.h"
#include "remat/nn.h"
#include "remat/remat.h"

using namespace remat;
using namespace remat::testing;

namespace {

// A model that uses one layer twice (layers 0 and 2 are the same Linear): under every-layer both
// uses are regions, so that weight's gradient is summed from two recomputations.
class SharedLayerModel : public nn::Module {
 public:
  SharedLayerModel(int64_t width, uint64_t seed) {
    first = register_module("first", std::make_shared<TanhBlock>(width, DType::f64));
    middle = register_module("middle", std::make_shared<WideBlock>(width, DType::f64));
    reset_parameters(seed);
  }
  Tensor forward_impl(const Tensor& x) override { return first->forward(middle->forward(first->forward(x))); }
  std::string type_name() const override { return "SharedLayerModel"; }
  std::shared_ptr<nn::Module> first, middle;
};

std::vector<std::string> policies() { return {"save-all", "every-layer", "every-k:2", "selective:matmul", "dynamic:2KiB"}; }

std::shared_ptr<nn::Module> make_model(int which) {
  if (which == 0) return std::make_shared<LoopModel>(5, 8, DType::f64, 11, /*residual=*/true);
  return std::make_shared<SharedLayerModel>(6, 12);
}

Tensor input_for(nn::Module& model) {
  manual_seed(3);
  const int64_t width = model.parameters().front().shape().back();
  return randn({4, width}, DType::f64);
}

void run_backward(nn::Module& model, const Tensor& x, const Policy& policy) {
  manual_seed(9);
  backward([&] { return mean(square(model.forward(x))); }, GradOptions{policy});
}

}  // namespace

TEST(GradReadyHook, ReportsEveryParameterOnceWithItsFinalGradient) {
  for (int which : {0, 1}) {
    for (const std::string& p : policies()) {
      SCOPED_TRACE(::testing::Message() << "model " << which << ", policy " << p);
      const Policy policy = Policy::parse(p);
      auto reference = make_model(which);
      const Tensor x = input_for(*reference);
      run_backward(*reference, x, Policy::save_all());

      auto model = make_model(which);
      std::map<const TensorImpl*, int> calls;
      std::map<const TensorImpl*, Tensor> seen;
      {
        GradReadyHook hook([&](const Tensor& leaf) {
          ++calls[leaf.impl_ptr().get()];
          seen[leaf.impl_ptr().get()] = leaf.grad().contiguous().clone();
        });
        run_backward(*model, x, policy);
      }
      const TensorList ps = model->parameters(), rs = reference->parameters();
      ASSERT_EQ(calls.size(), ps.size());
      for (size_t i = 0; i < ps.size(); ++i) {
        EXPECT_EQ(calls[ps[i].impl_ptr().get()], 1) << ps[i].name();
        EXPECT_TRUE(bitwise_equal(seen[ps[i].impl_ptr().get()], rs[i].grad())) << ps[i].name();
        EXPECT_TRUE(bitwise_equal(ps[i].grad(), rs[i].grad())) << ps[i].name();
      }
    }
  }
}

TEST(GradReadyHook, SeesTheAccumulatedTotalAndIsNotCalledByGrad) {
  auto model = make_model(0);
  const Tensor x = input_for(*model);
  run_backward(*model, x, Policy::save_all());
  std::vector<Tensor> once;
  for (const Tensor& p : model->parameters()) once.push_back(p.grad().clone());
  int calls = 0;
  GradReadyHook hook([&](const Tensor& leaf) {
    ++calls;
    const TensorList ps = model->parameters();
    for (size_t i = 0; i < ps.size(); ++i)
      if (ps[i].same(leaf)) EXPECT_TRUE(bitwise_equal(leaf.grad(), add(once[i], once[i])));
  });
  run_backward(*model, x, Policy::every_layer());  // the second pass adds the same gradient
  EXPECT_EQ(calls, static_cast<int>(once.size()));
  calls = 0;
  remat::grad([&](const TensorList&) { return mean(model->forward(x)); }, model->parameters(), GradOptions{Policy::save_all()});
  EXPECT_EQ(calls, 0) << "grad() returns gradients and reports none";
}

TEST(GradReadyHook, AnExceptionEndsTheBackwardAndKeepsWhatWasReported) {
  auto model = make_model(0);
  const Tensor x = input_for(*model);
  int calls = 0;
  GradReadyHook hook([&](const Tensor&) {
    if (++calls == 3) throw Error("stop here");
  });
  EXPECT_THROW(run_backward(*model, x, Policy::every_layer()), Error);
  size_t with_grad = 0;
  for (const Tensor& p : model->parameters()) with_grad += p.grad().defined() ? 1 : 0;
  EXPECT_EQ(with_grad, 3u) << "the reported leaves keep their gradients, the others are unchanged";
}

TEST(GradReadyHook, NestsAndRestores) {
  int outer = 0, inner = 0;
  GradReadyHook a([&](const Tensor&) { ++outer; });
  {
    GradReadyHook b([&](const Tensor&) { ++inner; });
    EXPECT_EQ(GradReadyHook::current(), &b);
  }
  EXPECT_EQ(GradReadyHook::current(), &a);
  auto model = make_model(0);
  run_backward(*model, input_for(*model), Policy::save_all());
  EXPECT_EQ(inner, 0);
  EXPECT_EQ(outer, static_cast<int>(model->parameters().size()));
}

TEST(FusedOptimizer, StepsBitwiseEqualToTheUnfusedLoop) {
  for (int which : {0, 1}) {
    for (const std::string& p : policies()) {
      for (const char* kind : {"adamw", "sgd"}) {
        SCOPED_TRACE(::testing::Message() << "model " << which << ", policy " << p << ", " << kind);
        const Policy policy = Policy::parse(p);
        auto plain = make_model(which), fused = make_model(which);
        const Tensor x = input_for(*plain);
        auto make_opt = [&](nn::Module& m) -> std::unique_ptr<nn::Optimizer> {
          if (std::string(kind) == "adamw")
            return std::make_unique<nn::AdamW>(m.parameters(), nn::AdamWOptions{.lr = 0.05, .weight_decay = 0.1});
          return std::make_unique<nn::SGD>(m.parameters(),
                                           nn::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true});
        };
        auto a = make_opt(*plain), b = make_opt(*fused);
        for (int step = 0; step < 3; ++step) {
          a->zero_grad();
          run_backward(*plain, x, policy);
          a->step();
          b->zero_grad();
          {
            nn::FusedOptimizerStep inside(*b);
            run_backward(*fused, x, policy);
            EXPECT_EQ(inside.updated(), fused->parameters().size());
          }
          const TensorList pa = plain->parameters(), pb = fused->parameters();
          for (size_t i = 0; i < pa.size(); ++i) {
            EXPECT_TRUE(bitwise_equal(pa[i], pb[i])) << "step " << step << ", " << pa[i].name();
            EXPECT_FALSE(pb[i].grad().defined()) << "the fused step drops the gradient";
          }
        }
        if (auto* adam_a = dynamic_cast<nn::AdamW*>(a.get())) {
          auto* adam_b = dynamic_cast<nn::AdamW*>(b.get());
          for (size_t i = 0; i < plain->parameters().size(); ++i) {
            EXPECT_TRUE(bitwise_equal(adam_a->exp_avg(i), adam_b->exp_avg(i)));
            EXPECT_TRUE(bitwise_equal(adam_a->exp_avg_sq(i), adam_b->exp_avg_sq(i)));
            EXPECT_EQ(adam_a->steps(i), adam_b->steps(i));
          }
        }
      }
    }
  }
}

TEST(FusedOptimizer, AtMostOneGradientIsAlive) {
  for (const std::string& p : {"save-all", "every-layer"}) {
    SCOPED_TRACE(p);
    auto model = std::make_shared<LoopModel>(6, 32, DType::f32, 5, false, /*wide=*/true);
    const Tensor x = [&] {
      manual_seed(3);
      return randn({16, 32});
    }();
    size_t largest = 0, all = 0;
    for (const Tensor& q : model->parameters()) {
      largest = std::max(largest, q.nbytes());
      all += q.nbytes();
    }
    nn::AdamW opt(model->parameters(), {.lr = 1e-3});
    const size_t base = memory::live_bytes(memory::Tag::gradient);
    memory::reset_peaks();
    run_backward(*model, x, Policy::parse(p));
    EXPECT_EQ(memory::peak_bytes(memory::Tag::gradient) - base, all) << "unfused: every gradient at once";
    opt.step();
    opt.zero_grad();
    memory::reset_peaks();
    {
      nn::FusedOptimizerStep inside(opt);
      run_backward(*model, x, Policy::parse(p));
    }
    const size_t peak = memory::peak_bytes(memory::Tag::gradient) - base;
    EXPECT_GT(peak, 0u);
    EXPECT_LE(peak, largest) << "fused: one gradient at a time (the largest is " << largest << " of " << all << " B)";
    EXPECT_EQ(memory::live_bytes(memory::Tag::gradient), base);
  }
}

TEST(FusedOptimizer, LeavesOtherLeavesAndRunsBeforeUpdate) {
  auto model = make_model(0);
  Tensor x = input_for(*model).detach();
  x.requires_grad_();
  nn::SGD opt(model->parameters(), {.lr = 0.1});
  std::vector<std::string> order;
  {
    nn::FusedOptimizerStep inside(opt, {.before_update = [&](const Tensor& p) {
                                          order.push_back(p.name());
                                          EXPECT_TRUE(p.grad().defined());
                                        }});
    run_backward(*model, x, Policy::every_layer());
  }
  EXPECT_EQ(order.size(), model->parameters().size());
  EXPECT_TRUE(x.grad().defined()) << "a leaf that is not a parameter keeps its gradient";
  // a before_update that throws stops the step before that parameter changes
  const Tensor before = model->parameters().front().clone();
  EXPECT_THROW(
      {
        nn::FusedOptimizerStep inside(opt, {.before_update = [&](const Tensor& p) {
                                              if (p.same(model->parameters().front())) throw Error("no");
                                            }});
        run_backward(*model, x, Policy::save_all());
      },
      Error);
  EXPECT_TRUE(bitwise_equal(model->parameters().front(), before));
}
