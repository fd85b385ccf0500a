// How often a training step makes the host wait for its device, counted on the emulated device
// (emulated_backend.h), which waits as CUDA with the backend option async does (and, told to, as
// CUDA's default path): a copy to the host, synchronize(), a time reading not yet ready and a
// deferred index check read all count.
//   - under save-all and every-layer a GPT step (forward, loss, backward, SGD update, the loss read
//     back) waits once: for the loss. Regions time themselves with marks read later, positions
//     are made on the device, ids and targets uploaded from the host need no check on the device;
//   - ids made on the device are checked there, and the verdict is read once, at the end of the
//     backward pass; a bad one fails the backward before any gradient is committed, with the
//     CPU's message, and a forward alone raises it at the next wait;
//   - region times still reach the counters, after the step;
//   - a linear layer's product and bias are one kernel call, recomputed with the same kernel;
//   - an every-layer step that offloads every kept value waits no more than one in memory.
// The kernel calls per step (each a launch or more on a GPU) are printed for the record.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "emulated_backend.h"
#include "remat/nn.h"
#include "remat/remat.h"
#include "checkpoint_models.h"
#include "temp_dir.h"

using namespace remat;
using remat::testing::EmulatedDevice;

namespace {

nn::GPTConfig tiny_gpt() {
  return {.vocab = 61, .layers = 2, .width = 32, .heads = 2, .seq = 16, .dropout = 0.1, .dtype = DType::f32, .seed = 3};
}

std::vector<int64_t> token_values(int64_t n, int64_t vocab, uint64_t salt) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<int64_t>((i * 7 + salt * 13) % vocab);
  return v;
}

// [batch, seq] token ids uploaded from the host (their range is known there) or, with
// `made_on_device`, computed on the device (a transposed copy: its range is not known).
Tensor token_tensor(int64_t batch, int64_t seq, int64_t vocab, uint64_t salt, Device device, bool made_on_device) {
  const std::vector<int64_t> values = token_values(batch * seq, vocab, salt);
  if (!made_on_device) return from_indices(values, {batch, seq}, device);
  std::vector<int64_t> transposed(values.size());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < seq; ++t) transposed[static_cast<size_t>(t * batch + b)] = values[static_cast<size_t>(b * seq + t)];
  return from_indices(transposed, {seq, batch}, device).transpose(0, 1).contiguous();
}

struct StepCount {
  uint64_t waits = 0, kernel_calls = 0, deferred_checks = 0, uploads = 0;
  double loss = 0;
};

// One training step on `device`: forward, loss, backward under `policy`, SGD update, loss read.
StepCount step(nn::GPT& model, nn::SGD& optimizer, const Tensor& ids, const Tensor& targets, const Policy& policy,
               Device device) {
  optimizer.zero_grad();
  const DeviceActivity before = device_activity(device);
  Tensor loss = backward([&] { return model.loss(ids, targets); }, GradOptions{policy});
  optimizer.step();
  StepCount c;
  c.loss = loss.detach().to(kCpu).item();
  const DeviceActivity after = device_activity(device);
  c.waits = after.host_synchronizations - before.host_synchronizations;
  c.kernel_calls = after.kernel_calls - before.kernel_calls;
  c.deferred_checks = after.deferred_checks - before.deferred_checks;
  c.uploads = after.copies_from_host - before.copies_from_host;
  return c;
}

// The calls of kernel k between two readings of a device's activity.
uint64_t calls_between(const DeviceActivity& from, const DeviceActivity& to, Kernel k) {
  return to.calls_by_kernel[static_cast<size_t>(k)] - from.calls_by_kernel[static_cast<size_t>(k)];
}

}  // namespace

// The recomputation check on or off for a scope (process-wide).
struct RecomputationCheck {
  bool previous = recomputation_check();
  explicit RecomputationCheck(bool on) { set_recomputation_check(on); }
  ~RecomputationCheck() { set_recomputation_check(previous); }
};

