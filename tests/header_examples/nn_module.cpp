// The example of include/remat/nn/module.h: a model class of one's own, every layer call a region.
#include <gtest/gtest.h>

#include "remat/nn.h"

using namespace remat;

namespace {

// A layer of the example's model: Linear then tanh.
class Block : public nn::Module {
 public:
  explicit Block(int64_t width) { fc = register_module("fc", std::make_shared<nn::Linear>(width, width)); }
  Tensor forward_impl(const Tensor& x) override { return tanh(fc->forward(x)); }
  std::shared_ptr<nn::Linear> fc;
};

}  // namespace

TEST(NnModuleH, Example) {
  Tensor x = randn({4, 64}, DType::f32, RngState{1, 0});
  reset_counters();
REMAT_EXAMPLE(include/remat/nn/module.h: class Model : public remat::nn::Module {)
  EXPECT_EQ(counters().regions_created, 17u);  // 16 layers and the head
  EXPECT_EQ(counters().regions_recomputed, 16u);  // the head, a Linear, has nothing to make again
}
