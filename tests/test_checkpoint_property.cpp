// Property test: random models (chains and trees of blocks, random widths and depths, dropout,
// custom ops, shared parameters, random nesting of regions and per-layer overrides) under random
// policies give gradients bitwise equal to save-all.
#include <gtest/gtest.h>

#include <random>

#include "checkpoint_models.h"

using namespace remat;
using remat::testing::bitwise_equal;

namespace {

using Block = std::function<Tensor(const Tensor&)>;

struct ModelBuilder {
  std::mt19937_64 rng;
  DType dtype;
  int width;
  std::vector<Tensor> params;
  std::shared_ptr<bool> use_overrides = std::make_shared<bool>(false);
  std::vector<std::string> trace;  // what was built, for failure messages
  CustomOp fused = remat::testing::fused_silu();

  ModelBuilder(uint64_t seed) : rng(seed) {
    dtype = pick(2) == 0 ? DType::f32 : DType::f64;
    width = 3 + pick(8);
  }
  int pick(int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); }

  Tensor param(const Shape& shape, double scale) {
    Tensor p = randn(shape, dtype, RngState{rng(), 0}, 0.0, scale).requires_grad_();
    params.push_back(p);
    return p;
  }

  std::optional<Policy> random_override() {
    switch (pick(6)) {
      case 0: return Policy::save_all();
      case 1: return Policy::every_layer();
      case 2: return Policy::every_k(2);
      case 3: return Policy::parse("selective:matmul");
      default: return std::nullopt;
    }
  }

  Block dense() {
    Tensor w = param({width, width}, 0.8 / std::sqrt(static_cast<double>(width)));
    Tensor b = param({width}, 0.1);
    int act = pick(5);
    trace.push_back("dense" + std::to_string(act));
    return [w, b, act](const Tensor& h) {
      Tensor z = add(matmul(h, w), b);
      switch (act) {
        case 0: return tanh(z);
        case 1: return gelu(z, true);
        case 2: return silu(z);
        case 3: return sigmoid(z);
        default: return gelu(z);
      }
    };
  }

  Block block(int depth) {
    int kind = depth <= 0 ? pick(3) : pick(9);
    switch (kind) {
      case 0: return dense();
      case 1: {
        trace.push_back("dropout");
        double p = 0.1 + 0.1 * pick(3);
        Block inner = dense();
        return [inner, p](const Tensor& h) { return dropout(inner(h), p); };
      }
      case 2: {
        trace.push_back("custom");
        Block inner = dense();
        CustomOp op = fused;
        return [inner, op](const Tensor& h) { return op({inner(h)})[0]; };
      }
      case 3: {
        trace.push_back("residual(");
        Block inner = block(depth - 1);
        trace.push_back(")");
        return [inner](const Tensor& h) { return add(h, mul_scalar(inner(h), 0.5)); };
      }
      case 4: {
        trace.push_back("branch(");
        Block left = block(depth - 1), right = block(depth - 1);
        trace.push_back(")");
        return [left, right](const Tensor& h) { return add(left(h), mul(right(h), h)); };
      }
      case 5: {
        trace.push_back("region(");
        Block inner = block(depth - 1);
        std::optional<Policy> override_policy = random_override();
        auto use = use_overrides;
        trace.push_back(")");
        return [inner, override_policy, use](const Tensor& h) {
          CheckpointOptions options;
          if (*use) options.policy = override_policy;
          return checkpoint(inner, h, options);
        };
      }
      case 6: {
        // a parameter shared by two blocks (gradient contributions from two places)
        trace.push_back("shared");
        Tensor w = param({width, width}, 0.5 / std::sqrt(static_cast<double>(width)));
        Block middle = block(depth - 1);
        return [w, middle](const Tensor& h) { return tanh(matmul(middle(tanh(matmul(h, w))), w)); };
      }
      default: {
        trace.push_back("chain(");
        auto chain = std::make_shared<Chain>();
        int n = 1 + pick(4);
        auto use = use_overrides;
        std::vector<std::optional<Policy>> overrides;
        for (int i = 0; i < n; ++i) {
          chain->add(block(depth - 1));
          overrides.push_back(random_override());
        }
        std::optional<Policy> container = random_override();
        trace.push_back(")");
        // overrides are applied only in the run under test, never in the save-all reference
        return [chain, container, use](const Tensor& h) {
          chain->set_policy(*use ? container : std::nullopt);
          return chain->forward(h);
        };
      }
    }
  }
};

Policy random_policy(std::mt19937_64& rng) {
  static const char* policies[] = {"every-layer", "every-k:2", "every-k:3", "selective:matmul",
                                   "selective:tanh,add", "save-all"};
  return Policy::parse(policies[rng() % 6]);
}

}  // namespace

TEST(CheckpointProperty, RandomModelsUnderRandomPoliciesMatchSaveAllBitwise) {
  const int cases = 200;
  std::mt19937_64 policy_rng(2024);
  for (int c = 0; c < cases; ++c) {
    ModelBuilder builder(1000 + static_cast<uint64_t>(c));
    auto top = std::make_shared<Chain>();
    int blocks = 1 + builder.pick(5);
    for (int i = 0; i < blocks; ++i) top->add(builder.block(3));
    int batch = 1 + builder.pick(4);
    Tensor x = randn({batch, builder.width}, builder.dtype, RngState{static_cast<uint64_t>(c), 7}).requires_grad_();
    Tensor r = randn({batch, builder.width}, builder.dtype, RngState{static_cast<uint64_t>(c), 9});
    TensorList wrt = builder.params;
    wrt.push_back(x);
    auto run = [&](const Policy& policy, bool overrides) {
      *builder.use_overrides = overrides;
      manual_seed(77 + static_cast<uint64_t>(c));
      return remat::grad([&](const TensorList&) { return sum(mul(top->forward(x), r)); }, wrt, GradOptions{policy});
    };
    TensorList reference = run(Policy::save_all(), false);
    Policy policy = random_policy(policy_rng);
    TensorList got = run(policy, builder.pick(2) == 1);
    std::string trace;
    for (const auto& t : builder.trace) trace += t + " ";
    ASSERT_EQ(got.size(), reference.size());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_TRUE(bitwise_equal(got[i], reference[i]))
          << "case " << c << " policy " << policy.to_string() << " gradient " << i << " differs; model: " << trace;
  }
}
