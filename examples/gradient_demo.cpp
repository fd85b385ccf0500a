// gradient_demo: trains a tiny 2-layer tanh MLP on a synthetic regression with plain SGD.
//
//   teacher:  y = tanh(x @ A) @ B            x [256, 8], A [8, 16], B [16, 1] (fixed, random)
//   student:  p = tanh(x @ W1 + b1) @ W2 + b2, loss = mean((p - y)^2)
//
// Prints the loss every 20 steps and, at the end, the accounted allocator's peak bytes
// (remat::memory::stats()), overall and per tag.
#include <cmath>
#include <cstdio>

#include "remat/autodiff.h"
#include "remat/memory.h"
#include "remat/ops.h"
#include "remat/random.h"
#include "remat/tensor.h"

using namespace remat;

namespace {

constexpr int64_t kBatch = 256, kIn = 8, kHidden = 32, kTeacherHidden = 16;
constexpr int kSteps = 200;
constexpr double kLearningRate = 0.1;

// A trainable parameter: storage tagged `parameter`, filled with N(0, stddev^2).
Tensor parameter(const Shape& shape, double stddev) {
  Tensor p = zeros(shape, DType::f32, memory::Tag::parameter);
  if (stddev > 0) {
    NoGradGuard no_grad;
    p.copy_(randn(shape, DType::f32, 0.0, stddev));
  }
  p.requires_grad_();
  return p;
}

}  // namespace

int main() {
  manual_seed(2024);
  memory::reset_peaks();

  // Synthetic data from a fixed random teacher network.
  Tensor x = randn({kBatch, kIn});
  Tensor y;
  {
    NoGradGuard no_grad;
    Tensor a = randn({kIn, kTeacherHidden}, DType::f32, 0.0, 1.0 / std::sqrt(double(kIn)));
    Tensor b = randn({kTeacherHidden, 1}, DType::f32, 0.0, 1.0 / std::sqrt(double(kTeacherHidden)));
    y = matmul(tanh(matmul(x, a)), b);
  }

  Tensor w1 = parameter({kIn, kHidden}, 1.0 / std::sqrt(double(kIn)));
  Tensor b1 = parameter({kHidden}, 0.0);
  Tensor w2 = parameter({kHidden, 1}, 1.0 / std::sqrt(double(kHidden)));
  Tensor b2 = parameter({1}, 0.0);
  Tensor params[] = {w1, b1, w2, b2};
  const Tensor lr = scalar_tensor(kLearningRate);

  double first_loss = 0, last_loss = 0;
  for (int step = 0; step <= kSteps; ++step) {
    Tensor h = tanh(add(matmul(x, w1), b1));
    Tensor pred = add(matmul(h, w2), b2);
    Tensor diff = sub(pred, y);
    Tensor loss = mean(mul(diff, diff));
    last_loss = loss.item();
    if (step == 0) first_loss = last_loss;
    if (step % 20 == 0) std::printf("step %3d  loss %.6f\n", step, last_loss);
    if (step == kSteps) break;

    loss.backward();
    NoGradGuard no_grad;  // SGD: w <- w - lr * grad
    for (Tensor& p : params) {
      Tensor updated = sub(p, mul(p.grad(), lr));
      p.copy_(updated);
      p.zero_grad();
    }
  }

  const memory::Stats stats = memory::stats();
  std::printf("loss %.6f -> %.6f (%.1fx lower)\n", first_loss, last_loss, first_loss / last_loss);
  std::printf("allocator peak: %zu bytes (%s); parameter %zu, gradient %zu, saved %zu, other %zu\n",
              stats.peak_total, memory::format_bytes(double(stats.peak_total)).c_str(),
              stats.peak(memory::Tag::parameter), stats.peak(memory::Tag::gradient),
              stats.peak(memory::Tag::saved), stats.peak(memory::Tag::other));
  return last_loss < first_loss ? 0 : 1;
}
