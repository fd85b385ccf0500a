// The example of include/remat/grad_ready.h: a hook called once per final parameter gradient.
#include <gtest/gtest.h>

#include "remat/nn.h"

using namespace remat;

TEST(GradReadyH, Example) {
  auto model = std::make_shared<nn::Sequential>();
  for (int i = 0; i < 3; ++i) model->add(std::make_shared<nn::Linear>(8, 8));
  Tensor loss = mean(model->forward(randn({4, 8}, DType::f32, RngState{1, 0})));
REMAT_EXAMPLE(include/remat/grad_ready.h: size_t final_grads = 0;)
  EXPECT_EQ(final_grads, model->parameters().size());  // 3 weights and 3 biases
}
