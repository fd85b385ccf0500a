// The CIFAR-sized pre-activation ResNet and the synthetic image set (see remat/nn/resnet.h).
#include "remat/nn/resnet.h"

#include <cmath>
#include <random>

#include "remat/ops.h"

namespace remat::nn {

// ---- blocks

PreActBody::PreActBody(int64_t channels, DType dtype) {
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(channels, 1e-5, 0.1, true, true, dtype));
  conv1 = register_module("conv1", std::make_shared<Conv2d>(channels, channels, Size2{3, 3}, Size2{1, 1}, Size2{1, 1},
                                                            Size2{1, 1}, 1, false, dtype));
  bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(channels, 1e-5, 0.1, true, true, dtype));
  conv2 = register_module("conv2", std::make_shared<Conv2d>(channels, channels, Size2{3, 3}, Size2{1, 1}, Size2{1, 1},
                                                            Size2{1, 1}, 1, false, dtype));
}

Tensor PreActBody::forward_impl(const Tensor& x) {
  Tensor h = conv1->forward(relu(bn1->forward(x)));
  return conv2->forward(relu(bn2->forward(h)));
}

DownsampleBlock::DownsampleBlock(int64_t in, int64_t out, int64_t stride, DType dtype) {
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(in, 1e-5, 0.1, true, true, dtype));
  conv1 = register_module("conv1", std::make_shared<Conv2d>(in, out, Size2{3, 3}, Size2{stride, stride}, Size2{1, 1},
                                                            Size2{1, 1}, 1, false, dtype));
  bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(out, 1e-5, 0.1, true, true, dtype));
  conv2 = register_module("conv2", std::make_shared<Conv2d>(out, out, Size2{3, 3}, Size2{1, 1}, Size2{1, 1},
                                                            Size2{1, 1}, 1, false, dtype));
  shortcut = register_module("shortcut", std::make_shared<Conv2d>(in, out, Size2{1, 1}, Size2{stride, stride},
                                                                  Size2{0, 0}, Size2{1, 1}, 1, false, dtype));
}

Tensor DownsampleBlock::forward_impl(const Tensor& x) {
  Tensor a = relu(bn1->forward(x));
  Tensor h = conv2->forward(relu(bn2->forward(conv1->forward(a))));
  return add(h, shortcut->forward(a));
}

ResNetHead::ResNetHead(int64_t channels, int64_t classes, DType dtype) {
  bn = register_module("bn", std::make_shared<BatchNorm2d>(channels, 1e-5, 0.1, true, true, dtype));
  fc = register_module("fc", std::make_shared<Linear>(channels, classes, true, dtype));
}

Tensor ResNetHead::forward_impl(const Tensor& x) {
  Tensor pooled = adaptive_avg_pool2d(relu(bn->forward(x)), {1, 1});  // [N, C, 1, 1]
  return fc->forward(pooled.reshape({pooled.size(0), pooled.size(1)}));
}

// ---- the network

ResNet::ResNet(const ResNetConfig& c) : config_(c) {
  REMAT_CHECK(c.stages >= 1 && c.stages <= 8, "ResNet: stages must be in [1, 8], got ", c.stages);
  REMAT_CHECK(c.blocks_per_stage >= 1 && c.blocks_per_stage <= 100000, "ResNet: blocks_per_stage must be in [1, 100000], got ",
              c.blocks_per_stage);
  REMAT_CHECK(c.width >= 1 && c.width <= (int64_t{1} << 16) >> (c.stages - 1), "ResNet: width ", c.width,
              " is out of range for ", c.stages, " stages");
  REMAT_CHECK(c.in_channels >= 1 && c.classes >= 1, "ResNet: in_channels and classes must be positive, got ",
              c.in_channels, " and ", c.classes);
  layers = register_module("layers", std::make_shared<Sequential>());
  layers->add(std::make_shared<Conv2d>(c.in_channels, c.width, Size2{3, 3}, Size2{1, 1}, Size2{1, 1}, Size2{1, 1}, 1,
                                       false, c.dtype));
  int64_t channels = c.width;
  for (int64_t s = 0; s < c.stages; ++s) {
    const int64_t out = c.width << s;
    for (int64_t b = 0; b < c.blocks_per_stage; ++b) {
      if (s > 0 && b == 0) {
        auto block = std::make_shared<DownsampleBlock>(channels, out, 2, c.dtype);
        batch_norms_.insert(batch_norms_.end(), {block->bn1, block->bn2});
        layers->add(block);
      } else {
        auto body = std::make_shared<PreActBody>(out, c.dtype);
        batch_norms_.insert(batch_norms_.end(), {body->bn1, body->bn2});
        // a block (its add included) is one layer call, so every-k:K groups K blocks
        auto block = std::make_shared<Residual>(body);
        block->set_role(CallRole::automatic);
        layers->add(block);
      }
      channels = out;
    }
  }
  auto head = std::make_shared<ResNetHead>(channels, c.classes, c.dtype);
  batch_norms_.push_back(head->bn);
  layers->add(head);
  reset_parameters(c.seed);
}

