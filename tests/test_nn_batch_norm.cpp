// BatchNorm1d / BatchNorm2d: the running-statistics update against a float64 reference,
// evaluation mode, and the once-per-step rule under checkpointing: after k training steps of a
// small ResNet under save-all, every-layer, every-k, selective and a budget, the running
// statistics, the batch counts, the gradients and the parameters are bitwise equal; so are they
// under dynamic: at three budgets and offload:.
#include <gtest/gtest.h>

#include <cmath>

#include "checkpoint_models.h"
#include "remat/nn.h"

using namespace remat;
using remat::testing::bitwise_equal;

namespace {

// x [N, C, S...] as doubles -> per-channel mean and biased / unbiased variance.
void reference_statistics(const Tensor& x, std::vector<double>& mean, std::vector<double>& var_biased,
                          std::vector<double>& var_unbiased) {
  const int64_t n = x.size(0), c = x.size(1), s = x.numel() / (n * c);
  auto v = x.to_vector();
  mean.assign(static_cast<size_t>(c), 0.0);
  var_biased.assign(static_cast<size_t>(c), 0.0);
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < s; ++j) mean[ch] += v[(i * c + ch) * s + j];
    mean[ch] /= static_cast<double>(n * s);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < s; ++j) var_biased[ch] += std::pow(v[(i * c + ch) * s + j] - mean[ch], 2);
  }
  var_unbiased = var_biased;
  for (int64_t ch = 0; ch < c; ++ch) {
    var_biased[ch] /= static_cast<double>(n * s);
    var_unbiased[ch] /= static_cast<double>(n * s - 1);
  }
}

TEST(BatchNorm, RunningStatisticsFollowTheMomentumRule) {
  for (Shape shape : {Shape{4, 3, 2, 5}, Shape{6, 3}, Shape{3, 3, 4}}) {
    SCOPED_TRACE(shape_str(shape));
    std::shared_ptr<nn::BatchNorm> bn;
    if (shape.size() == 4) bn = std::make_shared<nn::BatchNorm2d>(3, 1e-5, 0.25, true, true, DType::f64);
    else bn = std::make_shared<nn::BatchNorm1d>(3, 1e-5, 0.25, true, true, DType::f64);
    std::vector<double> rm(3, 0.0), rv(3, 1.0);
    for (int step = 0; step < 3; ++step) {
      Tensor x = randn(shape, DType::f64, RngState{static_cast<uint64_t>(10 + step), 0}, 0.5, 2.0);
      Tensor y = bn->forward(x);
      std::vector<double> mean, vb, vu;
      reference_statistics(x, mean, vb, vu);
      for (int ch = 0; ch < 3; ++ch) {
        rm[ch] = 0.75 * rm[ch] + 0.25 * mean[ch];
        rv[ch] = 0.75 * rv[ch] + 0.25 * vu[ch];
      }
      auto got_m = bn->running_mean.to_vector(), got_v = bn->running_var.to_vector();
      for (int ch = 0; ch < 3; ++ch) {
        EXPECT_NEAR(got_m[ch], rm[ch], 1e-12) << "step " << step << " channel " << ch;
        EXPECT_NEAR(got_v[ch], rv[ch], 1e-12) << "step " << step << " channel " << ch;
      }
      // the output is normalised with the batch's own (biased) statistics: mean 0, variance ~1
      std::vector<double> ym, yvb, yvu;
      reference_statistics(y, ym, yvb, yvu);
      for (int ch = 0; ch < 3; ++ch) {
        EXPECT_NEAR(ym[ch], 0.0, 1e-12);
        EXPECT_NEAR(yvb[ch], vb[ch] / (vb[ch] + 1e-5), 1e-9);
      }
      EXPECT_EQ(bn->num_batches_tracked(), step + 1);
    }
  }
}

