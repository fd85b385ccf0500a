// The example of include/remat/budget.h: two profiling steps, then the plan of a budget.
#include <gtest/gtest.h>

#include "remat/devices.h"
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

TEST(BudgetH, ChargeOffload) {
  const std::string dir = ::testing::TempDir();
REMAT_EXAMPLE(include/remat/budget.h: schedule::ChainCosts costs = schedule::ChainCosts::uniform(8, 1e-3, 2e-3, 1 << 20, 4 << 20);)
  EXPECT_TRUE(costs.can_offload());
  EXPECT_EQ(charge.copies.to_host_bytes_per_second, 0.0);
  EXPECT_EQ(charge.in_full, offload_copies_share_the_cores(parse_device("cpu")));
  EXPECT_EQ(costs.reads_ahead, !charge.in_full);
  EXPECT_DOUBLE_EQ(costs.offload_seconds_per_byte, charge.price.seconds_per_byte());
  EXPECT_EQ(costs.offload_write_seconds_per_byte, charge.in_full ? 0.0 : charge.price.write_seconds_per_byte());
  // a directory that cannot be written: an error naming it, the costs as they were
  schedule::ChainCosts before = schedule::ChainCosts::uniform(8, 1e-3, 2e-3, 1 << 20, 4 << 20);
  schedule::ChainCosts after = before;
  EXPECT_THROW(charge_offload("/nonexistent/remat-offload", parse_device("cpu"), after), Error);
  EXPECT_EQ(after.offload_seconds_per_byte, before.offload_seconds_per_byte);
  EXPECT_EQ(after.reads_ahead, before.reads_ahead);
}
