// remat/nn/conv.h - convolution and pooling layers over NCHW images.
//
//   auto conv = std::make_shared<remat::nn::Conv2d>(3, 16, remat::Size2{3, 3}, remat::Size2{1, 1}, remat::Size2{1, 1});
//   auto pool = std::make_shared<remat::nn::MaxPool2d>(remat::Size2{2, 2});
//   Tensor y = pool->forward(conv->forward(x));        // x [8, 3, 32, 32] -> [8, 16, 16, 16]
//
// Parameter layouts follow PyTorch (weight [out, in / groups, KH, KW], bias [out]), so weights
// exchange with torch.nn.Conv2d through safetensors files. The ops are those of remat/ops.h
// (conv2d, max_pool2d, avg_pool2d, adaptive_avg_pool2d); see there for the size rules.
#pragma once

#include <cstdint>

#include "remat/nn/module.h"
#include "remat/ops.h"

namespace remat::nn {

// y = conv2d(x, weight, bias, stride, padding, dilation, groups). weight ~ U(-1/sqrt(fan_in),
// 1/sqrt(fan_in)) with fan_in = in / groups * KH * KW (PyTorch's default bound); bias = 0.
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel, Size2 stride = {1, 1}, Size2 padding = {0, 0},
         Size2 dilation = {1, 1}, int64_t groups = 1, bool bias = true, DType dtype = DType::f32);
  std::string type_name() const override;
  int64_t in_channels() const { return in_; }
  int64_t out_channels() const { return out_; }
  Tensor weight;
  Tensor bias;  // undefined without bias

 protected:
  Tensor forward_impl(const Tensor& x) override;

 private:
  int64_t in_, out_;
  Size2 kernel_, stride_, padding_, dilation_;
  int64_t groups_;
};

class MaxPool2d : public Module {
 public:
  // stride defaults to the kernel
  explicit MaxPool2d(Size2 kernel) : MaxPool2d(kernel, kernel) {}
  MaxPool2d(Size2 kernel, Size2 stride, Size2 padding = {0, 0}, Size2 dilation = {1, 1}, bool ceil_mode = false);
  std::string type_name() const override;

 protected:
  Tensor forward_impl(const Tensor& x) override;

 private:
  Size2 kernel_, stride_, padding_, dilation_;
  bool ceil_mode_;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Size2 kernel) : AvgPool2d(kernel, kernel) {}
  AvgPool2d(Size2 kernel, Size2 stride, Size2 padding = {0, 0}, bool ceil_mode = false, bool count_include_pad = true);
  std::string type_name() const override;

 protected:
  Tensor forward_impl(const Tensor& x) override;

 private:
  Size2 kernel_, stride_, padding_;
  bool ceil_mode_, count_include_pad_;
};

// [N, C, H, W] -> [N, C, out_h, out_w]; AdaptiveAvgPool2d({1, 1}) is global average pooling.
class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Size2 output_size) : output_size_(output_size) {}
  std::string type_name() const override;

 protected:
  Tensor forward_impl(const Tensor& x) override;

 private:
  Size2 output_size_;
};

// Collapses the axes from start_axis on into one: [N, C, 1, 1] -> [N, C] (a view when possible).
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_axis = 1) : start_(start_axis) {}
  std::string type_name() const override { return "Flatten"; }

 protected:
  Tensor forward_impl(const Tensor& x) override;

 private:
  int64_t start_;
};

}  // namespace remat::nn