std::string ResNet::type_name() const {
  return detail::concat("ResNet(depth ", config_.depth(), ", ", config_.stages, " stages x ", config_.blocks_per_stage,
                        " blocks, width ", config_.width, ")");
}

Tensor ResNet::forward_impl(const Tensor& images) {
  REMAT_CHECK(images.defined() && images.dim() == 4 && images.size(1) == config_.in_channels, type_name(),
              ": expects images [N, ", config_.in_channels, ", H, W], got ",
              images.defined() ? shape_str(images.shape()) : "an undefined tensor");
  REMAT_CHECK(images.size(2) > 0 && images.size(3) > 0, type_name(), ": empty images of shape ",
              shape_str(images.shape()));
  return layers->forward(images);
}

Tensor ResNet::loss(const Tensor& images, const Tensor& labels) {
  REMAT_CHECK(labels.defined() && labels.dtype() == DType::i64 && labels.dim() == 1 &&
                  images.defined() && images.dim() >= 1 && labels.size(0) == images.size(0),
              type_name(), ": labels must be i64 [N] for images of shape ",
              images.defined() ? shape_str(images.shape()) : "(undefined)", ", got ",
              labels.defined() ? shape_str(labels.shape()) : "an undefined tensor");
  return cross_entropy(forward(images), labels);
}

// ---- synthetic images

SyntheticImages make_synthetic_images(const SyntheticImageOptions& o) {
  REMAT_CHECK(o.count >= 1 && o.classes >= 1 && o.channels >= 1 && o.size >= 1, "make_synthetic_images: count, ",
              "classes, channels and size must be positive");
  REMAT_CHECK(o.count <= (int64_t{1} << 20) && o.size <= 1024 && o.channels <= 64 && o.classes <= 1 << 16,
              "make_synthetic_images: ", o.count, " images of ", o.channels, " x ", o.size, " x ", o.size,
              " is larger than this generator is meant for");
  REMAT_CHECK(o.max_shift >= 0 && o.noise >= 0 && std::isfinite(o.noise), "make_synthetic_images: max_shift and noise must not be negative");
  std::mt19937_64 rng(o.seed);
  auto uniform = [&] { return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0); };
  auto normal = [&] {  // Box-Muller (std::normal_distribution differs between libraries)
    const double u1 = uniform() + 1e-300, u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  };
  const int64_t n = o.size, plane = n * n;
  // the class patterns [classes, channels, n, n]
  std::vector<double> patterns(static_cast<size_t>(o.classes * o.channels * plane), 0.0);
  for (int64_t k = 0; k < o.classes; ++k)
    for (int64_t c = 0; c < o.channels; ++c)
      for (int g = 0; g < 3; ++g) {
        const double freq = 1.0 + 3.0 * uniform(), angle = 3.141592653589793 * uniform();
        const double phase = 6.283185307179586 * uniform();
        const double fx = freq * std::cos(angle) * 6.283185307179586 / static_cast<double>(n);
        const double fy = freq * std::sin(angle) * 6.283185307179586 / static_cast<double>(n);
        double* p = patterns.data() + (k * o.channels + c) * plane;
        for (int64_t y = 0; y < n; ++y)
          for (int64_t x = 0; x < n; ++x)
            p[y * n + x] += std::sin(fx * static_cast<double>(x) + fy * static_cast<double>(y) + phase) / std::sqrt(3.0);
      }
  std::vector<double> pixels(static_cast<size_t>(o.count * o.channels * plane));
  std::vector<int64_t> labels(static_cast<size_t>(o.count));
  for (int64_t i = 0; i < o.count; ++i) {
    const int64_t k = i % o.classes;
    labels[static_cast<size_t>(i)] = k;
    const int64_t span = 2 * o.max_shift + 1;
    const int64_t dy = static_cast<int64_t>(rng() % static_cast<uint64_t>(span)) - o.max_shift;
    const int64_t dx = static_cast<int64_t>(rng() % static_cast<uint64_t>(span)) - o.max_shift;
    for (int64_t c = 0; c < o.channels; ++c) {
      const double* p = patterns.data() + (k * o.channels + c) * plane;
      double* out = pixels.data() + (i * o.channels + c) * plane;
      for (int64_t y = 0; y < n; ++y)
        for (int64_t x = 0; x < n; ++x) {
          const int64_t sy = ((y + dy) % n + n) % n, sx = ((x + dx) % n + n) % n;
          out[y * n + x] = p[sy * n + sx] + o.noise * normal();
        }
    }
  }
  return {from_vector(pixels, {o.count, o.channels, n, n}, o.dtype), from_indices(labels, {o.count})};
}

}  // namespace remat::nn
