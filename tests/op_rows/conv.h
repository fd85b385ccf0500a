// tests/op_rows/conv.h - the conv2d rows, which test_ops.cpp also runs under every float32
// convolution algorithm (tests/op_rows/conv.cpp).
#pragma once

#include "op_rows/builders.h"

namespace remat::test {

struct ConvRow {
  std::string variant;
  Shape x, w;
  bool bias = false;
  Size2 stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
};

OpCase conv2d_case(const ConvRow& r);
// The conv2d rows (also run under every f32 ConvAlgorithm by test_ops.cpp).
std::vector<ConvRow> conv2d_rows();

}  // namespace remat::test
