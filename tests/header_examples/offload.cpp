// The examples of include/remat/offload.h: offload: as a policy and as a scope, and its price.
#include <gtest/gtest.h>

#include "remat/devices.h"
#include "remat/nn.h"
#include "remat/offload.h"

using namespace remat;

namespace {
struct Model : nn::Module {
  Model() : layer(register_module("layer", std::make_shared<nn::Linear>(256, 1024))) {}
  Tensor forward_impl(const Tensor& x) override { return tanh(layer->forward(x)); }
  Tensor loss(const Tensor& x, const Tensor& y) { return nn::mse_loss(forward(x), y); }
  std::shared_ptr<nn::Linear> layer;
};
}  // namespace

TEST(OffloadH, PolicyAndScope) {
  const std::string dir = ::testing::TempDir();
  Model model;
  Tensor x = randn({512, 256}, DType::f32, RngState{1, 0}), y = randn({512, 1024}, DType::f32, RngState{2, 0});
  const Tensor reference = remat::grad(TensorList{model.loss(x, y)}, {model.layer->weight})[0];
  reset_counters();
  model.zero_grad();
REMAT_EXAMPLE(include/remat/offload.h: // offload:DIR keeps everything)
  // the layer's 2 MiB output went to the file: the next large value waited for its write (ram=)
  EXPECT_GT(counters().dynamic.bytes_offloaded, 0u);
  EXPECT_EQ(model.layer->weight.grad().to_vector(), reference.to_vector());
  auto f = [&](const Tensor& h) { return sum(model.forward(h)); };
  reset_counters();
REMAT_EXAMPLE(include/remat/offload.h: // or as a scope of its own)
  EXPECT_GT(counters().dynamic.bytes_offloaded, 0u);
}

TEST(OffloadH, Price) {
  const std::string dir = ::testing::TempDir();
REMAT_EXAMPLE(include/remat/offload.h: const size_t available = device_memory(parse_device("cpu")).free_bytes;)
  EXPECT_EQ(price.page_cache, (size_t{64} << 20) <= available / 10);
  const OffloadBandwidth bandwidth = offload_bandwidth(dir);
  EXPECT_EQ(price.seconds_per_byte(), price.page_cache ? 1.0 / bandwidth.cached_write_bytes_per_second +
                                                             1.0 / bandwidth.cached_read_bytes_per_second
                                                       : bandwidth.seconds_per_byte());
}
