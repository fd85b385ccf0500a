// Recomputation checks itself: a region's recomputed outputs are compared bit for bit with a
// digest of its first run's, and a difference is a remat::Error naming the layer and the usual
// causes. A recomputation runs ops again, never a layer's code: state that a layer's code reads
// (a scalar changed between forward and backward, a private generator, dropout switched to
// eval()) changes nothing, and the gradient is save-all's; an op whose own forward reads such
// state (a custom op) is caught. The check can be turned off, and then the gradient silently
// differs (so the check is what catches it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>

#include "module_models.h"
#include "autodiff/digest.h"
#include "emulated_backend.h"
#include "remat/nn.h"

using namespace remat;
using remat::testing::bitwise_equal;
using remat::testing::scaled_model;

namespace {

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

// A private generator drawn in a layer's own code: its draw is an argument of the op it feeds, which
// a recomputation runs again as its first run called it, so the gradient is save-all's.
TEST(RecomputeCheck, APrivateGeneratorInALayersCodeGivesSaveAllsGradient) {
  auto run = [](const Policy& policy) {
    std::mt19937 private_rng(1);
    auto model = std::make_shared<nn::Sequential>();
    model->add(std::make_shared<nn::Linear>(4, 4));
    model->add(std::make_shared<nn::Lambda>([&private_rng](const Tensor& h) {
                 return tanh(add_scalar(h, static_cast<double>(private_rng() % 1000) / 1000.0));
               }),
               "jitter");
    model->add(std::make_shared<nn::Linear>(4, 1));
    model->reset_parameters(5);
    ScopedPolicy scoped(policy);
    sum(model->forward(randn({2, 4}, DType::f32, RngState{2, 0}))).backward();
    TensorList grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad());
    return grads;
  };
  const TensorList save_all = run(Policy::save_all()), every_layer = run(Policy::every_layer());
  ASSERT_EQ(every_layer.size(), save_all.size());
  for (size_t i = 0; i < save_all.size(); ++i) EXPECT_TRUE(bitwise_equal(every_layer[i], save_all[i])) << i;
}

