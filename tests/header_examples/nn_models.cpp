// The examples of include/remat/nn/gpt.h, resnet.h and safetensors.h.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "remat/nn.h"
#include "temp_dir.h"

using namespace remat;

TEST(NnGptH, Example) {
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < 2 * 65; ++i) tokens.push_back((i * 37) % 256);
  Tensor ids = from_indices(std::vector<int64_t>(tokens.begin(), tokens.begin() + 128), {2, 64});
  Tensor targets = from_indices(std::vector<int64_t>(tokens.begin() + 1, tokens.begin() + 129), {2, 64});
REMAT_EXAMPLE(include/remat/nn/gpt.h: remat::nn::GPTConfig config{.vocab = 256)
  EXPECT_EQ(logits.shape(), (Shape{2, 64, 256}));
  EXPECT_NEAR(loss.item(), std::log(256.0), 0.5);  // about uniform at initialisation
}

TEST(NnResnetH, Example) {
  reset_counters();
REMAT_EXAMPLE(include/remat/nn/resnet.h: remat::nn::ResNetConfig config{.blocks_per_stage = 3, .width = 16};)
  // ResNet-20: the stem, 9 blocks and the head are the layer calls, each a region
  EXPECT_EQ(counters().regions_created, 11u);
  EXPECT_TRUE(std::isfinite(loss.item()));
}

TEST(NnSafetensorsH, Example) {
  const std::string dir = remat::testing::fresh_dir("header-example-safetensors");
  std::filesystem::current_path(dir);  // the example writes w.safetensors here
  Tensor w = randn({4, 3}, DType::f32, RngState{1, 0}), b = randn({4}, DType::f32, RngState{2, 0});
REMAT_EXAMPLE(include/remat/nn/safetensors.h: remat::nn::save_safetensors("w.safetensors")
  EXPECT_EQ(w2.to_vector(), w.to_vector());
  EXPECT_EQ(f.metadata.at("step"), "100");
  std::filesystem::current_path(std::filesystem::temp_directory_path());
  std::filesystem::remove_all(dir);
}
