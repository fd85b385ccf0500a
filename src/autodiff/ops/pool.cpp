// 2-D pooling: max (its backward reads the argmax positions, an i64 aux output, and nothing
// else), average and adaptive average (their backwards need only the input's shape).
#include "autodiff/kernels.h"
#include "autodiff/op.h"
#include "autodiff/ops/window.h"

namespace remat {

using autodiff::BackwardContext;
using autodiff::OpSpec;

namespace {

const OpSpec kMaxPool{autodiff::OpKind::max_pool2d, autodiff::save_nothing, 1};
const OpSpec kAvgPool{autodiff::OpKind::avg_pool2d, autodiff::save_nothing};
const OpSpec kAdaptiveAvgPool{autodiff::OpKind::adaptive_avg_pool2d, autodiff::save_nothing};

void check_image(const char* op, const Tensor& x) {
  REMAT_CHECK(x.defined(), op, ": input is undefined");
  REMAT_CHECK(is_floating(x.dtype()), op, ": expects a floating input (f32, f64, bf16, f16), got ", dtype_name(x.dtype()));
  REMAT_CHECK(x.dim() == 4, op, ": expects an input [N, C, H, W], got shape ", shape_str(x.shape()));
}

// Validates the window and returns the output shape.
Shape check_pool(const char* op, const Tensor& x, const Pool2dGeometry& g) {
  check_image(op, x);
  const int64_t kernel[2] = {g.kernel_h, g.kernel_w}, stride[2] = {g.stride_h, g.stride_w};
  const int64_t padding[2] = {g.pad_h, g.pad_w}, dilation[2] = {g.dilation_h, g.dilation_w};
  int64_t out[2];
  for (int i = 0; i < 2; ++i) {
    window::check_parameter(op, "kernel size", kernel[i], 1);
    window::check_parameter(op, "stride", stride[i], 1);
    window::check_parameter(op, "padding", padding[i], 0);
    window::check_parameter(op, "dilation", dilation[i], 1);
    const int64_t extent = dilation[i] * (kernel[i] - 1) + 1;
    REMAT_CHECK(2 * padding[i] <= extent, op, ": padding ", padding[i], " exceeds half the ",
                dilation[i] > 1 ? "dilated " : "", "kernel size ", extent,
                " (a window would lie entirely in the padding)");
    out[i] = window::output_length(op, i == 0 ? "height" : "width", x.shape()[2 + i], kernel[i], stride[i],
                                   padding[i], dilation[i], g.ceil_mode, x);
  }
  Shape shape{x.shape()[0], x.shape()[1], out[0], out[1]};
  window::checked_numel(shape, op);
  return shape;
}

}  // namespace

Tensor max_pool2d(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding, Size2 dilation, bool ceil_mode) {
  Pool2dGeometry g{kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1],
                   ceil_mode, true};
  const Shape out_shape = check_pool("max_pool2d", x, g);
  const double flops = static_cast<double>(shape_numel(out_shape)) * static_cast<double>(kernel[0] * kernel[1]);
  return autodiff::apply1(
      kMaxPool, {x},
      [g, out_shape](const TensorList& in) {
        Tensor y = kernels::empty(out_shape, in[0].dtype(), in[0].device());
        Tensor indices = kernels::empty(out_shape, DType::i64, in[0].device());
        kernels::backend_of(in[0]).max_pool2d(in[0], g, y, indices);
        return TensorList{y, indices};
      },
      [](BackwardContext& ctx) {
        const auto& meta = ctx.input_meta(0);
        Tensor gx = kernels::empty(meta.shape, meta.dtype, meta.device);
        kernels::backend_of(gx).max_pool2d_backward(ctx.grad_output(0), ctx.output(1), gx);
        ctx.set_input_grad(0, gx);
      },
      flops);
}

Tensor max_pool2d(const Tensor& x, Size2 kernel) { return max_pool2d(x, kernel, kernel); }

Tensor avg_pool2d(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding, bool ceil_mode, bool count_include_pad) {
  Pool2dGeometry g{kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1], 1, 1, ceil_mode,
                   count_include_pad};
  const Shape out_shape = check_pool("avg_pool2d", x, g);
  const double flops = static_cast<double>(shape_numel(out_shape)) * static_cast<double>(kernel[0] * kernel[1]);
  return autodiff::apply1(
      kAvgPool, {x},
      [g, out_shape](const TensorList& in) {
        Tensor y = kernels::empty(out_shape, in[0].dtype(), in[0].device());
        kernels::backend_of(in[0]).avg_pool2d(in[0], g, y);
        return TensorList{y};
      },
      [g](BackwardContext& ctx) {
        const auto& meta = ctx.input_meta(0);
        Tensor gx = kernels::empty(meta.shape, meta.dtype, meta.device);
        kernels::backend_of(gx).avg_pool2d_backward(ctx.grad_output(0), g, gx);
        ctx.set_input_grad(0, gx);
      },
      flops);
}

Tensor avg_pool2d(const Tensor& x, Size2 kernel) { return avg_pool2d(x, kernel, kernel); }

Tensor adaptive_avg_pool2d(const Tensor& x, Size2 output_size) {
  const char* op = "adaptive_avg_pool2d";
  check_image(op, x);
  for (int i = 0; i < 2; ++i)
    REMAT_CHECK(output_size[i] >= 1 && output_size[i] <= window::kMaxParameter, op, ": output size [", output_size[0],
                ", ", output_size[1], "] must be positive");
  REMAT_CHECK(x.shape()[2] > 0 && x.shape()[3] > 0, op, ": cannot pool the empty image of shape ",
              shape_str(x.shape()));
  const Shape out_shape{x.shape()[0], x.shape()[1], output_size[0], output_size[1]};
  window::checked_numel(out_shape, op);
  return autodiff::apply1(
      kAdaptiveAvgPool, {x},
      [out_shape](const TensorList& in) {
        Tensor y = kernels::empty(out_shape, in[0].dtype(), in[0].device());
        kernels::backend_of(in[0]).adaptive_avg_pool2d(in[0], y);
        return TensorList{y};
      },
      [](BackwardContext& ctx) {
        const auto& meta = ctx.input_meta(0);
        Tensor gx = kernels::empty(meta.shape, meta.dtype, meta.device);
        kernels::backend_of(gx).adaptive_avg_pool2d_backward(ctx.grad_output(0), gx);
        ctx.set_input_grad(0, gx);
      },
      static_cast<double>(x.numel()));
}

}  // namespace remat
