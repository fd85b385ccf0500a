// Internal: float32 2-D convolution through oneDNN's primitives (conv_onednn.cpp). Each call
// returns false when oneDNN cannot serve the case (the caller then runs remat's im2col + GEMM).
//   blocked = false: the primitives run on the NCHW / OIHW tensors as they are;
//   blocked = true:  the primitives pick their layouts (format "any"), with reorders in and out.
// Every buffer (reordered operands, oneDNN's scratchpad) is a remat tensor from the accounted
// allocator.
#pragma once

#include "remat/backend.h"
#include "remat/tensor.h"

namespace remat::cpu {

bool onednn_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g,
                           const Tensor& y, bool blocked);
bool onednn_conv2d_backward_input(const Tensor& gy, const Tensor& w, const Conv2dGeometry& g, const Tensor& gx,
                                  bool blocked);
bool onednn_conv2d_backward_weight(const Tensor& x, const Tensor& gy, const Conv2dGeometry& g, const Tensor& gw,
                                   const Tensor& gbias, bool blocked);

}  // namespace remat::cpu
