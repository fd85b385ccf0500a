// Optimizers against hand-computed updates, gradient clipping, the LR schedule, and losses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>

#include "remat/nn.h"

using namespace remat;

namespace {

Tensor param(const std::vector<double>& v, DType dtype = DType::f64) {
  Tensor p = Tensor::empty({static_cast<int64_t>(v.size())}, dtype, memory::Tag::parameter);
  {
    NoGradGuard no_grad;
    p.copy_(from_vector(v, {static_cast<int64_t>(v.size())}, DType::f64));
  }
  return p.requires_grad_();
}

void set_grad(Tensor& p, const std::vector<double>& g) {
  p.set_grad(from_vector(g, {static_cast<int64_t>(g.size())}, p.dtype()));
}

const std::vector<std::vector<double>> kGrads = {{0.5, 1.0}, {-0.2, 0.4}, {0.1, -0.3}};

}  // namespace

TEST(Optim, SgdPlainStep) {
  Tensor p = param({1.0, -2.0});
  nn::SGD opt({p}, {.lr = 0.1});
  set_grad(p, {0.5, 1.0});
  opt.step();
  EXPECT_DOUBLE_EQ(p.to_vector()[0], 1.0 - 0.1 * 0.5);
  EXPECT_DOUBLE_EQ(p.to_vector()[1], -2.0 - 0.1 * 1.0);
  EXPECT_EQ(p.storage()->tag(), memory::Tag::parameter);
  EXPECT_TRUE(p.requires_grad() && p.is_leaf());
}

