// Convolution and pooling layers (see include/remat/nn/conv.h).
#include "remat/nn/conv.h"

#include <cmath>

namespace remat::nn {

namespace {
std::string size2(Size2 s) { return detail::concat(s[0], "x", s[1]); }
}  // namespace

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel, Size2 stride, Size2 padding, Size2 dilation,
               int64_t groups, bool bias, DType dtype)
    : in_(in_channels),
      out_(out_channels),
      kernel_(kernel),
      stride_(stride),
      padding_(padding),
      dilation_(dilation),
      groups_(groups) {
  REMAT_CHECK(in_channels > 0 && out_channels > 0, "Conv2d: channel counts must be positive, got ", in_channels,
              " -> ", out_channels);
  REMAT_CHECK(groups >= 1 && in_channels % groups == 0 && out_channels % groups == 0, "Conv2d: ", groups,
              " groups must divide both channel counts ", in_channels, " and ", out_channels);
  REMAT_CHECK(kernel[0] >= 1 && kernel[1] >= 1 && kernel[0] <= (1 << 20) && kernel[1] <= (1 << 20),
              "Conv2d: kernel size ", size2(kernel), " must be positive");
  REMAT_CHECK(stride[0] >= 1 && stride[1] >= 1, "Conv2d: stride ", size2(stride), " must be positive");
  REMAT_CHECK(padding[0] >= 0 && padding[1] >= 0, "Conv2d: padding ", size2(padding), " must not be negative");
  REMAT_CHECK(dilation[0] >= 1 && dilation[1] >= 1, "Conv2d: dilation ", size2(dilation), " must be positive");
  const double fan_in = static_cast<double>(in_channels / groups) * static_cast<double>(kernel[0] * kernel[1]);
  const double bound = 1.0 / std::sqrt(fan_in);
  weight = register_parameter("weight", {out_channels, in_channels / groups, kernel[0], kernel[1]}, dtype,
                              Init::uniform(-bound, bound));
  if (bias) this->bias = register_parameter("bias", {out_channels}, dtype, Init::zeros());
}

std::string Conv2d::type_name() const {
  std::string s = detail::concat("Conv2d(", in_, " -> ", out_, ", kernel ", size2(kernel_));
  if (stride_ != Size2{1, 1}) s += ", stride " + size2(stride_);
  if (padding_ != Size2{0, 0}) s += ", padding " + size2(padding_);
  if (dilation_ != Size2{1, 1}) s += ", dilation " + size2(dilation_);
  if (groups_ != 1) s += detail::concat(", groups ", groups_);
  return s + (bias.defined() ? ", bias)" : ", no bias)");
}

Tensor Conv2d::forward_impl(const Tensor& x) {
  REMAT_CHECK(x.defined() && x.dim() == 4 && x.size(1) == in_, type_name(), ": expects an input [N, ", in_,
              ", H, W], got ", x.defined() ? shape_str(x.shape()) : "an undefined tensor");
  return conv2d(x, compute_weight(weight), compute_weight(bias), stride_, padding_, dilation_, groups_);
}

MaxPool2d::MaxPool2d(Size2 kernel, Size2 stride, Size2 padding, Size2 dilation, bool ceil_mode)
    : kernel_(kernel), stride_(stride), padding_(padding), dilation_(dilation), ceil_mode_(ceil_mode) {
  // the op validates the window against each input; reject what no input could accept now
  REMAT_CHECK(kernel[0] >= 1 && kernel[1] >= 1 && stride[0] >= 1 && stride[1] >= 1 && padding[0] >= 0 &&
                  padding[1] >= 0 && dilation[0] >= 1 && dilation[1] >= 1,
              "MaxPool2d: kernel ", size2(kernel), ", stride ", size2(stride), ", dilation ", size2(dilation),
              " must be positive and padding ", size2(padding), " not negative");
}

std::string MaxPool2d::type_name() const {
  return detail::concat("MaxPool2d(", size2(kernel_), ", stride ", size2(stride_), ", padding ", size2(padding_),
                        ceil_mode_ ? ", ceil)" : ")");
}

Tensor MaxPool2d::forward_impl(const Tensor& x) { return max_pool2d(x, kernel_, stride_, padding_, dilation_, ceil_mode_); }

AvgPool2d::AvgPool2d(Size2 kernel, Size2 stride, Size2 padding, bool ceil_mode, bool count_include_pad)
    : kernel_(kernel), stride_(stride), padding_(padding), ceil_mode_(ceil_mode), count_include_pad_(count_include_pad) {
  REMAT_CHECK(kernel[0] >= 1 && kernel[1] >= 1 && stride[0] >= 1 && stride[1] >= 1 && padding[0] >= 0 &&
                  padding[1] >= 0,
              "AvgPool2d: kernel ", size2(kernel), " and stride ", size2(stride), " must be positive and padding ",
              size2(padding), " not negative");
}

std::string AvgPool2d::type_name() const {
  return detail::concat("AvgPool2d(", size2(kernel_), ", stride ", size2(stride_), ", padding ", size2(padding_), ")");
}

Tensor AvgPool2d::forward_impl(const Tensor& x) {
  return avg_pool2d(x, kernel_, stride_, padding_, ceil_mode_, count_include_pad_);
}

std::string AdaptiveAvgPool2d::type_name() const {
  return detail::concat("AdaptiveAvgPool2d(", size2(output_size_), ")");
}

Tensor AdaptiveAvgPool2d::forward_impl(const Tensor& x) { return adaptive_avg_pool2d(x, output_size_); }

Tensor Flatten::forward_impl(const Tensor& x) {
  REMAT_CHECK(x.defined(), "Flatten: input is undefined");
  const int64_t start = start_ < 0 ? start_ + x.dim() : start_;
  REMAT_CHECK(start >= 0 && start < std::max<int64_t>(x.dim(), 1), "Flatten: start axis ", start_,
              " out of range for shape ", shape_str(x.shape()));
  Shape shape(x.shape().begin(), x.shape().begin() + start);
  shape.push_back(-1);
  return x.reshape(shape);
}

}  // namespace remat::nn
