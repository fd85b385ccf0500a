// Recomputation checks itself: a region's recomputed outputs are compared bit for bit with a
// digest of its first run's, and a difference is a remat::Error naming the layer and the usual
// causes. A layer that reads a scalar changed between forward and backward, one with a private
// generator, and dropout switched to eval() between the passes are caught under every-layer; under
// save-all (nothing recomputed) the first two still give save-all's gradient. The check can be
// turned off, and then the gradient silently differs (so the check is what catches it).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>

#include "checkpoint_models.h"
#include "autodiff/digest.h"
#include "remat/nn.h"

using namespace remat;
using remat::testing::bitwise_equal;

namespace {

// Linear -> "scaled" (tanh of the input times *scale, read when the layer runs) -> Linear. The
// tanh keeps its output for its backward, so the recomputation runs both ops (a layer whose ops
// the backward does not read is not recomputed at all: test_dead_ops.cpp).
std::shared_ptr<nn::Sequential> scaled_model(const double* scale) {
  manual_seed(3);
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Linear>(4, 8));
  m->add(std::make_shared<nn::Lambda>([scale](const Tensor& h) { return tanh(mul_scalar(h, *scale)); }), "scaled");
  m->add(std::make_shared<nn::Linear>(8, 2));
  return m;
}

// One step; the scale changes between the forward and the backward pass.
TensorList step_with_changing_scale(const Policy& policy) {
  double scale = 1.5;
  auto model = scaled_model(&scale);
  ScopedPolicy scoped(policy);
  Tensor loss = sum(square(model->forward(randn({3, 4}, DType::f32, RngState{7, 0}))));
  scale = 2.5;
  loss.backward();
  TensorList grads;
  for (const auto& p : model->parameters()) grads.push_back(p.grad());
  return grads;
}

}  // namespace

TEST(RecomputeCheck, ACapturedScalarChangedBeforeTheBackwardIsAnErrorNamingTheLayer) {
  try {
    step_with_changing_scale(Policy::every_layer());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'scaled'"), std::string::npos) << what;
    EXPECT_NE(what.find("first run"), std::string::npos) << what;
    EXPECT_NE(what.find("captured"), std::string::npos) << what;
    EXPECT_NE(what.find("eval()"), std::string::npos) << what;
  }
}

TEST(RecomputeCheck, UnderSaveAllTheChangingScalarStillGivesSaveAllsGradient) {
  const TensorList a = step_with_changing_scale(Policy::save_all());
  // save-all's gradient is the one of the first run's scale: the same as a step that never changes it
  double scale = 1.5;
  auto model = scaled_model(&scale);
  ScopedPolicy scoped(Policy::save_all());
  sum(square(model->forward(randn({3, 4}, DType::f32, RngState{7, 0})))).backward();
  const TensorList params = model->parameters();
  ASSERT_EQ(a.size(), params.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bitwise_equal(a[i], params[i].grad())) << "parameter " << i;
}

TEST(RecomputeCheck, APrivateGeneratorIsCaught) {
  std::mt19937 private_rng(1);
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Linear>(4, 4));
  model->add(std::make_shared<nn::Lambda>([&private_rng](const Tensor& h) {
               return tanh(add_scalar(h, static_cast<double>(private_rng() % 1000) / 1000.0));
             }),
             "jitter");
  model->add(std::make_shared<nn::Linear>(4, 1));
  ScopedPolicy scoped(Policy::every_layer());
  Tensor loss = sum(model->forward(randn({2, 4}, DType::f32, RngState{2, 0})));
  try {
    loss.backward();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'jitter'"), std::string::npos) << e.what();
  }
}

TEST(RecomputeCheck, EvalSwitchedBetweenForwardAndBackwardIsCaught) {
  manual_seed(4);
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Linear>(16, 16));
  model->add(std::make_shared<nn::Dropout>(0.5), "drop");
  model->add(std::make_shared<nn::Linear>(16, 1));
  ScopedPolicy scoped(Policy::every_layer());
  Tensor loss = sum(model->forward(randn({4, 16}, DType::f32, RngState{2, 0})));
  model->eval();
  try {
    loss.backward();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'drop'"), std::string::npos) << e.what();
  }
}

TEST(RecomputeCheck, TurnedOffTheDifferenceGoesUnnoticed) {
  set_recomputation_check(false);
  TensorList off;
  EXPECT_NO_THROW(off = step_with_changing_scale(Policy::every_layer()));
  set_recomputation_check(true);
  EXPECT_TRUE(recomputation_check());
  const TensorList save_all = step_with_changing_scale(Policy::save_all());
  ASSERT_EQ(off.size(), save_all.size());
  bool all_equal = true;
  for (size_t i = 0; i < off.size(); ++i) all_equal = all_equal && bitwise_equal(off[i], save_all[i]);
  EXPECT_FALSE(all_equal) << "without the check the recomputed gradient differs silently";
}