TEST(Optim, SgdMomentumWeightDecayNesterovThreeSteps) {
  for (bool nesterov : {false, true}) {
    SCOPED_TRACE(nesterov ? "nesterov" : "classical");
    const double lr = 0.1, mu = 0.9, wd = 0.01;
    Tensor p = param({1.0, -2.0});
    nn::SGD opt({p}, {.lr = lr, .momentum = mu, .weight_decay = wd, .nesterov = nesterov});
    // the same updates by hand, element by element
    double value[2] = {1.0, -2.0}, buf[2] = {0, 0};
    for (size_t step = 0; step < 3; ++step) {
      const uint64_t version = p.storage()->version();
      set_grad(p, kGrads[step]);
      opt.step();
      EXPECT_GT(p.storage()->version(), version);  // written in place
      for (int i = 0; i < 2; ++i) {
        double g = kGrads[step][i] + wd * value[i];
        buf[i] = step == 0 ? g : mu * buf[i] + g;
        value[i] -= lr * (nesterov ? g + mu * buf[i] : buf[i]);
        EXPECT_NEAR(p.to_vector()[i], value[i], 1e-15) << "step " << step << " element " << i;
      }
    }
    EXPECT_EQ(opt.momentum_buffer(0).storage()->tag(), memory::Tag::other);
  }
  // first step written out: 1 - 0.1 * (0.5 + 0.01 * 1) = 0.949
  Tensor p = param({1.0});
  nn::SGD opt({p}, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
  set_grad(p, {0.5});
  opt.step();
  EXPECT_NEAR(p.item(), 0.949, 1e-15);
}

TEST(Optim, AdamWThreeSteps) {
  const double lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
  Tensor p = param({1.0, -2.0});
  Tensor frozen = param({5.0});  // never gets a gradient: skipped
  nn::AdamW opt({p, frozen}, {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd});
  double value[2] = {1.0, -2.0}, m[2] = {0, 0}, v[2] = {0, 0};
  for (int step = 1; step <= 3; ++step) {
    set_grad(p, kGrads[step - 1]);
    opt.step();
    for (int i = 0; i < 2; ++i) {
      const double g = kGrads[step - 1][i];
      value[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double mhat = m[i] / (1 - std::pow(b1, step)), vhat = v[i] / (1 - std::pow(b2, step));
      value[i] -= lr * mhat / (std::sqrt(vhat) + eps);
      EXPECT_NEAR(p.to_vector()[i], value[i], 1e-12) << "step " << step << " element " << i;
      EXPECT_NEAR(opt.exp_avg(0).to_vector()[i], m[i], 1e-15);
      EXPECT_NEAR(opt.exp_avg_sq(0).to_vector()[i], v[i], 1e-15);
    }
  }
  EXPECT_EQ(opt.steps(0), 3);
  EXPECT_EQ(opt.steps(1), 0);
  EXPECT_FALSE(opt.exp_avg(1).defined());
  EXPECT_EQ(frozen.item(), 5.0);
  EXPECT_EQ(opt.exp_avg(0).storage()->tag(), memory::Tag::other);
  EXPECT_EQ(opt.exp_avg_sq(0).storage()->tag(), memory::Tag::other);
  // the first step written out: 1 * (1 - 0.1 * 0.01) - 0.1 * 0.5 / (0.5 + 1e-8) ~= 0.899
  Tensor q = param({1.0});
  nn::AdamW single({q}, {.lr = lr, .weight_decay = wd});
  set_grad(q, {0.5});
  single.step();
  EXPECT_NEAR(q.item(), 0.899, 1e-7);
}

TEST(Optim, AdamWOnF32AndZeroGrad) {
  Tensor p = param({1.0, 2.0, 3.0}, DType::f32);
  nn::AdamW opt({p}, {.lr = 0.5, .weight_decay = 0.0});
  set_grad(p, {1.0, -1.0, 0.0});
  opt.step();
  std::vector<double> v = p.to_vector();
  EXPECT_NEAR(v[0], 0.5, 1e-6);
  EXPECT_NEAR(v[1], 2.5, 1e-6);
  EXPECT_NEAR(v[2], 3.0, 1e-6);
  opt.zero_grad();
  EXPECT_FALSE(p.grad().defined());
}

TEST(Optim, RejectsInvalidArguments) {
  Tensor p = param({1.0});
  EXPECT_THROW(nn::SGD({p, p}, {}), Error);
  EXPECT_THROW(nn::SGD({p}, {.lr = -1}), Error);
  EXPECT_THROW(nn::SGD({p}, {.nesterov = true}), Error);
  EXPECT_THROW(nn::AdamW({p}, {.beta1 = 1.0}), Error);
  EXPECT_THROW(nn::AdamW({from_vector(std::vector<double>{1.0}, {1}, DType::f64)}, {}), Error);  // no grad
  nn::SGD opt({p}, {});
  EXPECT_THROW(opt.set_lr(std::nan("")), Error);
  opt.set_lr(0.5);
  EXPECT_EQ(opt.lr(), 0.5);
}

TEST(Optim, ClipGradNorm) {
  Tensor a = param({1.0, 1.0}), b = param({1.0}), c = param({1.0});
  set_grad(a, {3.0, 4.0});
  set_grad(b, {12.0});
  // c has no gradient
  EXPECT_DOUBLE_EQ(nn::clip_grad_norm({a, b, c}, 20.0), 13.0);
  EXPECT_EQ(a.grad().to_vector(), (std::vector<double>{3.0, 4.0}));  // below the limit: unchanged
  EXPECT_DOUBLE_EQ(nn::clip_grad_norm({a, b, c}, 6.5), 13.0);
  const double k = 6.5 / (13.0 + 1e-6);
  EXPECT_NEAR(a.grad().to_vector()[0], 3.0 * k, 1e-15);
  EXPECT_NEAR(a.grad().to_vector()[1], 4.0 * k, 1e-15);
  EXPECT_NEAR(b.grad().item(), 12.0 * k, 1e-15);
  EXPECT_NEAR(nn::clip_grad_norm({a, b}, 100.0), 6.5, 1e-6);
  EXPECT_THROW(nn::clip_grad_norm({a}, -1.0), Error);
  set_grad(c, {std::numeric_limits<double>::infinity()});
  EXPECT_TRUE(std::isinf(nn::clip_grad_norm({a, c}, 1.0)));
  EXPECT_NEAR(a.grad().to_vector()[0], 3.0 * k, 1e-15);  // left as it was
}

// Parameters of `dtype` with gradients for clip_grad_norm: odd sizes, an empty one, a strided
// gradient, and the second parameter listed again at the end.
namespace {
TensorList clip_test_parameters(DType dtype, uint64_t seed) {
  TensorList params;
  for (Shape shape : {Shape{37}, Shape{5, 300}, Shape{1}, Shape{4097}, Shape{3, 0}}) {
    Tensor p = Tensor::empty(shape, dtype, memory::Tag::parameter).requires_grad_();
    p.set_grad(randn(shape, dtype, RngState{seed++, 0}));
    params.push_back(p);
  }
  Tensor strided = Tensor::empty({6, 4}, dtype, memory::Tag::parameter).requires_grad_();
  strided.set_grad(randn({4, 6}, dtype, RngState{seed++, 0}).transpose(0, 1));
  params.push_back(strided);
  params.push_back(params[1]);
  return params;
}
}  // namespace

// The norm's square is each gradient's sum(square(g)), in its dtype, added in float64 in parameter
// order: the bits of that composition of ops, for every floating dtype and a strided gradient.
TEST(Optim, ClipGradNormAddsEachGradientsSumOfSquaresInOrder) {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    const TensorList params = clip_test_parameters(dtype, 40);
    double want = 0.0;
    for (size_t i = 0; i + 1 < params.size(); ++i) want += sum(square(params[i].grad())).to(DType::f64).item();
    const std::vector<double> before = params[1].grad().to_vector();
    EXPECT_EQ(nn::clip_grad_norm(params, 1e30), std::sqrt(want)) << dtype_name(dtype);
    EXPECT_EQ(params[1].grad().to_vector(), before);
  }
}

// Clipping scales every gradient in one kernel call (Backend::scale_each) with the bits the ops
// gave before: g.copy_(mul_scalar(g, max_norm / (norm + 1e-6))), for every floating dtype, a
// strided gradient and a parameter listed twice (scaled once); each gradient's storage is marked
// as written.
TEST(Optim, ClipGradNormScalesEachGradientAsMulScalarDid) {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const TensorList params = clip_test_parameters(dtype, 60);  // the last is listed twice: scaled once
    TensorList before;
    std::vector<uint64_t> versions;
    for (size_t i = 0; i + 1 < params.size(); ++i) {
      before.push_back(params[i].grad().clone());
      versions.push_back(params[i].grad().storage()->version());
    }
    const double norm = nn::clip_grad_norm(params, 1e30);
    const double max_norm = norm / 3;
    EXPECT_EQ(nn::clip_grad_norm(params, max_norm), norm);
    const double coefficient = max_norm / (norm + 1e-6);
    for (size_t i = 0; i + 1 < params.size(); ++i) {
      const Tensor want = mul_scalar(before[i], coefficient);
      const Tensor got = params[i].grad().contiguous();
      ASSERT_EQ(got.nbytes(), want.nbytes());
      EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), want.nbytes()), 0) << "gradient " << i;
      EXPECT_GT(params[i].grad().storage()->version(), versions[i]) << "gradient " << i;
    }
  }
}

