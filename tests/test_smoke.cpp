#include <gtest/gtest.h>

#include "remat/ops.h"

using namespace remat;

TEST(Smoke, MatmulTanhSumGradient) {
  Tensor x = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, DType::f64);
  Tensor w = from_vector(std::vector<double>{0.1, -0.2, 0.3, 0.4, -0.5, 0.6}, {3, 2}, DType::f64).requires_grad_();
  Tensor y = matmul(x, w).tanh().sum();
  y.backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().shape(), (Shape{3, 2}));
}