TEST(BatchNorm, EvaluationUsesTheRunningStatisticsAndLeavesThemAlone) {
  nn::BatchNorm2d bn(2, 1e-5, 0.1, true, true, DType::f64);
  bn.running_mean.copy_(from_vector(std::vector<double>{0.5, -1.0}, {2}, DType::f64));
  bn.running_var.copy_(from_vector(std::vector<double>{4.0, 0.25}, {2}, DType::f64));
  bn.weight.detach().copy_(from_vector(std::vector<double>{2.0, 3.0}, {2}, DType::f64));
  bn.bias.detach().copy_(from_vector(std::vector<double>{0.1, 0.2}, {2}, DType::f64));
  bn.eval();
  Tensor x = randn({3, 2, 2, 2}, DType::f64, RngState{5, 0});
  Tensor y = bn.forward(x);
  auto xv = x.to_vector(), yv = y.to_vector();
  const double m[2] = {0.5, -1.0}, v[2] = {4.0, 0.25}, w[2] = {2.0, 3.0}, b[2] = {0.1, 0.2};
  for (size_t i = 0; i < xv.size(); ++i) {
    const int ch = static_cast<int>((i / 4) % 2);
    EXPECT_NEAR(yv[i], (xv[i] - m[ch]) / std::sqrt(v[ch] + 1e-5) * w[ch] + b[ch], 1e-12) << i;
  }
  EXPECT_EQ(bn.running_mean.to_vector(), (std::vector<double>{0.5, -1.0}));
  EXPECT_EQ(bn.running_var.to_vector(), (std::vector<double>{4.0, 0.25}));
  EXPECT_EQ(bn.num_batches_tracked(), 0);
}

TEST(BatchNorm, WithoutRunningStatisticsEvaluationUsesTheBatch) {
  nn::BatchNorm2d bn(2, 1e-5, 0.1, false, false, DType::f64);
  EXPECT_FALSE(bn.running_mean.defined());
  EXPECT_EQ(bn.num_parameters(), 0);
  Tensor x = randn({3, 2, 2, 2}, DType::f64, RngState{5, 0});
  bn.eval();
  Tensor y = bn.forward(x);
  auto mean = sum(y, {0, 2, 3}).to_vector();
  for (double m : mean) EXPECT_NEAR(m, 0.0, 1e-12);
}

