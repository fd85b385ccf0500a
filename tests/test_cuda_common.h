// What the CUDA tests on whole models share (test_cuda.cpp, test_cuda_options.cpp): cuda:0, the
// skip without it, bitwise comparison, a few training steps' gradients under a policy, every
// policy against save-all, and the small GPT and ResNet they run.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "remat/devices.h"
#include "remat/nn.h"
#include "remat/remat.h"
#include "test_cuda_options.h"

namespace remat::testing::cuda_tests {

inline const Device kGpu{DeviceType::cuda, 0};

// Skips the calling test (with the reason) unless cuda:0 is usable; registers its backend.
#define REQUIRE_GPU()                                                                                       \
  do {                                                                                                      \
    if (device_count(DeviceType::cuda) == 0) GTEST_SKIP() << "no CUDA device: " << unavailable_reason(DeviceType::cuda); \
    use_device(kGpu);                                                                                       \
  } while (0)

inline bool same_bits(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  Tensor ha = a.detach().to(kCpu).contiguous(), hb = b.detach().to(kCpu).contiguous();
  return ha.shape() == hb.shape() && ha.dtype() == hb.dtype() && std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()) == 0;
}

struct Gradients {
  double loss = 0;
  TensorList grads;            // per parameter, on the host
  uint64_t fallbacks = 0;      // kernels that ran on the CPU during the steps
  size_t peak_saved = 0;       // the device's own counter, last step
};

// A directory for offload: policies, removed with the object.
struct TempDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("remat_test_cuda_" + std::to_string(::getpid()));
  TempDir() { std::filesystem::create_directories(path); }
  ~TempDir() { std::filesystem::remove_all(path); }
};

// The policies of the contract but offload (its own test, last); `budget` is the budget's bytes.
inline std::vector<std::string> policies(size_t budget) {
  return {"every-layer", "every-k:2", "selective:matmul", detail::concat("budget:", budget),
          detail::concat("dynamic:", budget)};
}

// `steps` forward + backward passes (no update) of `loss` under `policy` on the same inputs; the
// last pass's gradients. Repeating lets the budget planner profile, then run its plan.
inline Gradients run_steps(nn::Module& model, const std::function<Tensor()>& loss, const std::string& policy, int steps = 3) {
  Gradients g;
  const uint64_t before = fallback_calls(kGpu);
  for (int s = 0; s < steps; ++s) {
    model.zero_grad();
    manual_seed(1234);  // the same dropout masks every pass
    reset_peaks(kGpu);
    const size_t base = memory_stats(kGpu).live(memory::Tag::saved);
    Tensor value = backward(loss, GradOptions{Policy::parse(policy)});
    g.loss = value.detach().to(kCpu).item();
    g.peak_saved = memory_stats(kGpu).peak(memory::Tag::saved) - base;
  }
  g.fallbacks = fallback_calls(kGpu) - before;
  for (const auto& p : model.parameters()) g.grads.push_back(p.grad().defined() ? p.grad().to(kCpu) : Tensor());
  return g;
}

inline void expect_same_gradients(const Gradients& want, const Gradients& got, const std::string& what) {
  EXPECT_EQ(want.loss, got.loss) << what;
  ASSERT_EQ(want.grads.size(), got.grads.size()) << what;
  for (size_t i = 0; i < want.grads.size(); ++i) EXPECT_TRUE(same_bits(want.grads[i], got.grads[i])) << what << ": parameter " << i;
}

inline nn::GPTConfig small_gpt() {
  return {.vocab = 61, .layers = 4, .width = 64, .heads = 4, .seq = 32, .dropout = 0.1, .dtype = DType::f32, .seed = 5};
}

inline std::vector<int64_t> token_ids(size_t n, int64_t vocab, uint64_t salt) {
  std::vector<int64_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<int64_t>((i * 7919 + salt * 104729) % static_cast<uint64_t>(vocab));
  return v;
}

// Every policy against save-all on the GPU, and save-all against itself (two runs). The budget is
// halfway between every-layer's and save-all's peak saved bytes, and the run must stay within it.
inline void check_policies(nn::Module& model, const std::function<Tensor()>& loss, const std::string& name) {
  const Gradients save_all = run_steps(model, loss, "save-all");
  EXPECT_EQ(save_all.fallbacks, 0u) << name << ": kernels ran on the CPU under save-all";
  expect_same_gradients(save_all, run_steps(model, loss, "save-all"), name + " save-all, second run");
  const size_t every_layer = run_steps(model, loss, "every-layer").peak_saved;
  const size_t budget = (every_layer + save_all.peak_saved) / 2;
  for (const std::string& policy : policies(budget)) {
    const Gradients g = run_steps(model, loss, policy);
    expect_same_gradients(save_all, g, name + " " + policy);
    EXPECT_EQ(g.fallbacks, 0u) << name << " " << policy << ": kernels ran on the CPU";
    if (policy.rfind("budget:", 0) == 0) EXPECT_LE(g.peak_saved, budget) << name << " " << policy;
  }
}

// The GPT and the ResNet of the tests below, with their inputs on the GPU.
struct GptCase {
  nn::GPT model;
  Tensor ids, targets;
  explicit GptCase(const nn::GPTConfig& config = small_gpt()) : model(config) {
    model.to(kGpu);
    const int64_t batch = 4, seq = config.seq;
    ids = from_indices(token_ids(batch * seq, config.vocab, 1), {batch, seq}, kGpu);
    targets = from_indices(token_ids(batch * seq, config.vocab, 2), {batch, seq}, kGpu);
  }
  std::function<Tensor()> loss() {
    return [this] { return model.loss(ids, targets); };
  }
};
struct ResNetCase {
  nn::ResNet model{{.stages = 2, .blocks_per_stage = 2, .width = 8, .classes = 5, .seed = 3}};
  Tensor images, labels;
  ResNetCase() {
    model.to(kGpu);
    const nn::SyntheticImages data = nn::make_synthetic_images({.count = 8, .classes = 5, .size = 16, .seed = 2});
    images = data.images.to(kGpu);
    labels = data.labels.to(kGpu);
  }
  std::function<Tensor()> loss() {
    return [this] { return model.loss(images, labels); };
  }
};

}  // namespace remat::testing::cuda_tests