// The step's one wait is the loss read. With the recomputation check on, a policy that recomputes
// device values reads all their digests once, at the end of the backward pass (Note [device
// digests are read once a backward pass] in src/autodiff/digest.cpp): one wait more, never one a
// value or a region.
TEST(DeviceSync, SaveAllAndEveryLayerStepsWaitOnceForTheLoss) {
  EmulatedDevice dev;
  for (const bool check : {false, true}) {
    RecomputationCheck scope(check);
    for (const char* text : {"save-all", "every-layer"}) {
      nn::GPT model(tiny_gpt());
      model.to(dev.device);
      nn::SGD optimizer(model.parameters(), {.lr = 1e-2});
      const Tensor ids = token_tensor(2, 16, 61, 1, dev.device, false);
      const Tensor targets = token_tensor(2, 16, 61, 2, dev.device, false);
      const Policy policy = Policy::parse(text);
      step(model, optimizer, ids, targets, policy, dev.device);  // the first step sets things up
      const StepCount c = step(model, optimizer, ids, targets, policy, dev.device);
      const uint64_t expected = check && policy.recomputes() ? 2 : 1;
      EXPECT_EQ(c.waits, expected) << text << (check ? " (check on)" : " (check off)") << ": the step waited for the device "
                                   << c.waits << " times";
      EXPECT_EQ(c.deferred_checks, 0u) << text;
      EXPECT_EQ(c.uploads, 0u) << text << ": the step copied host memory to the device";
      EXPECT_GT(c.kernel_calls, 0u);
      std::printf("%s, recomputation check %s: %llu kernel calls, %llu host synchronisation(s) per step\n", text,
                  check ? "on" : "off", static_cast<unsigned long long>(c.kernel_calls),
                  static_cast<unsigned long long>(c.waits));
    }
  }
}

// CUDA's default path (no backend option async) waits where async does not: at every time mark
// (it reads the host clock after a wait), at every index kernel's check (read back at once,
// whatever the host knows of the ids' range) and after every upload. The emulated device told to
// wait so counts those waits in a GPT step: the loss read, one per index kernel call (embedding
// and cross-entropy, forward and backward) and one per mark, nothing else; with async the same
// step waits once. No digest kernel, as on CUDA. The device check runs the same step on cuda:0
// beside this device (Cuda.DefaultPathWaitsWhereTheEmulatedDeviceDoes).
TEST(DeviceSync, CudasDefaultPathWaitsAtEachMarkAndEachIndexCheck) {
  EmulatedDevice dev;
  dev.backend.refuse_all_dtypes(Kernel::digest);
  for (const bool async : {true, false}) {
    dev.backend.backend_options.async = async;
    for (const char* text : {"save-all", "every-layer"}) {
      nn::GPT model(tiny_gpt());
      model.to(dev.device);
      nn::SGD optimizer(model.parameters(), {.lr = 1e-2});
      const Tensor ids = token_tensor(2, 16, 61, 1, dev.device, false);
      const Tensor targets = token_tensor(2, 16, 61, 2, dev.device, false);
      const Policy policy = Policy::parse(text);
      step(model, optimizer, ids, targets, policy, dev.device);  // the first step sets things up
      const DeviceActivity before = device_activity(dev.device);
      const uint64_t marks_before = dev.backend.marks;
      const StepCount c = step(model, optimizer, ids, targets, policy, dev.device);
      const DeviceActivity after = device_activity(dev.device);
      uint64_t index_calls = 0;
      for (Kernel k : {Kernel::embedding, Kernel::embedding_backward, Kernel::cross_entropy,
                       Kernel::cross_entropy_backward})
        index_calls += calls_between(before, after, k);
      const uint64_t marks = dev.backend.marks - marks_before;
      EXPECT_GT(index_calls, 0u) << text;
      if (policy.recomputes()) EXPECT_GT(marks, 0u) << text;
      const uint64_t expected = async ? 1 : 1 + index_calls + marks;
      EXPECT_EQ(c.waits, expected) << text << (async ? " with async" : " as CUDA's default path");
      std::printf("%s, %s: %llu waits per step (%llu index kernel calls, %llu time marks)\n", text,
                  async ? "async" : "CUDA's default path", static_cast<unsigned long long>(c.waits),
                  static_cast<unsigned long long>(index_calls), static_cast<unsigned long long>(marks));
    }
  }
}

