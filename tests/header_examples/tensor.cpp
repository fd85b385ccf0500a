// The example of include/remat/tensor.h, and what it says: x is seeded, w.grad() holds dL/dw.
#include <gtest/gtest.h>

#include "remat/remat.h"

TEST(TensorH, Example) {
REMAT_EXAMPLE(include/remat/tensor.h: using namespace remat;)
  // x: standard normal values from seed 1, the same on every run
  EXPECT_EQ(x.to_vector(), randn({4, 3}, DType::f32, RngState{1, 0}).to_vector());
  // w = 0, so y = tanh(0) and dL/dw[i][j] = sum_b x[b][i] * (1 - tanh(0)^2) = sum_b x[b][i]
  ASSERT_TRUE(w.grad().defined());
  const std::vector<double> xs = x.to_vector(), g = w.grad().to_vector();
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) {
      double column = 0;
      for (int b = 0; b < 4; ++b) column += xs[b * 3 + i];
      EXPECT_NEAR(g[i * 2 + j], column, 1e-5);
    }
}
