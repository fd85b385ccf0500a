// The example of include/remat/call.h: remat::call for code that is not a module.
#include <gtest/gtest.h>

#include "remat/remat.h"

using namespace remat;

TEST(CallH, Example) {
  Tensor w = randn({8, 8}, DType::f64, RngState{1, 0}).requires_grad_();
  auto block = [&](const Tensor& h) { return tanh(matmul(h, w)); };
  Tensor x = randn({2, 8}, DType::f64, RngState{2, 0});
REMAT_EXAMPLE(include/remat/call.h: remat::CallSite site{.label = "encoder.3"};)
  // the outermost call is the root: it runs the function plain
  ASSERT_EQ(y.size(), 1u);
  EXPECT_EQ(y[0].to_vector(), block(x).to_vector());
}