TEST(DeviceSync, RegionTimesReachTheCountersAfterTheStep) {
  EmulatedDevice dev;
  nn::GPT model(tiny_gpt());
  model.to(dev.device);
  nn::SGD optimizer(model.parameters(), {.lr = 1e-2});
  const Tensor ids = token_tensor(2, 16, 61, 1, dev.device, false);
  const Tensor targets = token_tensor(2, 16, 61, 2, dev.device, false);
  reset_counters();
  step(model, optimizer, ids, targets, Policy::parse("every-layer"), dev.device);
  const uint64_t waits = device_activity(dev.device).host_synchronizations;
  const Counters c = counters();
  EXPECT_EQ(device_activity(dev.device).host_synchronizations, waits) << "reading the counters waited again";
  ASSERT_FALSE(c.regions.empty());
  double forward = 0, recompute = 0, backward_seconds = 0;
  for (const auto& r : c.regions) {
    EXPECT_GE(r.forward_seconds, 0.0) << r.label;
    forward += r.forward_seconds, recompute += r.recompute_seconds, backward_seconds += r.backward_seconds;
  }
  EXPECT_GT(forward, 0.0);
  EXPECT_GT(recompute, 0.0);
  EXPECT_GT(backward_seconds, 0.0);
}

TEST(DeviceSync, IdsMadeOnTheDeviceAreCheckedOnceAtTheEndOfTheBackward) {
  EmulatedDevice dev;
  nn::GPT model(tiny_gpt());
  model.to(dev.device);
  nn::SGD optimizer(model.parameters(), {.lr = 1e-2});
  const Tensor ids = token_tensor(2, 16, 61, 1, dev.device, true);
  const Tensor targets = token_tensor(2, 16, 61, 2, dev.device, true);
  // the same step with ids from the host gives the same loss
  nn::GPT twin(tiny_gpt());
  twin.to(dev.device);
  nn::SGD twin_optimizer(twin.parameters(), {.lr = 1e-2});
  for (const char* text : {"save-all", "every-layer"}) {
    manual_seed(7);
    const StepCount c = step(model, optimizer, ids, targets, Policy::parse(text), dev.device);
    manual_seed(7);
    const StepCount host = step(twin, twin_optimizer, token_tensor(2, 16, 61, 1, dev.device, false),
                                token_tensor(2, 16, 61, 2, dev.device, false), Policy::parse(text), dev.device);
    EXPECT_EQ(c.loss, host.loss) << text;
    EXPECT_GT(c.deferred_checks, 0u) << text;
    // the digests' read at the end of every-layer's backward reads the deferred checks too
    EXPECT_EQ(c.waits, 2u) << text << ": the end of the backward and the loss read";
  }
}

TEST(DeviceSync, ABadIdMadeOnTheDeviceFailsTheBackwardAndCommitsNothing) {
  EmulatedDevice dev;
  for (const char* text : {"save-all", "every-layer"}) {
    nn::GPT model(tiny_gpt());
    model.to(dev.device);
    std::vector<int64_t> values = token_values(2 * 16, 61, 1);
    values[5] = 61;  // one past the table
    const Tensor ids = from_indices(values, {16, 2}, dev.device).transpose(0, 1).contiguous();
    const Tensor targets = token_tensor(2, 16, 61, 2, dev.device, false);
    std::vector<Tensor> before;
    for (const auto& p : model.parameters()) before.push_back(p.grad());
    try {
      backward([&] { return model.loss(ids, targets); }, GradOptions{Policy::parse(text)});
      ADD_FAILURE() << text << ": no error";
    } catch (const Error& e) {
      // value 5 of the [16, 2] upload is (2, 1); transposed to [2, 16], position 1 * 16 + 2
      EXPECT_NE(std::string(e.what()).find("embedding: id 61 at position 18"), std::string::npos) << e.what();
    }
    size_t i = 0;
    for (const auto& p : model.parameters()) EXPECT_FALSE(p.grad().defined() || before[i++].defined()) << text;
    // the device is usable afterwards, and the error is not raised twice
    EXPECT_NO_THROW(backend(dev.device).synchronize());
  }
}