// A private generator drawn in an op's own forward (a custom op): the recomputation runs that
// forward again, draws another value, and is caught, naming the layer.
TEST(RecomputeCheck, APrivateGeneratorInAnOpsForwardIsCaught) {
  std::mt19937 private_rng(1);
  CustomOp jitter{"jitter",
                  [&private_rng](const TensorList& in, SaveContext& ctx) {
                    Tensor y = tanh(add_scalar(in[0], static_cast<double>(private_rng() % 1000) / 1000.0));
                    ctx.save(y);
                    return TensorList{y};
                  },
                  [](const TensorList& grads, const SavedValues& saved) {
                    return TensorList{mul(grads[0], add_scalar(neg(square(saved[0])), 1.0))};
                  }};
  auto model = std::make_shared<nn::Sequential>();
  model->add(std::make_shared<nn::Linear>(4, 4));
  model->add(std::make_shared<nn::Lambda>([&jitter](const Tensor& h) { return jitter({h})[0]; }), "jitter");
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

// Dropout switched to eval() between the passes: the layer's code does not run again (its mask is
// the first run's op's), so the gradient is save-all's.
TEST(RecomputeCheck, EvalSwitchedBetweenForwardAndBackwardChangesNothing) {
  auto run = [](const Policy& policy) {
    manual_seed(4);
    auto model = std::make_shared<nn::Sequential>();
    model->add(std::make_shared<nn::Linear>(16, 16));
    model->add(std::make_shared<nn::Dropout>(0.5), "drop");
    model->add(std::make_shared<nn::Linear>(16, 1));
    ScopedPolicy scoped(policy);
    Tensor loss = sum(model->forward(randn({4, 16}, DType::f32, RngState{2, 0})));
    model->eval();
    loss.backward();
    TensorList grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad());
    return grads;
  };
  const TensorList save_all = run(Policy::save_all()), every_layer = run(Policy::every_layer());
  ASSERT_EQ(every_layer.size(), save_all.size());
  for (size_t i = 0; i < save_all.size(); ++i) EXPECT_TRUE(bitwise_equal(every_layer[i], save_all[i])) << i;
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

// ---- the digest kernel of each backend (remat/backend.h, src/tensor/digest_formula.h)

namespace {

// The digest's definition, restated plainly (one thread, one byte at a time): 64 KiB blocks of the
// logical byte stream, eight lanes over each block's 8-byte words, lanes, tail and size mixed, the
// blocks chained in order after the stream's length.
uint64_t reference_digest(const Tensor& t) {
  const uint64_t kMul = 0x9E3779B97F4A7C15ull;
  auto mix = [&](uint64_t h, uint64_t w) {
    h ^= w * kMul;
    h = (h << 29) | (h >> 35);
    return h * 0xBF58476D1CE4E5B9ull;
  };
  Tensor c = t.to(kCpu).contiguous();
  const auto* bytes = static_cast<const unsigned char*>(c.raw_data());
  const int64_t n = static_cast<int64_t>(c.nbytes());
  uint64_t h = mix(0, static_cast<uint64_t>(n));
  for (int64_t begin = 0, block = 0; begin < n; begin += 65536, ++block) {
    const int64_t size = std::min<int64_t>(65536, n - begin);
    const unsigned char* p = bytes + begin;
    uint64_t lane[8];
    for (int k = 0; k < 8; ++k) lane[k] = static_cast<uint64_t>(block) ^ static_cast<uint64_t>(k);
    int64_t i = 0;
    for (; i + 64 <= size; i += 64)
      for (int k = 0; k < 8; ++k) {
        uint64_t w = 0;
        for (int j = 7; j >= 0; --j) w = (w << 8) | p[i + 8 * k + j];
        const uint64_t x = (lane[k] ^ w) * kMul;
        lane[k] = (x << 31) | (x >> 33);
      }
    uint64_t out = lane[0];
    for (int k = 1; k < 8; ++k) out = mix(out, lane[k]);
    for (; i < size; ++i) out = mix(out, p[i]);
    h = mix(h, mix(out, static_cast<uint64_t>(size)));
  }
  return h;
}

// Values of many sizes (empty, a tail only, block edges, several blocks), dtypes and layouts
// (contiguous, transposed, sliced with a step and an odd offset, broadcast with stride 0).
TensorList digest_cases(Device device) {
  TensorList cases;
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{16}, int64_t{16383}, int64_t{16384}, int64_t{16385},
                    int64_t{50001}})
    cases.push_back(randn({n}, DType::f32, RngState{static_cast<uint64_t>(n), 1}).to(device));
  Tensor m = randn({97, 300}, DType::f64, RngState{3, 3}).to(device);
  cases.push_back(m);
  cases.push_back(m.transpose(0, 1));
  cases.push_back(m.slice(1, 1, 300, 3));
  cases.push_back(randn({1, 513}, DType::f32, RngState{4, 4}).to(device).expand({40, 513}));
  cases.push_back(arange(0.0, 9000.0, 1.0, DType::i64, device));
  return cases;
}

}  // namespace

TEST(DigestKernel, TheCpusKernelIsTheDefinitionForEverySizeDtypeAndLayout) {
  NoGradGuard no_grad;
  for (const Tensor& t : digest_cases(kCpu))
    EXPECT_EQ(detail::recompute_digest(t).value(), reference_digest(t))
        << dtype_name(t.dtype()) << " " << shape_str(t.shape()) << (t.is_contiguous() ? "" : " (strided)");
}

// The emulated device digests with its own kernel, on its memory, and gives the CPU's digest; a
// device that lacks the kernel is not checked at all (no value is copied to the host for it).
TEST(DigestKernel, TheEmulatedDeviceDigestsOnTheDeviceAsTheCpuDoes) {
  NoGradGuard no_grad;
  remat::testing::EmulatedDevice dev(3);
  const TensorList on_cpu = digest_cases(kCpu);
  const TensorList on_device = digest_cases(dev.device);
  const uint64_t to_host = dev.backend.device_to_host, fallbacks = fallback_calls(dev.device);
  for (size_t i = 0; i < on_cpu.size(); ++i)
    EXPECT_EQ(detail::recompute_digest(on_device[i]).value(), detail::recompute_digest(on_cpu[i]).value()) << "case " << i;
  EXPECT_EQ(dev.backend.device_to_host - to_host, on_cpu.size()) << "only the digests (8 bytes each) leave the device";
  EXPECT_EQ(fallback_calls(dev.device), fallbacks);
  dev.backend.refuse_all_dtypes(Kernel::digest);
  EXPECT_FALSE(detail::recompute_digest(on_device[3]).has_value());
  EXPECT_EQ(fallback_calls(dev.device), fallbacks);
}