TEST(Optim, WarmupCosineSchedule) {
  nn::WarmupCosine s{.max_lr = 1.0, .min_lr = 0.1, .warmup_steps = 10, .total_steps = 110};
  EXPECT_DOUBLE_EQ(s(0), 0.1);
  EXPECT_DOUBLE_EQ(s(4), 0.5);
  EXPECT_DOUBLE_EQ(s(9), 1.0);
  EXPECT_DOUBLE_EQ(s(10), 1.0);
  EXPECT_NEAR(s(60), 0.55, 1e-15);                                          // half-way: the mean
  EXPECT_NEAR(s(35), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.25)), 1e-15);
  EXPECT_DOUBLE_EQ(s(110), 0.1);
  EXPECT_DOUBLE_EQ(s(100000), 0.1);
  for (int64_t step = 10; step < 110; ++step) EXPECT_GE(s(step), s(step + 1));  // monotone decay
  nn::WarmupCosine no_warmup{.max_lr = 2.0, .min_lr = 0.0, .warmup_steps = 0, .total_steps = 4};
  EXPECT_DOUBLE_EQ(no_warmup(0), 2.0);
  EXPECT_NEAR(no_warmup(2), 1.0, 1e-15);
  EXPECT_THROW(s(-1), Error);
  EXPECT_THROW((nn::WarmupCosine{.warmup_steps = 5, .total_steps = 2}(0)), Error);
}

TEST(Losses, MseLoss) {
  Tensor pred = from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2}, DType::f64).requires_grad_();
  Tensor target = from_vector(std::vector<double>{0, 2, 5, 4}, {2, 2}, DType::f64);
  Tensor loss = nn::mse_loss(pred, target);
  EXPECT_DOUBLE_EQ(loss.item(), (1.0 + 0 + 4 + 0) / 4);
  loss.backward();
  EXPECT_EQ(pred.grad().to_vector(), (std::vector<double>{0.5, 0, -1, 0}));  // 2 (p - t) / n
  EXPECT_THROW(nn::mse_loss(pred, from_vector(std::vector<double>{1, 2}, {2}, DType::f64)), Error);
}

TEST(Losses, CrossEntropyOverLeadingAxesWithLabelSmoothing) {
  Tensor logits = randn({2, 3, 5}, DType::f64, RngState{1, 0});
  Tensor targets = from_indices({0, 4, 2, 1, -100, 3}, {2, 3});
  for (double eps : {0.0, 0.1}) {
    double expected = 0;
    int rows = 0;
    auto l = logits.to_vector();
    auto t = targets.to_vector();
    for (int r = 0; r < 6; ++r) {
      if (t[r] == -100) continue;
      double mx = -1e300, total = 0;
      for (int c = 0; c < 5; ++c) mx = std::max(mx, l[r * 5 + c]);
      for (int c = 0; c < 5; ++c) total += std::exp(l[r * 5 + c] - mx);
      auto logp = [&](int c) { return l[r * 5 + c] - mx - std::log(total); };
      double smooth = 0;
      for (int c = 0; c < 5; ++c) smooth += -logp(c) / 5;
      expected += (1 - eps) * -logp(static_cast<int>(t[r])) + eps * smooth;
      ++rows;
    }
    EXPECT_NEAR(nn::cross_entropy(logits, targets, eps).item(), expected / rows, 1e-12) << eps;
  }
  EXPECT_THROW(nn::cross_entropy(logits, from_indices({0, 1}, {2})), Error);
}