TEST(DeviceSync, AForwardAloneRaisesABadIdAtTheNextWait) {
  EmulatedDevice dev;
  nn::GPT model(tiny_gpt());
  model.to(dev.device);
  std::vector<int64_t> values = token_values(2 * 16, 61, 1);
  values[0] = -1;
  const Tensor ids = from_indices(values, {16, 2}, dev.device).transpose(0, 1).contiguous();
  Tensor loss;
  {
    NoGradGuard no_grad;
    loss = model.loss(ids, token_tensor(2, 16, 61, 2, dev.device, false));
  }
  try {
    (void)loss.to(kCpu);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("embedding: id -1 at position 0"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW((void)loss.to(kCpu));
}

TEST(DeviceSync, IndexRangesAreKnownFromTheHostAndForgottenOnAWrite) {
  int64_t lo = 0, hi = 0;
  Tensor ids = from_indices({4, -2, 9}, {3});
  ASSERT_TRUE(ids.storage()->index_range(lo, hi));
  EXPECT_EQ(lo, -2);
  EXPECT_EQ(hi, 9);
  Tensor pos = arange(5, DType::i64);
  ASSERT_TRUE(pos.storage()->index_range(lo, hi));
  EXPECT_EQ(lo, 0);
  EXPECT_EQ(hi, 4);
  ids.fill_(100.0);
  EXPECT_FALSE(ids.storage()->index_range(lo, hi));
  EmulatedDevice dev;
  Tensor moved = from_indices({3, 1}, {2}).to(dev.device);
  ASSERT_TRUE(moved.storage()->index_range(lo, hi));
  EXPECT_EQ(hi, 3);
  Tensor copied = from_indices({3, 1, 2, 0}, {2, 2}, dev.device).transpose(0, 1).contiguous();
  EXPECT_FALSE(copied.storage()->index_range(lo, hi));
}

// A linear layer's product and bias are one kernel call (gemm_bias, which the CUDA backend can run
// as one cuBLASLt call with the bias in its epilogue), not a copy of the bias and a GEMM on top:
// with the CPU's bits. In a GPT step each block's four linear layers call it once in the forward;
// every-layer's recomputation calls the same kernel again for those it reruns, and no plain GEMM
// or copy more than save-all (the backward's GEMMs are the same under both).
TEST(DeviceSync, ALinearLayersProductAndBiasAreOneKernelCall) {
  EmulatedDevice dev;
  nn::Linear layer(6, 5, true);
  const Tensor x = randn({3, 4, 6}, DType::f32, RngState{9, 0});
  const Tensor on_cpu = layer.forward(x);
  layer.to(dev.device);
  const Tensor xd = x.to(dev.device);
  const DeviceActivity before = device_activity(dev.device);
  const Tensor on_device = layer.forward(xd);
  const DeviceActivity after = device_activity(dev.device);
  auto calls = [&](Kernel k) { return calls_between(before, after, k); };
  EXPECT_EQ(calls(Kernel::gemm_bias), 1u);
  EXPECT_EQ(calls(Kernel::gemm), 0u);
  EXPECT_EQ(calls(Kernel::copy), 0u);
  EXPECT_EQ(after.kernel_calls - before.kernel_calls, 1u);
  const Tensor back = on_device.to(kCpu);
  ASSERT_EQ(back.numel(), on_cpu.numel());
  EXPECT_EQ(std::memcmp(back.raw_data(), on_cpu.raw_data(), on_cpu.nbytes()), 0) << "not the CPU's bits";

  // without dropout and the recomputation check, whose masks and digests add copies of their own
  nn::GPTConfig config = tiny_gpt();
  config.dropout = 0.0;
  RecomputationCheck check_off(false);
  std::vector<std::array<uint64_t, 3>> counts;  // gemm_bias, gemm, copy calls of a step
  for (const char* text : {"save-all", "every-layer"}) {
    nn::GPT model(config);
    model.to(dev.device);
    nn::SGD optimizer(model.parameters(), {.lr = 1e-2});
    const Tensor ids = token_tensor(2, 16, 61, 1, dev.device, false);
    const Tensor targets = token_tensor(2, 16, 61, 2, dev.device, false);
    const DeviceActivity from = device_activity(dev.device);
    step(model, optimizer, ids, targets, Policy::parse(text), dev.device);
    const DeviceActivity to = device_activity(dev.device);
    std::array<uint64_t, 3> c{};
    for (size_t i = 0; const Kernel k : {Kernel::gemm_bias, Kernel::gemm, Kernel::copy})
      c[i++] = to.calls_by_kernel[static_cast<size_t>(k)] - from.calls_by_kernel[static_cast<size_t>(k)];
    counts.push_back(c);
  }
  EXPECT_EQ(counts[0][0], static_cast<uint64_t>(4 * config.layers)) << "qkv, the attention's and the MLP's two projections";
  EXPECT_GT(counts[1][0], counts[0][0]) << "every-layer reruns linear layers";
  EXPECT_LE(counts[1][0], 2 * counts[0][0]);
  EXPECT_EQ(counts[1][1], counts[0][1]) << "a recomputed linear layer ran a plain GEMM";
  EXPECT_EQ(counts[1][2], counts[0][2]) << "a recomputed linear layer copied its bias";
}

// The gradient norm of a GPT step is one kernel call (sum_squares over every gradient, in
// parameter order) and one wait (its value read), with the CPU's bits; scaling the gradients
// when the norm is above the limit adds one kernel call (scale_each), again with the CPU's bits.
TEST(DeviceSync, TheGradientNormIsOneKernelCallAndOneWait) {
  EmulatedDevice dev;
  nn::GPTConfig config = tiny_gpt();
  config.dropout = 0.0;
  nn::GPT model(config), on_cpu(config);
  model.to(dev.device);
  const Tensor ids = token_tensor(2, 16, 61, 1, dev.device, false);
  const Tensor targets = token_tensor(2, 16, 61, 2, dev.device, false);
  backward([&] { return model.loss(ids, targets); }, GradOptions{Policy::parse("save-all")});
  backward([&] { return on_cpu.loss(ids.to(kCpu), targets.to(kCpu)); }, GradOptions{Policy::parse("save-all")});
  const size_t params = model.parameters().size();
  const DeviceActivity before = device_activity(dev.device);
  const double norm = nn::clip_grad_norm(model.parameters(), 1e30);
  const DeviceActivity after = device_activity(dev.device);
  EXPECT_EQ(after.calls_by_kernel[static_cast<size_t>(Kernel::sum_squares)] -
                before.calls_by_kernel[static_cast<size_t>(Kernel::sum_squares)],
            1u);
  EXPECT_EQ(after.kernel_calls - before.kernel_calls, 1u) << "was 4 per gradient less one: square, sum, widen, add";
  EXPECT_EQ(after.host_synchronizations - before.host_synchronizations, 1u);
  EXPECT_EQ(norm, nn::clip_grad_norm(on_cpu.parameters(), 1e30)) << "not the CPU's bits";
  const double clipped = nn::clip_grad_norm(model.parameters(), norm / 2);
  const DeviceActivity scaled = device_activity(dev.device);
  EXPECT_EQ(clipped, norm);
  EXPECT_EQ(scaled.kernel_calls - after.kernel_calls, 2u) << "was 1 + 2 per gradient: the sum, then a product and a copy each";
  EXPECT_EQ(scaled.calls_by_kernel[static_cast<size_t>(Kernel::scale_each)] -
                after.calls_by_kernel[static_cast<size_t>(Kernel::scale_each)],
            1u);
  EXPECT_EQ(scaled.host_synchronizations - after.host_synchronizations, 1u);
  EXPECT_EQ(nn::clip_grad_norm(on_cpu.parameters(), norm / 2), norm);
  const TensorList device_params = model.parameters(), cpu_params = on_cpu.parameters();
  for (size_t i = 0; i < params; ++i) {
    const Tensor got = device_params[i].grad().to(kCpu), want = cpu_params[i].grad();
    EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), want.nbytes()), 0) << "clipped gradient " << i;
  }
  std::printf("gradient norm of %zu gradients: %llu kernel call(s), %llu with the gradients scaled\n", params,
              static_cast<unsigned long long>(after.kernel_calls - before.kernel_calls),
              static_cast<unsigned long long>(scaled.kernel_calls - after.kernel_calls));
}