// The region's recomputation check on a device: the changed captured scalar is caught there as on
// the CPU, with the same error (on the CPU it stops the node that read the value, which the message
// names first; a device's comparison is read at the end of the backward pass).
TEST(RecomputeCheck, OnTheEmulatedDeviceACapturedScalarChangedIsCaughtAsOnTheCpu) {
  remat::testing::EmulatedDevice dev(4);
  const std::string on_cpu = remat::testing::captured_scalar_error(kCpu);
  ASSERT_NE(on_cpu.find("'scaled'"), std::string::npos) << on_cpu;
  const std::string on_device = remat::testing::captured_scalar_error(dev.device);
  ASSERT_FALSE(on_device.empty());
  EXPECT_EQ(on_cpu.substr(on_cpu.size() - std::min(on_cpu.size(), on_device.size())), on_device);
}

// On a device the comparisons are read at the end of the backward pass, all at once (Note [device
// digests are read once a backward pass]): the mismatch is still raised before any gradient is
// committed, with the CPU's message, after one wait.
TEST(RecomputeCheck, OnTheEmulatedDeviceAMismatchIsReadOnceAndCommitsNothing) {
  remat::testing::EmulatedDevice dev(4);
  double scale = 1.5;
  auto model = remat::testing::scaled_model(&scale);
  model->to(dev.device);
  ScopedPolicy scoped(Policy::every_layer());
  const Tensor x = randn({3, 4}, DType::f32, RngState{7, 0}).to(dev.device);
  sum(square(model->forward(x))).backward();  // a clean step: gradients to compare with
  std::vector<std::vector<double>> before;
  for (const Tensor& p : model->parameters()) before.push_back(p.grad().to(kCpu).to_vector());
  Tensor loss = sum(square(model->forward(x)));
  scale = 2.5;
  const uint64_t waits = device_activity(dev.device).host_synchronizations;
  try {
    loss.backward();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'scaled'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(device_activity(dev.device).host_synchronizations - waits, 1u) << "the digests were read one at a time";
  size_t i = 0;
  for (const Tensor& p : model->parameters()) EXPECT_EQ(p.grad().to(kCpu).to_vector(), before[i++]) << "a gradient was committed";
}

// ---- every policy that recomputes checks what it recomputes

namespace {

// Four impurities on a model of five layers (so that every-k groups and budget plans have several
// calls to group), striking between the forward and the backward pass: three in a layer's own code
// (a captured scalar changed, a private generator, dropout switched to eval()), which no
// recomputation runs again, and one in an op's own forward (a custom op reading the changed
// scalar), which every recomputation of that op runs again.
enum class Impurity { captured_scalar, private_generator, eval_switch, op_forward };

std::shared_ptr<nn::Sequential> impure_model(Impurity impurity, double* scale, std::mt19937* private_rng) {
  manual_seed(8);
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Linear>(6, 6));
  m->add(std::make_shared<nn::Linear>(6, 6));
  switch (impurity) {
    case Impurity::captured_scalar:
      m->add(std::make_shared<nn::Lambda>([scale](const Tensor& h) { return tanh(mul_scalar(h, *scale)); }), "impure");
      break;
    case Impurity::private_generator:
      m->add(std::make_shared<nn::Lambda>([private_rng](const Tensor& h) {
               return tanh(add_scalar(h, static_cast<double>((*private_rng)() % 1000) / 1000.0));
             }),
             "impure");
      break;
    case Impurity::eval_switch: m->add(std::make_shared<nn::Dropout>(0.5), "impure"); break;
    case Impurity::op_forward:
      m->add(std::make_shared<nn::Lambda>([op = remat::testing::scaled_tanh(scale)](const Tensor& h) { return op({h})[0]; }),
             "impure");
      break;
  }
  m->add(std::make_shared<nn::Linear>(6, 6));
  m->add(std::make_shared<nn::Linear>(6, 1));
  return m;
}

struct ImpureRun {
  std::string error;
  TensorList grads;
};

// A step of `policy` (after its profiling steps, for a budget) in which the impurity strikes between
// the forward and the backward pass.
ImpureRun impure_step(Impurity impurity, const Policy& policy) {
  double scale = 1.5;
  std::mt19937 private_rng(1);
  auto model = impure_model(impurity, &scale, &private_rng);
  const Tensor x = randn({8, 6}, DType::f32, RngState{2, 0});
  ScopedPolicy scoped(policy);
  ImpureRun run;
  try {
    const int steps = policy.keep.kind == Policy::Kind::budget ? BudgetPlanner::kProfilingSteps + 1 : 1;
    for (int s = 0; s < steps; ++s) {
      model->train();
      model->zero_grad();
      scale = 1.5;
      private_rng.seed(1);  // every step's forward the same (the impurity strikes after it)
      manual_seed(9);
      Tensor loss = sum(square(model->forward(x)));
      if (s + 1 < steps) {
        loss.backward();
        continue;
      }
      scale = 2.5;
      model->eval();
      if (impurity != Impurity::eval_switch) model->train();
      loss.backward();
      for (const auto& p : model->parameters()) run.grads.push_back(p.grad());
    }
  } catch (const Error& e) {
    run.error = e.what();
  }
  return run;
}

}  // namespace

