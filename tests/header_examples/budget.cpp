// The example of include/remat/budget.h: two profiling steps, then the plan of a budget.
#include <gtest/gtest.h>

#include "remat/nn.h"

using namespace remat;

// Any nn::Module: here four Linear + tanh layers called from the module's own loop.
class MyModel : public nn::Module {
 public:
  MyModel() {
    for (int i = 0; i < 4; ++i) layers.push_back(register_module("l" + std::to_string(i), std::make_shared<nn::Linear>(32, 32)));
  }
  Tensor forward_impl(const Tensor& x) override {
    Tensor h = x;
    for (auto& layer : layers) h = tanh(layer->forward(h));
    return h;
  }
  std::vector<std::shared_ptr<nn::Linear>> layers;
};

TEST(BudgetH, Example) {
  Tensor x = randn({16, 32}, DType::f32, RngState{1, 0});
  const int steps = 3;
REMAT_EXAMPLE(include/remat/budget.h: auto model = std::make_shared<MyModel>();)
  ASSERT_TRUE(model->planner()->report().has_value());  // step 2 ran the plan
  const auto range = model->planner()->feasible_range();
  ASSERT_TRUE(range.has_value());
  EXPECT_GT(range->smallest_budget_bytes, 0u);
  EXPECT_LE(range->smallest_budget_bytes, range->save_all_peak_bytes);
}