// The residual add fused into layer norm (add_layer_norm) is one kernel call forward and one
// backward, where the add and the layer norm were two each way (binary and layer_norm forward;
// layer_norm_backward and the engine's binary adding the sum's two gradients backward). In a GPT
// step each block's second norm is fused: one call per block each way under save-all, and under
// every-layer one more forward call per block for the recomputation.
TEST(DeviceSync, TheResidualAddAndNormAreOneKernelCallEachWay) {
  EmulatedDevice dev;
  std::optional<ScopedPolicy> keep_all(Policy::save_all());  // the op alone, outside any layer call
  const Tensor x = randn({4, 8, 16}, DType::f32, RngState{1, 0}).to(dev.device).requires_grad_();
  const Tensor r = randn({4, 8, 16}, DType::f32, RngState{2, 0}).to(dev.device).requires_grad_();
  const Tensor w = randn({16}, DType::f32, RngState{3, 0}).to(dev.device).requires_grad_();
  const Tensor b = randn({16}, DType::f32, RngState{4, 0}).to(dev.device).requires_grad_();
  const DeviceActivity start = device_activity(dev.device);
  const TensorList hn = add_layer_norm(x, r, w, b);
  const DeviceActivity forward_done = device_activity(dev.device);
  EXPECT_EQ(forward_done.kernel_calls - start.kernel_calls, 1u);
  EXPECT_EQ(calls_between(start, forward_done, Kernel::add_layer_norm), 1u);
  const Tensor gs = randn({4, 8, 16}, DType::f32, RngState{5, 0}).to(dev.device);
  const Tensor gy = randn({4, 8, 16}, DType::f32, RngState{6, 0}).to(dev.device);
  const DeviceActivity backward_start = device_activity(dev.device);
  const TensorList grads = grad(hn, {x, r, w, b}, TensorList{gs, gy});
  const DeviceActivity backward_done = device_activity(dev.device);
  EXPECT_EQ(calls_between(backward_start, backward_done, Kernel::add_layer_norm_backward), 1u);
  EXPECT_EQ(calls_between(backward_start, backward_done, Kernel::layer_norm_backward), 0u);
  EXPECT_EQ(calls_between(backward_start, backward_done, Kernel::binary), 0u);
  EXPECT_EQ(backward_done.kernel_calls - backward_start.kernel_calls, 1u);
  EXPECT_EQ(std::memcmp(grads[0].to(kCpu).raw_data(), grads[1].to(kCpu).raw_data(), grads[0].nbytes()), 0)
      << "x and r get the same gradient";
  keep_all.reset();

  nn::GPTConfig config = tiny_gpt();
  config.dropout = 0.0;
  RecomputationCheck check_off(false);
  for (const char* text : {"save-all", "every-layer"}) {
    nn::GPT model(config);
    model.to(dev.device);
    nn::SGD optimizer(model.parameters(), {.lr = 1e-2});
    const Tensor ids = token_tensor(2, 16, 61, 1, dev.device, false);
    const Tensor targets = token_tensor(2, 16, 61, 2, dev.device, false);
    step(model, optimizer, ids, targets, Policy::parse(text), dev.device);
    const DeviceActivity from = device_activity(dev.device);
    const StepCount c = step(model, optimizer, ids, targets, Policy::parse(text), dev.device);
    const DeviceActivity to = device_activity(dev.device);
    auto step_calls = [&](Kernel k) { return calls_between(from, to, k); };
    const uint64_t layers = static_cast<uint64_t>(config.layers);
    const bool recomputes = std::string(text) != "save-all";
    EXPECT_EQ(step_calls(Kernel::add_layer_norm), recomputes ? 2 * layers : layers) << text;
    EXPECT_EQ(step_calls(Kernel::add_layer_norm_backward), layers) << text;
    EXPECT_EQ(step_calls(Kernel::layer_norm_backward), layers + 1) << text << ": ln1 of each block and ln_f";
    std::printf("%s: %llu kernel calls per step, %llu add_layer_norm forward and %llu backward\n", text,
                static_cast<unsigned long long>(c.kernel_calls),
                static_cast<unsigned long long>(step_calls(Kernel::add_layer_norm)),
                static_cast<unsigned long long>(step_calls(Kernel::add_layer_norm_backward)));
  }
}