// An impurity in a layer's own code changes nothing under any policy: the gradient is save-all's.
// One in an op's forward is caught by every policy that runs that op again (every-k, selective, a
// budget plan, every-layer+offload), naming the layer; dynamic: and offload give save-all's gradient
// or the error (offload runs nothing again; dynamic: runs an op again only when it evicted a value).
TEST(RecomputeCheck, EveryRecomputingPolicyCatchesTheImpuritiesOrGivesSaveAllsGradient) {
  for (Impurity impurity : {Impurity::captured_scalar, Impurity::private_generator, Impurity::eval_switch,
                            Impurity::op_forward}) {
    const ImpureRun save_all = impure_step(impurity, Policy::save_all());
    ASSERT_EQ(save_all.error, "");
    size_t planned_budget = 0;
    {
      double scale = 1.5;
      std::mt19937 rng(1);
      // (a private generator is impure on every step: its profile is the captured scalar's model's)
      auto probe = impure_model(impurity == Impurity::private_generator ? Impurity::captured_scalar : impurity, &scale, &rng);
      ScopedPolicy scoped(Policy::budget(size_t{1} << 40));
      for (int s = 0; s < BudgetPlanner::kProfilingSteps; ++s) sum(square(probe->forward(randn({8, 6})))).backward();
      planned_budget = probe->planner()->feasible_range().value().smallest_budget_bytes;
    }
    const bool in_op = impurity == Impurity::op_forward;
    const std::vector<std::pair<Policy, bool>> policies{
        {Policy::parse("every-k:2"), in_op},
        {Policy::parse("selective:matmul"), in_op},
        {Policy::budget(planned_budget), in_op},
        {Policy::every_layer().with_offload({::testing::TempDir(), 0, 0}), in_op},
        {Policy::dynamic(512), false},
        {Policy::offload(::testing::TempDir(), 0), false}};
    for (const auto& [policy, must_raise] : policies) {
      const ImpureRun got = impure_step(impurity, policy);
      const std::string what = policy.to_string() + ", impurity " + std::to_string(static_cast<int>(impurity));
      if (!got.error.empty()) {
        EXPECT_TRUE(in_op) << what << ": " << got.error;
        EXPECT_NE(got.error.find("first run"), std::string::npos) << what << ": " << got.error;
        if (must_raise) EXPECT_NE(got.error.find("'impure'"), std::string::npos) << what << ": " << got.error;
        continue;
      }
      EXPECT_FALSE(must_raise) << what << ": no error";
      ASSERT_EQ(got.grads.size(), save_all.grads.size()) << what;
      for (size_t i = 0; i < got.grads.size(); ++i)
        EXPECT_TRUE(bitwise_equal(got.grads[i], save_all.grads[i])) << what << ": gradient " << i;
    }
  }
}
