// The examples of include/remat/saved_hooks.h: hooks that count saved bytes, and hooks that keep
// rounded copies.
#include <gtest/gtest.h>

#include <cmath>

#include "remat/nn.h"
#include "remat/saved_hooks.h"

using namespace remat;

namespace {

// A float32 tensor rounded to float16's 11 significant bits (normal range; the hooks' example
// needs only some lossy copy).
Tensor round_to_f16(const Tensor& storage) {
  std::vector<double> v = storage.to_vector();
  for (double& x : v) {
    int exponent = 0;
    const double mantissa = std::frexp(x, &exponent);  // x = mantissa * 2^exponent, |mantissa| in [0.5, 1)
    x = std::ldexp(std::round(mantissa * 2048.0) / 2048.0, exponent);
  }
  return from_vector(v, storage.shape(), storage.dtype());
}

}  // namespace

TEST(SavedHooksH, Examples) {
  nn::Sequential model;
  for (int i = 0; i < 3; ++i) model.add(std::make_shared<nn::Linear>(16, 16));
  Tensor x = randn({8, 16}, DType::f32, RngState{1, 0});
REMAT_EXAMPLE(include/remat/saved_hooks.h: // count how many bytes a step saves)
  EXPECT_GE(packed_bytes, 3u * 8 * 16 * sizeof(float));  // at least each layer call's input
  const Tensor exact = model.parameters()[0].grad().clone();
REMAT_EXAMPLE(include/remat/saved_hooks.h: // keep float32 activations as float16-rounded copies)
  model.zero_grad();
  {
    remat::ScopedSavedTensorHooks hooks(rounding);
    model.forward(x).mean().backward();
  }
  // close to the exact gradient, but not the same (the rounding changes gradients)
  const std::vector<double> a = exact.to_vector(), b = model.parameters()[0].grad().to_vector();
  double largest = 0, difference = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    largest = std::max(largest, std::abs(a[i]));
    difference = std::max(difference, std::abs(a[i] - b[i]));
  }
  EXPECT_GT(difference, 0.0);
  EXPECT_LT(difference, 1e-2 * largest);
}