TEST(BatchNorm, RejectsBadInputs) {
  nn::BatchNorm2d bn(3);
  auto expect_error = [](const std::function<void()>& f, const std::string& fragment) {
    try {
      f();
      ADD_FAILURE() << "no error (expected one mentioning '" << fragment << "')";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error([&] { bn.forward(zeros({2, 4, 3, 3})); }, "[2, 4, 3, 3]");
  expect_error([&] { bn.forward(zeros({2, 3})); }, "BatchNorm2d(3)");
  expect_error([&] { bn.forward(zeros({1, 3, 1, 1})); }, "more than one value per channel");
  expect_error([] { nn::BatchNorm1d(0); }, "num_features");
  expect_error([] { nn::BatchNorm1d(4, -1.0); }, "eps");
  expect_error([] { nn::BatchNorm1d(4, 1e-5, 1.5); }, "momentum");
  expect_error([] { batch_norm(zeros({2, 3}), Tensor(), Tensor(), Tensor(), Tensor(), false); }, "evaluation mode");
  // the failed calls changed nothing
  EXPECT_EQ(bn.num_batches_tracked(), 0);
  EXPECT_EQ(bn.running_mean.to_vector(), std::vector<double>(3, 0.0));
}

// ---- the once-per-step rule across policies

struct TrainResult {
  std::vector<Tensor> running;        // every BatchNorm's mean and var, in order
  std::vector<int64_t> tracked;       // their batch counts
  std::vector<Tensor> grads, params;  // after the last step
  uint64_t regions_recomputed = 0;    // over all steps
};

nn::ResNetConfig tiny_config() { return {.stages = 2, .blocks_per_stage = 2, .width = 4, .classes = 3, .seed = 3}; }

TrainResult train(const Policy& policy, int steps) {
  auto model = std::make_shared<nn::ResNet>(tiny_config());
  auto data = nn::make_synthetic_images({.count = 8, .classes = 3, .size = 8, .seed = 2});
  nn::SGD opt(model->parameters(), {.lr = 0.05});
  ScopedPolicy scoped(policy);
  TrainResult r;
  reset_counters();
  for (int step = 0; step < steps; ++step) {
    opt.zero_grad();
    // a different batch each step, so the running statistics move
    Tensor x = data.images.slice(0, 4 * (step % 2), 4 * (step % 2) + 4);
    Tensor y = data.labels.slice(0, 4 * (step % 2), 4 * (step % 2) + 4);
    Tensor loss = model->loss(x, y);
    loss.backward();
    if (step + 1 < steps) opt.step();
  }
  r.regions_recomputed = counters().regions_recomputed;
  for (const auto& bn : model->batch_norms()) {
    r.running.push_back(bn->running_mean.clone());
    r.running.push_back(bn->running_var.clone());
    r.tracked.push_back(bn->num_batches_tracked());
  }
  for (const auto& p : model->parameters()) {
    r.params.push_back(p.detach().clone());
    r.grads.push_back(p.grad());
  }
  return r;
}

size_t peak_saved(const Policy& policy) {
  auto model = std::make_shared<nn::ResNet>(tiny_config());
  auto data = nn::make_synthetic_images({.count = 4, .classes = 3, .size = 8, .seed = 2});
  ScopedPolicy scoped(policy);
  memory::reset_peaks();
  const size_t base = memory::live_bytes(memory::Tag::saved);
  model->loss(data.images, data.labels).backward();
  return memory::peak_bytes(memory::Tag::saved) - base;
}

TEST(BatchNormPolicies, RunningStatisticsAndGradientsAreBitwiseEqualUnderEveryPolicy) {
  const int steps = 4;  // budget: 2 profiling steps, then the plan
  const TrainResult reference = train(Policy::save_all(), steps);
  EXPECT_EQ(reference.regions_recomputed, 0u);
  const size_t sa = peak_saved(Policy::save_all()), el = peak_saved(Policy::every_layer());
  ASSERT_LT(el, sa);
  for (const Policy& policy : {Policy::every_layer(), Policy::every_k(2), Policy::selective({"conv2d"}),
                               Policy::budget((sa + el) / 2)}) {
    SCOPED_TRACE(policy.to_string());
    const TrainResult r = train(policy, steps);
    EXPECT_GT(r.regions_recomputed, 0u) << "the policy recomputed nothing; the test would prove nothing";
    ASSERT_EQ(r.running.size(), reference.running.size());
    for (size_t i = 0; i < r.running.size(); ++i)
      EXPECT_TRUE(bitwise_equal(r.running[i], reference.running[i])) << "running statistic " << i;
    for (size_t i = 0; i < r.tracked.size(); ++i) EXPECT_EQ(r.tracked[i], steps) << "BatchNorm " << i;
    ASSERT_EQ(r.grads.size(), reference.grads.size());
    for (size_t i = 0; i < r.grads.size(); ++i) {
      EXPECT_TRUE(bitwise_equal(r.grads[i], reference.grads[i])) << "gradient " << i;
      EXPECT_TRUE(bitwise_equal(r.params[i], reference.params[i])) << "parameter " << i;
    }
  }
}

// The batch_norm op itself, given its running statistics on every call (recomputation included),
// updates them once: the update is the op's side effect, which no recomputation repeats. Without
// that rule every-layer would update them twice per step (the check above would catch it).
TEST(BatchNormPolicies, TheOpSkipsItsUpdateWhenRecomputedWhateverItIsGiven) {
  auto run = [](const Policy& policy) {
    Tensor rm = zeros({2}, DType::f64), rv = ones({2}, DType::f64);
    Tensor w = ones({2}, DType::f64).requires_grad_();
    Chain chain;
    chain.add([&](const Tensor& h) { return relu(batch_norm(h, w, Tensor(), rm, rv, true)); });
    chain.add([](const Tensor& h) { return mul(h, h); });
    ScopedPolicy scoped(policy);
    reset_counters();
    Tensor x = randn({4, 2, 3}, DType::f64, RngState{9, 0});
    sum(chain.forward(x)).backward();
    return std::make_pair(rm.clone(), counters().regions_recomputed);
  };
  const auto every_layer = run(Policy::every_layer());
  EXPECT_GT(every_layer.second, 0u);
  EXPECT_TRUE(bitwise_equal(every_layer.first, run(Policy::save_all()).first));
}

}  // namespace

// ---- dynamic: and offload: (every op's forward may run again, not only a layer's)

namespace {

struct StatsAndGrads {
  std::vector<Tensor> running, grads;
  uint64_t rematerializations = 0;
  size_t smallest_feasible = 0, peak_saved = 0;
};

std::shared_ptr<nn::Sequential> linear_batch_norm_model() {
  manual_seed(5);
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Linear>(6, 12)).add(std::make_shared<nn::BatchNorm1d>(12));
  m->add(std::make_shared<nn::ReLU>()).add(std::make_shared<nn::Linear>(12, 12));
  m->add(std::make_shared<nn::BatchNorm1d>(12)).add(std::make_shared<nn::Tanh>());
  m->add(std::make_shared<nn::Linear>(12, 12)).add(std::make_shared<nn::BatchNorm1d>(12));
  m->add(std::make_shared<nn::ReLU>()).add(std::make_shared<nn::Linear>(12, 3));
  return m;
}

// Two steps of the Linear + BatchNorm1d model (or the tiny ResNet) under `policy`.
StatsAndGrads run_stateful(const Policy& policy, bool resnet) {
  std::shared_ptr<nn::Module> model;
  std::vector<std::shared_ptr<nn::BatchNorm>> norms;
  if (resnet) {
    auto r = std::make_shared<nn::ResNet>(tiny_config());
    norms = r->batch_norms();
    model = r;
  } else {
    auto s = linear_batch_norm_model();
    for (const auto& [name, child] : s->named_children())
      if (auto bn = std::dynamic_pointer_cast<nn::BatchNorm>(child)) norms.push_back(bn);
    model = s;
  }
  auto data = nn::make_synthetic_images({.count = 8, .classes = 3, .size = 8, .seed = 2});
  Tensor features = randn({8, 6}, DType::f32, RngState{4, 0});
  StatsAndGrads r;
  ScopedPolicy scoped(policy);
  reset_counters();
  memory::reset_peaks();
  const size_t base = memory::live_bytes(memory::Tag::saved);
  for (int step = 0; step < 2; ++step) {
    model->zero_grad();
    Tensor loss = resnet ? std::static_pointer_cast<nn::ResNet>(model)->loss(data.images, data.labels)
                         : sum(square(model->forward(features)));
    loss.backward();
  }
  r.peak_saved = memory::peak_bytes(memory::Tag::saved) - base;
  r.rematerializations = counters().dynamic.rematerializations;
  r.smallest_feasible = counters().dynamic.smallest_feasible_bytes;
  for (const auto& bn : norms) {
    r.running.push_back(bn->running_mean.clone());
    r.running.push_back(bn->running_var.clone());
  }
  for (const auto& p : model->parameters()) r.grads.push_back(p.grad());
  return r;
}

void expect_same(const StatsAndGrads& r, const StatsAndGrads& reference) {
  ASSERT_EQ(r.running.size(), reference.running.size());
  ASSERT_FALSE(r.running.empty());
  for (size_t i = 0; i < r.running.size(); ++i)
    EXPECT_TRUE(bitwise_equal(r.running[i], reference.running[i])) << "running statistic " << i;
  ASSERT_EQ(r.grads.size(), reference.grads.size());
  for (size_t i = 0; i < r.grads.size(); ++i) EXPECT_TRUE(bitwise_equal(r.grads[i], reference.grads[i])) << "gradient " << i;
}

}  // namespace

