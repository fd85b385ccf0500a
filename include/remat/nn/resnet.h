// remat/nn/resnet.h - a CIFAR-sized residual network (pre-activation ResNet, He et al. 2016,
// "Identity Mappings in Deep Residual Networks"), and a synthetic image set to train it on.
//
//   remat::nn::ResNetConfig config{.blocks_per_stage = 3, .width = 16};     // ResNet-20 shape
//   auto model = std::make_shared<remat::nn::ResNet>(config);
//   auto data = remat::nn::make_synthetic_images({.count = 256, .seed = 1});
//   Tensor loss = model->loss(data.images.slice(0, 0, 32), data.labels.slice(0, 0, 32));
//   loss.backward();                  // every block is a checkpoint region under every-layer
//
// Structure: `layers`, one Sequential over
//   0            stem: Conv2d(in_channels -> width, 3x3, padding 1, no bias)
//   1 .. B       the residual blocks, `blocks_per_stage` per stage; stage s has width * 2^s
//                channels; the first block of every stage after the first halves the image
//                (stride 2) and is a DownsampleBlock, the others are Residual(PreActBody)
//   B + 1        head: BatchNorm2d, ReLU, global average pooling, Linear(-> classes)
// with B = stages * blocks_per_stage and depth (weighted layers) 2 B + 2. Each block is one
// layer call (remat/call.h; the Residuals are made layers rather than transparent containers,
// so a block's add is inside it): every-layer makes one region per block, every-k:K one per K
// blocks, budget:BYTES plans over the B + 2 calls. stages = 3,
// blocks_per_stage = n, width 16 is the CIFAR ResNet-(6n + 2) of the paper (n = 3: ResNet-20,
// n = 200: ResNet-1202); stages = 4, blocks_per_stage = 2, width 64 is ResNet-18's layout. Under
// budget:BYTES a deep net's saved memory grows as O(sqrt(B)) (Chen et al. 2016; examples/resnet
// --deep).
//
// Parameter names match the same structure written with torch.nn (nn.Sequential numbering,
// "layers.3.fn.conv1.weight"), as bench/peers/torch_runner.py does.
#pragma once

#include <cstdint>
#include <memory>

#include "remat/nn/batch_norm.h"
#include "remat/nn/containers.h"
#include "remat/nn/conv.h"
#include "remat/nn/layers.h"

namespace remat::nn {

struct ResNetConfig {
  int64_t stages = 3;
  int64_t blocks_per_stage = 3;  // n: depth 2 * stages * n + 2
  int64_t width = 16;            // channels of the first stage; doubled at every later stage
  int64_t in_channels = 3;
  int64_t classes = 10;
  DType dtype = DType::f32;
  uint64_t seed = 0;             // the initialisation seed
  int64_t depth() const { return 2 * stages * blocks_per_stage + 2; }
};

// x -> conv2(relu(bn2(conv1(relu(bn1(x)))))), channels and size unchanged (3x3 convolutions).
class PreActBody : public Module {
 public:
  PreActBody(int64_t channels, DType dtype);
  std::string type_name() const override { return "PreActBody"; }
  std::shared_ptr<BatchNorm2d> bn1, bn2;
  std::shared_ptr<Conv2d> conv1, conv2;

 protected:
  Tensor forward_impl(const Tensor& x) override;
};

// a = relu(bn1(x)); conv2(relu(bn2(conv1(a)))) + shortcut(a), where conv1 and the 1x1 shortcut
// have stride `stride` and change the channels from `in` to `out`.
class DownsampleBlock : public Module {
 public:
  DownsampleBlock(int64_t in, int64_t out, int64_t stride, DType dtype);
  std::string type_name() const override { return "DownsampleBlock"; }
  std::shared_ptr<BatchNorm2d> bn1, bn2;
  std::shared_ptr<Conv2d> conv1, conv2, shortcut;

 protected:
  Tensor forward_impl(const Tensor& x) override;
};

// relu(bn(x)) averaged over the image, then a Linear layer: [N, C, H, W] -> [N, classes].
class ResNetHead : public Module {
 public:
  ResNetHead(int64_t channels, int64_t classes, DType dtype);
  std::string type_name() const override { return "ResNetHead"; }
  std::shared_ptr<BatchNorm2d> bn;
  std::shared_ptr<Linear> fc;

 protected:
  Tensor forward_impl(const Tensor& x) override;
};

class ResNet : public Module {
 public:
  explicit ResNet(const ResNetConfig& config);
  // images [N, in_channels, H, W] -> logits [N, classes] (each later stage halves H and W, rounding up)
  // mean cross entropy of forward(images) against labels [N] (i64)
  Tensor loss(const Tensor& images, const Tensor& labels);
  std::string type_name() const override;
  const ResNetConfig& config() const { return config_; }
  // Every BatchNorm2d of the model, in order (their running statistics are buffers: outside
  // named_parameters(), moved by to()).
  std::vector<std::shared_ptr<BatchNorm>> batch_norms() const { return batch_norms_; }

  std::shared_ptr<Sequential> layers;

 protected:
  Tensor forward_impl(const Tensor& images) override;

 private:
  ResNetConfig config_;
  std::vector<std::shared_ptr<BatchNorm>> batch_norms_;
};

// A learnable image set generated from a seed (no download): each class is a fixed random
// pattern (per channel, a sum of three sinusoidal gratings of random frequency, orientation and
// phase); an image is its class's pattern, circularly shifted by up to `max_shift` pixels in
// each direction, plus Gaussian noise of standard deviation `noise`. Labels cycle through the
// classes, so every batch of `classes` consecutive images holds each class once.
struct SyntheticImageOptions {
  int64_t count = 512;
  int64_t classes = 10;
  int64_t channels = 3;
  int64_t size = 32;  // height = width
  int64_t max_shift = 4;
  double noise = 0.5;
  uint64_t seed = 1;
  DType dtype = DType::f32;
};
struct SyntheticImages {
  Tensor images;  // [count, channels, size, size]
  Tensor labels;  // [count] i64
};
SyntheticImages make_synthetic_images(const SyntheticImageOptions& options);

}  // namespace remat::nn
