// The examples of include/remat/autodiff.h: backward() and grad(), and a custom op.
#include <gtest/gtest.h>

#include "remat/remat.h"

using namespace remat;

TEST(AutodiffH, BackwardAndGrad) {
  Tensor x = randn({2, 3}, DType::f32, RngState{1, 0});
REMAT_EXAMPLE(include/remat/autodiff.h: Tensor w = randn({3, 3}).requires_grad_();)
  // grad() returned the gradient that backward() accumulated, and did not add to w.grad()
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].to_vector(), w.grad().to_vector());
}

TEST(AutodiffH, CustomOp) {
  Tensor x = randn({5}, DType::f64, RngState{2, 0}).requires_grad_();
REMAT_EXAMPLE(include/remat/autodiff.h: remat::CustomOp square{)
  EXPECT_EQ(y.to_vector(), mul(x, x).to_vector());
  sum(y).backward();
  EXPECT_EQ(x.grad().to_vector(), mul_scalar(x, 2.0).to_vector());
}