TEST(BatchNormPolicies, DynamicAtThreeBudgetsAndOffloadUpdateTheRunningStatisticsOnce) {
  for (bool resnet : {false, true}) {
    SCOPED_TRACE(resnet ? "ResNet" : "Linear + BatchNorm1d");
    const StatsAndGrads reference = run_stateful(Policy::save_all(), resnet);
    // the smallest feasible budget: raised to the need each failed try reports
    size_t smallest = run_stateful(Policy::dynamic(size_t{1} << 40), resnet).smallest_feasible;
    for (int attempt = 0; attempt < 20; ++attempt) {
      try {
        run_stateful(Policy::dynamic(smallest), resnet);
        break;
      } catch (const Error&) {
        ASSERT_GT(counters().dynamic.smallest_feasible_bytes, smallest);
        smallest = counters().dynamic.smallest_feasible_bytes;
      }
    }
    ASSERT_LT(smallest, reference.peak_saved);
    const size_t gap = reference.peak_saved - smallest;
    for (size_t budget : {smallest, smallest + gap / 3, smallest + 2 * gap / 3}) {
      SCOPED_TRACE("dynamic:" + std::to_string(budget));
      const StatsAndGrads r = run_stateful(Policy::dynamic(budget), resnet);
      EXPECT_GT(r.rematerializations, 0u) << "nothing was recomputed; the test would prove nothing";
      expect_same(r, reference);
    }
    const std::string dir = ::testing::TempDir();
    SCOPED_TRACE("offload");
    expect_same(run_stateful(Policy::offload(dir, 0), resnet), reference);
  }
}