// Offload of device values behind the device's work (Note [offload of device values] in
// src/saved/offload_device.cpp): an every-layer step whose kept values all go to host memory and a file
// (offload:DIR,threshold=0) waits for the device no more often than every-layer in memory, copies
// each offloaded value there and back asynchronously, its consumers waiting on the device, and
// gives save-all's gradients bit for bit. With the copies synchronous (a backend without a copy
// stream, as before), each value's copy to host memory was a wait of its own.
TEST(DeviceSync, AnOffloadStepWaitsNoMoreThanInMemory) {
  EmulatedDevice dev;
  RecomputationCheck check_off(false);
  const std::string dir = remat::testing::fresh_dir("device-sync-offload");
  struct Run {
    StepCount count;
    uint64_t to_host = 0, from_host = 0, async = 0, device_waits = 0;
    std::vector<Tensor> grads;
  };
  auto run = [&](const std::string& text, bool synchronous) {
    dev.backend.synchronous_copies = synchronous;
    nn::GPT model(tiny_gpt());
    model.to(dev.device);
    nn::SGD optimizer(model.parameters(), {.lr = 0.0});  // the gradients are compared, not the update
    const Tensor ids = token_tensor(2, 16, 61, 1, dev.device, false);
    const Tensor targets = token_tensor(2, 16, 61, 2, dev.device, false);
    const Policy policy = Policy::parse(text);
    manual_seed(5);
    step(model, optimizer, ids, targets, policy, dev.device);  // the first step sets things up
    manual_seed(5);
    const DeviceActivity before = device_activity(dev.device);
    Run r;
    r.count = step(model, optimizer, ids, targets, policy, dev.device);
    const DeviceActivity after = device_activity(dev.device);
    r.to_host = after.copies_to_host - before.copies_to_host;
    r.from_host = after.copies_from_host - before.copies_from_host;
    r.async = after.async_copies - before.async_copies;
    r.device_waits = after.device_waits - before.device_waits;
    for (const auto& p : model.parameters()) r.grads.push_back(p.grad().to(kCpu));
    dev.backend.synchronous_copies = false;
    return r;
  };
  const std::string offload = "every-layer+offload:" + dir + ",threshold=0";
  const Run save_all = run("save-all", false);
  const Run in_memory = run("every-layer", false);
  const Run overlapped = run(offload, false);
  const Run synchronous = run(offload, true);
  for (const Run* r : {&overlapped, &synchronous}) {
    ASSERT_EQ(r->grads.size(), save_all.grads.size());
    for (size_t i = 0; i < r->grads.size(); ++i)
      EXPECT_TRUE(remat::testing::bitwise_equal(r->grads[i], save_all.grads[i])) << "gradient " << i;
  }
  EXPECT_EQ(overlapped.count.waits, in_memory.count.waits) << "the offload step waited for the device more often";
  EXPECT_GT(overlapped.async, 0u) << "no value was offloaded";
  // every value went out and came back asynchronously (the loss read is the one copy to the host)
  EXPECT_EQ(overlapped.to_host, in_memory.to_host + overlapped.from_host);
  EXPECT_EQ(overlapped.async, 2 * overlapped.from_host);
  EXPECT_EQ(overlapped.device_waits, overlapped.from_host) << "a consumer did not wait on the device for its copy";
  EXPECT_EQ(synchronous.count.waits, in_memory.count.waits + synchronous.from_host)
      << "synchronous copies: one wait per value copied to host memory";
  std::printf("every-layer step, waits for the device: %llu in memory, %llu with offload:DIR,threshold=0 "
              "(%llu values offloaded; %llu with synchronous copies); save-all %llu\n",
              static_cast<unsigned long long>(in_memory.count.waits),
              static_cast<unsigned long long>(overlapped.count.waits),
              static_cast<unsigned long long>(overlapped.from_host),
              static_cast<unsigned long long>(synchronous.count.waits),
              static_cast<unsigned long long>(save_all.count.waits));
  release_offload_files();
  std::filesystem::remove_all(dir);
}