// ---- dynamic: rematerialization

namespace {

// x -> a = 2x (held by the program) -> tanh -> tanh -> tanh -> sum, under a budget that makes
// dynamic: evict the tanh outputs and recompute them (the first from a). `between` runs between
// the forward and the backward pass. Returns the error, or "" when there was none.
std::string dynamic_chain(const std::function<void(Tensor&)>& between, const Policy& policy, uint64_t* remats) {
  Tensor x = randn({256}, DType::f64, RngState{5, 0}).requires_grad_();
  ScopedPolicy scoped(policy);
  reset_counters();
  Tensor a = mul_scalar(x, 2.0);
  Tensor h = a;
  for (int i = 0; i < 6; ++i) h = tanh(h);
  Tensor loss = sum(h);
  between(a);
  try {
    loss.backward();
  } catch (const Error& e) {
    return e.what();
  }
  if (remats) *remats = counters().dynamic.rematerializations;
  return "";
}

}  // namespace

TEST(DynamicChecks, AnIntermediateChangedInPlaceIsAnErrorWhenRematerializedFrom) {
  uint64_t remats = 0;
  // unchanged: the budget recomputes (so the check below has something to check) and all is well
  EXPECT_EQ(dynamic_chain([](Tensor&) {}, Policy::dynamic(3 * 2048), &remats), "");
  EXPECT_GT(remats, 0u);
  const std::string error = dynamic_chain(
      [](Tensor& a) {
        NoGradGuard no_grad;
        a.copy_(mul_scalar(a, 1.5));
      },
      Policy::dynamic(3 * 2048), nullptr);
  EXPECT_NE(error.find("modified in place"), std::string::npos) << "no error, or another: '" << error << "'";
  // save-all keeps the tanh outputs, never recomputes, and needs no error
  EXPECT_EQ(dynamic_chain(
                [](Tensor& a) {
                  NoGradGuard no_grad;
                  a.copy_(mul_scalar(a, 1.5));
                },
                Policy::save_all(), nullptr),
            "");
}

TEST(DynamicChecks, ARematerializedValueThatDiffersIsAnErrorNamingTheOp) {
  double scale = 1.0;
  CustomOp scaled{"scaled",
                  [&scale](const TensorList& in, SaveContext& ctx) {
                    Tensor y = mul_scalar(in[0], scale);
                    ctx.save(y);
                    return TensorList{y};
                  },
                  [&scale](const TensorList& grads, const SavedValues&) {
                    return TensorList{mul_scalar(grads[0], scale)};
                  }};
  Tensor x = randn({256}, DType::f64, RngState{5, 0}).requires_grad_();
  ScopedPolicy scoped(Policy::dynamic(5 * 2048));
  reset_counters();
  Tensor h = tanh(x);
  for (int i = 0; i < 4; ++i) h = tanh(scaled({tanh(h)})[0]);
  Tensor loss = sum(h);
  scale = 3.0;
  try {
    loss.backward();
    ADD_FAILURE() << "no error; rematerializations: " << counters().dynamic.rematerializations;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("custom:scaled"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("first run"), std::string::npos) << e.what();
  }
}

// The digest the check compares depends on the values only: a transposed view (strided, gathered
// block by block) digests as its contiguous copy does, at one thread as at two, and one flipped
// bit anywhere in a value of many blocks changes it.
TEST(RecomputeDigest, DependsOnTheValuesNotOnLayoutOrThreadsAndSeesOneBit) {
  NoGradGuard no_grad;
  Tensor x = randn({300, 257}, DType::f32, RngState{11, 0});  // 308,400 bytes: five 64 KiB blocks
  Tensor view = x.transpose(0, 1);
  ASSERT_FALSE(view.is_contiguous());
  Tensor copy = view.contiguous();
  const uint64_t digest = detail::recompute_digest(copy).value();
  EXPECT_EQ(detail::recompute_digest(view).value(), digest);
  const int threads = num_threads();
  set_num_threads(1);
  const uint64_t one_thread = detail::recompute_digest(view).value();
  set_num_threads(threads);
  EXPECT_EQ(one_thread, digest);
  for (int64_t at : {int64_t{0}, int64_t{40000}, copy.numel() - 1}) {
    Tensor flipped = copy.clone();
    float* value = flipped.data<float>() + at;
    uint32_t bits;
    std::memcpy(&bits, value, sizeof bits);
    bits ^= 1u;  // the lowest mantissa bit
    std::memcpy(value, &bits, sizeof bits);
    EXPECT_NE(detail::recompute_digest(flipped).value(), digest) << "bit flipped at element " << at;
  }
  EXPECT_NE(detail::recompute_digest(x).value(), digest);  // the same values in another order
}
