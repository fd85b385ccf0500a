// The examples of include/remat/dynamic.h: dynamic: as a policy and as a scope, and the feasible
// range of a step.
#include <gtest/gtest.h>

#include "remat/nn.h"

using namespace remat;

TEST(DynamicH, PolicyAndScope) {
  Tensor u0 = randn({64}, DType::f64, RngState{1, 0}).requires_grad_();
  auto solver = [](const Tensor& u) {  // a program of plain ops: 20 steps of a nonlinear map
    Tensor h = u;
    for (int i = 0; i < 20; ++i) h = add(h, mul_scalar(tanh(h), 0.1));
    return sum(mul(h, h));
  };
REMAT_EXAMPLE(include/remat/dynamic.h: // any program of remat ops)
  ASSERT_TRUE(u0.grad().defined());
  EXPECT_EQ(d.evictions, 0u);  // 64 MiB holds this small program's values
  Tensor first = u0.grad().clone();
  u0.zero_grad();
  auto f = solver;
  Tensor x = u0;
REMAT_EXAMPLE(include/remat/dynamic.h: // or as a scope of its own)
  EXPECT_EQ(u0.grad().to_vector(), first.to_vector());  // the same gradient either way
}

struct Regression : nn::Module {
  Regression() {
    for (int i = 0; i < 6; ++i) layers.push_back(register_module("l" + std::to_string(i), std::make_shared<nn::Linear>(32, 32)));
  }
  Tensor forward_impl(const Tensor& x) override {
    Tensor h = x;
    for (auto& layer : layers) h = tanh(layer->forward(h));
    return h;
  }
  Tensor loss(const Tensor& x, const Tensor& y) { return nn::mse_loss(forward(x), y); }
  std::vector<std::shared_ptr<nn::Linear>> layers;
};

TEST(DynamicH, FeasibleRange) {
  Regression model;
  Tensor x = randn({16, 32}, DType::f32, RngState{2, 0}), y = randn({16, 32}, DType::f32, RngState{3, 0});
REMAT_EXAMPLE(include/remat/dynamic.h: auto step = [&] { model.zero_grad();)
  // what the comment says: the smallest budget runs the step, one byte less does not
  ASSERT_GT(r.smallest_budget_bytes, 1u);
  {
    ScopedPolicy policy(Policy::dynamic(r.smallest_budget_bytes));
    EXPECT_NO_THROW(step());
  }
  {
    ScopedPolicy policy(Policy::dynamic(r.smallest_budget_bytes - 1));
    EXPECT_THROW(step(), Error);
  }
}
