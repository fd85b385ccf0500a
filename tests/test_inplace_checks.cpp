// A value modified in place between the forward and the backward pass: save-all raises (a value
// saved for the backward pass was overwritten), so every recomputing policy must raise too, never
// recompute silently from the new values: regions, every-k segments, budget plans, scan loops.
#include <gtest/gtest.h>

#include "module_models.h"
#include "remat/scan.h"

using namespace remat;
using remat::testing::LoopModel;
using remat::testing::module_grads;
using remat::testing::bitwise_equal;

namespace {

// Runs forward under `policy`, overwrites `victim` in place, runs backward; returns the error.
std::string error_after_overwrite(nn::Module& model, const Tensor& x, const Policy& policy, Tensor victim) {
  model.zero_grad();
  Tensor loss;
  {
    ScopedPolicy scope(policy);
    loss = mean(model.forward(x));
  }
  {
    NoGradGuard no_grad;
    victim.copy_(mul_scalar(victim, 1.5));  // what a careless optimizer step would do
  }
  try {
    ScopedPolicy scope(policy);
    loss.backward();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(InPlaceChecks, ACapturedParameterOverwrittenIsAnErrorUnderEveryPolicy) {
  LoopModel model(6, 8, DType::f64, 3, /*residual=*/true);
  Tensor x = randn({4, 8}, DType::f64, RngState{1, 0});
  for (const char* p : {"save-all", "every-layer", "every-k:2", "every-k:4", "selective:matmul"}) {
    SCOPED_TRACE(p);
    Tensor w = model.parameter("layer3.fc.weight");
    std::string error = error_after_overwrite(model, x, Policy::parse(p), w);
    EXPECT_NE(error.find("modified in place"), std::string::npos) << "no error, or another: '" << error << "'";
  }
  // under a budget plan with regions (after the profiling steps)
  const size_t every_layer = remat::testing::measure_step(model, x, Policy::every_layer()).peak_saved;
  const Policy budget = Policy::budget(every_layer + every_layer / 4);
  for (int i = 0; i < BudgetPlanner::kProfilingSteps; ++i) remat::testing::measure_step(model, x, budget);
  std::string error = error_after_overwrite(model, x, budget, model.parameter("layer1.fc.weight"));
  EXPECT_NE(error.find("modified in place"), std::string::npos) << error;
  ASSERT_TRUE(model.planner()->report().has_value());
  EXPECT_NE(model.planner()->report()->tree.find('R'), std::string::npos) << model.planner()->report()->tree;
}

TEST(InPlaceChecks, ACapturedConstantThatNoOpSavesIsStillChecked) {
  // c enters through add (which keeps nothing): save-all's gradient does not depend on it, but a
  // region recomputing tanh(h + c) from a new c would be wrong, so the region raises.
  Tensor c = randn({5}, DType::f64, RngState{2, 0});
  Tensor w = randn({5, 5}, DType::f64, RngState{3, 0}).requires_grad_();
  Tensor x = randn({3, 5}, DType::f64, RngState{4, 0});
  Tensor loss = sum(checkpoint([&](const Tensor& h) { return tanh(add(matmul(h, w), c)); }, x, {Policy::every_layer()}));
  {
    NoGradGuard no_grad;
    c.fill_(0.25);
  }
  try {
    loss.backward();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("modified in place"), std::string::npos) << e.what();
  }
}

TEST(InPlaceChecks, ARegionInputOverwrittenIsAnError) {
  Tensor w = randn({4, 4}, DType::f64, RngState{3, 0}).requires_grad_();
  Tensor x = randn({2, 4}, DType::f64, RngState{4, 0});
  Tensor loss = sum(checkpoint([&](const Tensor& h) { return tanh(matmul(h, w)); }, x, {Policy::every_layer()}));
  {
    NoGradGuard no_grad;
    x.fill_(1.0);
  }
  EXPECT_THROW(loss.backward(), Error);
}

TEST(InPlaceChecks, ScanAndWhileLoopCheckWhatTheirStepsRead) {
  Tensor w = randn({4, 4}, DType::f64, RngState{5, 0}, 0.0, 0.3).requires_grad_();
  Tensor c = randn({4}, DType::f64, RngState{6, 0});
  Tensor s0 = randn({2, 4}, DType::f64, RngState{7, 0}).requires_grad_();
  ScanStep step = [&](const Tensor& s, int64_t) { return tanh(add(matmul(s, w), c)); };
  for (ScanSchedule schedule : {ScanSchedule::revolve, ScanSchedule::online}) {
    SCOPED_TRACE(static_cast<int>(schedule));
    ScanOptions options;
    options.schedule = schedule;
    options.snapshots = 2;
    Tensor out = schedule == ScanSchedule::revolve
                     ? scan(step, s0, 10, options)
                     : while_loop([](const Tensor&, int64_t t) { return t < 10; }, step, s0, options);
    Tensor loss = sum(out);
    Tensor saved_c = c.clone();
    {
      NoGradGuard no_grad;
      c.fill_(2.0);
    }
    try {
      loss.backward();
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("modified in place"), std::string::npos) << e.what();
    }
    NoGradGuard no_grad;
    c.copy_(saved_c);
  }
}

TEST(InPlaceChecks, WithoutOverwritesNothingIsReported) {
  LoopModel model(4, 6, DType::f64, 3, /*residual=*/true);
  Tensor x = randn({2, 6}, DType::f64, RngState{1, 0}).requires_grad_();
  TensorList reference = module_grads(model, x, Policy::save_all());
  for (const char* p : {"every-layer", "every-k:3", "selective:matmul"}) {
    TensorList got = module_grads(model, x, Policy::parse(p));
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bitwise_equal(got[i], reference[i])) << p;
  }
}
