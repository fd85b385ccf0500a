// The CUDA backend on cuda:0, end to end (built only with REMAT_WITH_CUDA; every test skips with
// the reason when no device is usable). The op harness's rows on cuda:0 are in test_ops.cpp (its
// device axis); this file holds what needs whole models:
//   - a GPT step and a ResNet step under every policy give gradients bitwise equal to save-all's on
//     the GPU, and a second run gives the same bits; so does a GPT at the benchmark's shapes;
//   - no kernel of those steps falls back to the CPU (fallback_calls(cuda) == 0);
//   - a checkpointed scan equals its unchecked loop, bit for bit;
//   - remat's device counters move with the driver's (cudaMemGetInfo) by the bytes allocated;
//   - the same 50-step training on the CPU and on the GPU agrees in loss to 1e-4 relative;
//   - a linear layer's product and bias match float64 and repeat bitwise, its bias gradient too;
//   - cross-entropy over masked and infinite rows follows the CPU's;
//   - bf16 and f16 tensors only with REMAT_CUDA_FAST=bf16, converted as on the CPU, and a bf16
//     mixed-precision GPT step under every policy equal to save-all's.
//   - offloaded device values copied on the copy stream (REMAT_CUDA_FAST=offload_stream).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "remat/devices.h"
#include "remat/nn.h"
#include "remat/remat.h"
#include "remat/scan.h"
#include "tensor/cuda/cuda_backend.h"

using namespace remat;

namespace {

const Device kGpu{DeviceType::cuda, 0};

// Skips the calling test (with the reason) unless cuda:0 is usable; registers its backend.
#define REQUIRE_GPU()                                                                                       \
  do {                                                                                                      \
    if (device_count(DeviceType::cuda) == 0) GTEST_SKIP() << "no CUDA device: " << unavailable_reason(DeviceType::cuda); \
    use_device(kGpu);                                                                                       \
  } while (0)

bool same_bits(const Tensor& a, const Tensor& b) {
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
std::vector<std::string> policies(size_t budget) {
  return {"every-layer", "every-k:2", "selective:matmul", detail::concat("budget:", budget),
          detail::concat("dynamic:", budget)};
}

// `steps` forward + backward passes (no update) of `loss` under `policy` on the same inputs; the
// last pass's gradients. Repeating lets the budget planner profile, then run its plan.
Gradients run_steps(nn::Module& model, const std::function<Tensor()>& loss, const std::string& policy, int steps = 3) {
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

void expect_same_gradients(const Gradients& want, const Gradients& got, const std::string& what) {
  EXPECT_EQ(want.loss, got.loss) << what;
  ASSERT_EQ(want.grads.size(), got.grads.size()) << what;
  for (size_t i = 0; i < want.grads.size(); ++i) EXPECT_TRUE(same_bits(want.grads[i], got.grads[i])) << what << ": parameter " << i;
}

nn::GPTConfig small_gpt() {
  return {.vocab = 61, .layers = 4, .width = 64, .heads = 4, .seq = 32, .dropout = 0.1, .dtype = DType::f32, .seed = 5};
}

std::vector<int64_t> token_ids(size_t n, int64_t vocab, uint64_t salt) {
  std::vector<int64_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<int64_t>((i * 7919 + salt * 104729) % static_cast<uint64_t>(vocab));
  return v;
}

// Every policy against save-all on the GPU, and save-all against itself (two runs). The budget is
// halfway between every-layer's and save-all's peak saved bytes, and the run must stay within it.
void check_policies(nn::Module& model, const std::function<Tensor()>& loss, const std::string& name) {
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

}  // namespace

TEST(Cuda, GptStepUnderEveryPolicyEqualsSaveAll) {
  REQUIRE_GPU();
  GptCase c;
  check_policies(c.model, c.loss(), "GPT");
}

// The benchmark's kernels under the bitwise test: bench_cuda_gpt's shapes (head size 64, context
// 1024, width 768, vocabulary 50304, batch 8) with 2 layers instead of 12, so that every GEMM,
// attention, norm and loss kernel the benchmark times is one this test checks. Runs on a GPU only
// (on the CPU or the emulated device the same step takes minutes; the small GPT above covers them).
TEST(Cuda, ProductionShapeGptUnderEveryPolicyEqualsSaveAll) {
  REQUIRE_GPU();
  nn::GPTConfig config;  // GPT-2 small's defaults: width 768, 12 heads, context 1024, no dropout
  config.vocab = 50304;
  config.layers = 2;
  config.seed = 1;
  nn::GPT model(config);
  model.to(kGpu);
  const int64_t batch = 8;
  const Tensor ids = from_indices(token_ids(batch * config.seq, config.vocab, 1), {batch, config.seq}, kGpu);
  const Tensor targets = from_indices(token_ids(batch * config.seq, config.vocab, 2), {batch, config.seq}, kGpu);
  check_policies(model, [&] { return model.loss(ids, targets); }, "GPT-2-small shapes, 2 layers");
}

TEST(Cuda, ResNetStepUnderEveryPolicyEqualsSaveAll) {
  REQUIRE_GPU();
  ResNetCase c;
  check_policies(c.model, c.loss(), "ResNet");
}

TEST(Cuda, ScanEqualsItsUncheckedLoop) {
  REQUIRE_GPU();
  for (DType dtype : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor w0 = randn({16, 16}, dtype, RngState{1, 0}, 0.0, 0.3).to(kGpu);
    const Tensor h0_value = randn({4, 16}, dtype, RngState{2, 0}).to(kGpu);
    auto step = [](const Tensor& w) {
      return [w](const Tensor& h, int64_t) { return dropout(tanh(matmul(h, w)), 0.1); };
    };
    // the loop, every value kept
    Tensor w = w0.detach().requires_grad_(), h0 = h0_value.detach().requires_grad_();
    manual_seed(7);
    Tensor h = h0;
    for (int64_t i = 0; i < 20; ++i) h = step(w)(h, i);
    const TensorList loop = remat::grad({sum(h)}, {w, h0});
    // the checkpointed scan
    Tensor ws = w0.detach().requires_grad_(), hs = h0_value.detach().requires_grad_();
    manual_seed(7);
    Tensor out = scan(step(ws), hs, 20, {ScanSchedule::revolve, 4});
    const TensorList scanned = remat::grad({sum(out)}, {ws, hs});
    EXPECT_TRUE(same_bits(h, out));
    EXPECT_TRUE(same_bits(loop[0], scanned[0]));
    EXPECT_TRUE(same_bits(loop[1], scanned[1]));
  }
}

TEST(Cuda, DeviceCountersFollowTheDriver) {
  REQUIRE_GPU();
  memory::Allocator& allocator = backend(kGpu).allocator();
  allocator.empty_cache();
  constexpr int64_t kElements = int64_t{96} << 20;  // 384 MiB of f32: no cached block has that size
  constexpr size_t kBytes = static_cast<size_t>(kElements) * 4;
  constexpr size_t kSlack = size_t{64} << 20;       // the driver's granularity and other processes
  const memory::Stats before = memory_stats(kGpu);
  const DeviceMemory free_before = device_memory(kGpu);
  EXPECT_GT(free_before.total_bytes, 0u);
  EXPECT_LE(free_before.free_bytes, free_before.total_bytes);
  {
    Tensor big = zeros({kElements}, DType::f32, memory::Tag::other, kGpu);
    EXPECT_EQ(memory_stats(kGpu).live_total - before.live_total, kBytes);  // remat's counters are exact
    const DeviceMemory during = device_memory(kGpu);
    EXPECT_GE(free_before.free_bytes - during.free_bytes + kSlack, kBytes) << "the driver saw less than was allocated";
    EXPECT_LE(free_before.free_bytes - during.free_bytes, kBytes + kSlack) << "the driver saw more than was allocated";
  }
  EXPECT_EQ(memory_stats(kGpu).live_total, before.live_total);
  allocator.empty_cache();  // the freed block was cached; now it goes back to the driver
  const DeviceMemory after = device_memory(kGpu);
  EXPECT_GE(after.free_bytes + kSlack, free_before.free_bytes);
  // an allocation that cannot be met is a remat::Error, and the counters are unchanged
  const memory::Stats stats = memory_stats(kGpu);
  EXPECT_THROW(zeros({static_cast<int64_t>(after.total_bytes / 4) + 1}, DType::f32, memory::Tag::other, kGpu), Error);
  EXPECT_EQ(memory_stats(kGpu).live_total, stats.live_total);
}

TEST(Cuda, TrainingOnTheGpuFollowsTheCpu) {
  REQUIRE_GPU();
  constexpr int kSteps = 50;
  const int64_t batch = 4, seq = 32;
  auto train = [&](Device device) {
    nn::GPT model(small_gpt());
    model.to(device);
    nn::AdamW optimizer(model.parameters(), {.lr = 3e-3, .weight_decay = 0.01});
    std::vector<double> losses;
    for (int step = 0; step < kSteps; ++step) {
      const Tensor ids = from_indices(token_ids(batch * seq, 61, 3 + step), {batch, seq}, device);
      const Tensor targets = from_indices(token_ids(batch * seq, 61, 1000 + step), {batch, seq}, device);
      optimizer.zero_grad();
      manual_seed(static_cast<uint64_t>(step));  // the dropout masks are the CPU's on the GPU
      Tensor loss = backward([&] { return model.loss(ids, targets); }, GradOptions{Policy::every_layer()});
      nn::clip_grad_norm(model.parameters(), 1.0);
      optimizer.step();
      losses.push_back(loss.detach().to(kCpu).item());
    }
    return losses;
  };
  const std::vector<double> cpu = train(kCpu), gpu = train(kGpu);
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i)
    EXPECT_NEAR(gpu[i], cpu[i], 1e-4 * std::abs(cpu[i])) << "step " << i + 1;
  EXPECT_LT(cpu.back(), cpu.front());  // it trained
}

// The gradient norm's sum of squares (sum_squares) on the GPU, on the default path or the
// grad_norm switch's two launches: within float64 rounding of the CPU's for gradients of many
// sizes (chunk boundaries, an empty one, more than one batch of tensors with 300), the same bits
// on every call, and a list of one dtype and of mixed contiguity handled.
TEST(Cuda, GradientNormFollowsTheCpuAndRepeatsItsBits) {
  REQUIRE_GPU();
  for (const size_t count : {size_t{7}, size_t{300}}) {
    TensorList cpu_grads, gpu_grads;
    for (size_t i = 0; i < count; ++i) {
      const int64_t n = i % 7 == 3 ? 0 : static_cast<int64_t>((i * 7919) % 40000 + 1);
      const Tensor g = randn({n}, DType::f32, RngState{900 + i, 0});
      cpu_grads.push_back(g);
      gpu_grads.push_back(g.to(kGpu));
    }
    gpu_grads.push_back(randn({16, 20}, DType::f32, RngState{7, 0}).to(kGpu).transpose(0, 1));
    cpu_grads.push_back(gpu_grads.back().to(kCpu));
    const Tensor on_cpu = Tensor::empty({}, DType::f64);
    backend(kCpu).sum_squares(cpu_grads, on_cpu);
    double first = 0;
    for (int call = 0; call < 3; ++call) {
      const Tensor out = Tensor::empty({}, DType::f64, memory::Tag::other, kGpu);
      backend(kGpu).sum_squares(gpu_grads, out);
      const double value = out.to(kCpu).item();
      if (call == 0) first = value;
      EXPECT_EQ(std::memcmp(&value, &first, sizeof(double)), 0) << "call " << call << " of " << count;
    }
    EXPECT_NEAR(first, on_cpu.item(), 1e-6 * on_cpu.item()) << count << " gradients";
  }
}

TEST(Cuda, Tf32IsOffByDefaultAndSwitchable) {
  REQUIRE_GPU();
  EXPECT_FALSE(allow_tf32());
  // a float32 GEMM with TF32 off matches the float64 product to float32 accuracy
  const Tensor a = randn({256, 512}, DType::f32, RngState{4, 0}), b = randn({512, 128}, DType::f32, RngState{5, 0});
  const std::vector<double> want = matmul(a.to(DType::f64), b.to(DType::f64)).to_vector();
  auto max_error = [&] {
    const std::vector<double> got = matmul(a.to(kGpu), b.to(kGpu)).to(kCpu).to_vector();
    double e = 0;
    for (size_t i = 0; i < got.size(); ++i) e = std::max(e, std::abs(got[i] - want[i]));
    return e;
  };
  const double f32_error = max_error();
  EXPECT_LT(f32_error, 1e-3);
  set_allow_tf32(true);
  EXPECT_TRUE(allow_tf32());
  const double tf32_error = max_error();
  set_allow_tf32(false);
  EXPECT_GT(tf32_error, f32_error);  // the switch takes effect: products with about 10 bits of mantissa
  EXPECT_LT(tf32_error, 0.5);
}

// A linear layer's product and bias (gemm_bias: with REMAT_CUDA_FAST=gemm_epilogue one cuBLASLt
// call with the bias epilogue, its algorithm cached) at GPT-2 small's fc shape, folded and batched:
// float32 accuracy against float64, the same bits on a second call, and the bias gradient (with
// REMAT_CUDA_FAST=bias_grad the sliced column sums) against a float64 sum of the output.
TEST(Cuda, LinearProductAndBiasMatchFloat64AndRepeatBitwise) {
  REQUIRE_GPU();
  const Tensor x = randn({2, 96, 768}, DType::f32, RngState{6, 0}), w = randn({3072, 768}, DType::f32, RngState{7, 0});
  const Tensor b = randn({3072}, DType::f32, RngState{8, 0});
  for (const bool strided : {false, true}) {
    auto input = [&](const Tensor& t) { return strided ? t.transpose(0, 1).contiguous().transpose(0, 1) : t; };
    const std::vector<double> want =
        linear(input(x.to(DType::f64)), w.to(DType::f64), b.to(DType::f64)).contiguous().to_vector();
    const Tensor xg = input(x.to(kGpu)), wg = w.to(kGpu), bg = b.to(kGpu).requires_grad_();
    const Tensor first = linear(xg, wg, bg), second = linear(xg, wg, bg);
    EXPECT_TRUE(same_bits(first, second)) << (strided ? "batched" : "folded");
    const std::vector<double> got = first.contiguous().to(kCpu).to_vector();
    ASSERT_EQ(got.size(), want.size());
    double error = 0;
    for (size_t i = 0; i < got.size(); ++i) error = std::max(error, std::abs(got[i] - want[i]));
    EXPECT_LT(error, 1e-3) << (strided ? "batched" : "folded");
    mul(first, first).sum().backward();  // the bias gradient: 2 * first, summed over the 192 rows
    const std::vector<double> gb = bg.grad().to(kCpu).to_vector();
    ASSERT_EQ(gb.size(), size_t{3072});
    for (size_t c = 0; c < gb.size(); ++c) {
      double sum = 0, magnitude = 0;
      for (size_t r = 0; r < 192; ++r) sum += 2 * got[r * 3072 + c], magnitude += std::abs(2 * got[r * 3072 + c]);
      EXPECT_LE(std::abs(gb[c] - sum), 1e-5 * magnitude + 1e-4) << "column " << c;
    }
  }
}

// Whether this process runs with REMAT_CUDA_FAST=cross_entropy (alone or in "all").
bool cross_entropy_switch() {
  const std::vector<std::string> on = cuda::fast_paths_on();
  return std::find(on.begin(), on.end(), "cross_entropy") != on.end();
}

// Cross-entropy over rows with masked (-inf) logits, a row masked but for its target, and rows with
// a +inf or a NaN logit: the loss and the logits' gradient follow the CPU's (NaN where it has NaN),
// with label smoothing, on the default kernels (the op keeps the [N, C] log-softmax) and with
// REMAT_CUDA_FAST=cross_entropy (it keeps the logits and lse [N]: the online row kernel, which
// must keep the two-pass results for infinities, and the lse backward).
TEST(Cuda, CrossEntropyOfMaskedAndInfiniteRowsFollowsTheCpu) {
  REQUIRE_GPU();
  const bool lse_form = cross_entropy_switch();
  EXPECT_EQ(backend(kGpu).cross_entropy_keeps_log_softmax(), !lse_form);
  const int64_t rows = 6, cols = 700;
  std::vector<double> v(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37 * static_cast<double>(i)) * 4.0;
  auto at = [&](int64_t r, int64_t c) -> double& { return v[static_cast<size_t>(r * cols + c)]; };
  for (int64_t c = 0; c < cols; c += 3) at(1, c) = -INFINITY;  // every third logit masked
  for (int64_t c = 0; c < cols; ++c)
    if (c != 5) at(2, c) = -INFINITY;  // only the target left
  for (int64_t c = 0; c < 300; ++c) at(3, c) = -INFINITY;  // a masked prefix
  at(4, 123) = INFINITY;
  at(5, 77) = NAN;
  const std::vector<int64_t> t = {1, 2, 5, 400, 9, 10};
  for (const double smoothing : {0.0, 0.1}) {
    std::vector<std::vector<double>> results[2];
    for (const Device device : {kCpu, kGpu}) {
      const Tensor logits = from_vector(v, {rows, cols}, DType::f32).to(device).requires_grad_();
      const Tensor loss = cross_entropy(logits, from_indices(t, {rows}).to(device), smoothing);
      // saved: the targets, the weight and lse [N] with the logits, or the [N, C] log-softmax
      const size_t kept = device == kGpu && !lse_form ? rows * cols * 4 : rows * 4 + rows * cols * 4;
      EXPECT_EQ(loss.grad_fn()->saved_bytes(), rows * sizeof(int64_t) + 4 + kept) << device_name(device);
      loss.backward();
      results[device == kGpu].push_back({loss.detach().to(kCpu).item()});
      results[device == kGpu].push_back(logits.grad().to(kCpu).to_vector());
    }
    for (size_t k = 0; k < 2; ++k) {
      const std::vector<double>& cpu = results[0][k];
      const std::vector<double>& gpu = results[1][k];
      ASSERT_EQ(cpu.size(), gpu.size());
      for (size_t i = 0; i < cpu.size(); ++i) {
        if (std::isnan(cpu[i])) {
          EXPECT_TRUE(std::isnan(gpu[i])) << "result " << k << " element " << i << " smoothing " << smoothing;
          continue;
        }
        EXPECT_NEAR(gpu[i], cpu[i], 1e-5 * (1 + std::abs(cpu[i]))) << "result " << k << " element " << i
                                                                    << " smoothing " << smoothing;
      }
    }
  }
}

// The kernels' two forms called directly, whatever the switch (so the default stage of the device
// check runs the [N] form too, and REMAT_CUDA_FAST=async its checked kernel): at GPT-2's
// vocabulary with ignored rows and smoothing, lse [N] and the [N, C] log-softmax give the same
// losses and gradients; bit for bit with the switch, where both forward kernels are the online
// one, within float32 rounding against the default two-pass kernel; the gradient of the [N, C]
// form does not read the logits (they are undefined).
TEST(Cuda, CrossEntropyKernelFormsAgree) {
  REQUIRE_GPU();
  const int64_t rows = 24, cols = 50257;
  const Tensor x = randn({rows, cols}, DType::f32, RngState{71, 0}, 0.0, 3.0).to(kGpu);
  std::vector<int64_t> t(rows);
  for (int64_t r = 0; r < rows; ++r) t[static_cast<size_t>(r)] = r % 5 == 2 ? -100 : (r * 7919) % cols;
  const Tensor targets = from_indices(t, {rows}).to(kGpu), gloss = full({rows}, 1.0 / rows).to(kGpu);
  Backend& b = backend(kGpu);
  for (const double smoothing : {0.0, 0.1}) {
    auto empty = [](const Shape& shape) { return Tensor::empty(shape, DType::f32, memory::Tag::other, kGpu); };
    Tensor losses[2] = {empty({rows}), empty({rows})}, grads[2] = {empty({rows, cols}), empty({rows, cols})};
    Tensor scale = empty({}), lse = empty({rows}), logp = empty({rows, cols});
    b.cross_entropy(x, targets, smoothing, -100, losses[0], lse, scale);
    b.cross_entropy(x, targets, smoothing, -100, losses[1], logp, scale);
    b.cross_entropy_backward(x, lse, targets, gloss, smoothing, -100, grads[0]);
    b.cross_entropy_backward(Tensor(), logp, targets, gloss, smoothing, -100, grads[1]);
    if (cross_entropy_switch()) {
      EXPECT_TRUE(same_bits(losses[0], losses[1])) << smoothing;
      EXPECT_TRUE(same_bits(grads[0], grads[1])) << smoothing;
      continue;
    }
    for (int k = 0; k < 2; ++k) {
      const std::vector<double> a = (k ? grads : losses)[0].to(kCpu).to_vector();
      const std::vector<double> c = (k ? grads : losses)[1].to(kCpu).to_vector();
      for (size_t i = 0; i < a.size(); ++i)
        ASSERT_NEAR(a[i], c[i], 1e-5 * (std::abs(c[i]) + (k ? 1.0 / rows : 1.0))) << k << " " << i << " " << smoothing;
    }
  }
}

// The residual add fused into layer norm (add_layer_norm; with REMAT_CUDA_FAST=residual_norm one
// kernel each way, residual_norm.cu) at GPT-2 small's width and past the fused kernel's 2048
// columns: the sum, the norm and every gradient against float64, the same bits on a second call,
// and the bits of the unfused kernels (add, then layer_norm; layer_norm_backward, then add).
TEST(Cuda, ResidualNormMatchesFloat64AndTheUnfusedKernelsBitwise) {
  REQUIRE_GPU();
  for (const Shape shape : {Shape{2, 96, 768}, Shape{3, 2100}}) {
    const int64_t c = shape.back();
    const Tensor x = randn(shape, DType::f32, RngState{21, 0}), r = randn(shape, DType::f32, RngState{22, 0});
    const Tensor w = randn({c}, DType::f32, RngState{23, 0}, 1.0, 0.2), b = randn({c}, DType::f32, RngState{24, 0});
    const Tensor gs = randn(shape, DType::f32, RngState{25, 0}), gy = randn(shape, DType::f32, RngState{26, 0});
    auto fused = [](const TensorList& in, const TensorList& cotangents) {
      const TensorList hn = add_layer_norm(in[0], in[1], in[2], in[3]);
      TensorList out = {hn[0].detach(), hn[1].detach()};
      for (const Tensor& g : grad(hn, in, cotangents)) out.push_back(g);
      return out;
    };
    auto unfused = [](const TensorList& in, const TensorList& cotangents) {
      const Tensor s = add(in[0], in[1]);
      const TensorList hn = {s, layer_norm(s, in[2], in[3])};
      TensorList out = {hn[0].detach(), hn[1].detach()};
      for (const Tensor& g : grad(hn, in, cotangents)) out.push_back(g);
      return out;
    };
    auto on = [](const Tensor& t, Device d, DType dtype) { return t.to(dtype).to(d).requires_grad_(); };
    const TensorList in_gpu = {on(x, kGpu, DType::f32), on(r, kGpu, DType::f32), on(w, kGpu, DType::f32),
                               on(b, kGpu, DType::f32)};
    const TensorList cot_gpu = {gs.to(kGpu), gy.to(kGpu)};
    const TensorList first = fused(in_gpu, cot_gpu), second = fused(in_gpu, cot_gpu), plain = unfused(in_gpu, cot_gpu);
    const TensorList in64 = {on(x, kCpu, DType::f64), on(r, kCpu, DType::f64), on(w, kCpu, DType::f64),
                             on(b, kCpu, DType::f64)};
    const TensorList want = unfused(in64, {gs.to(DType::f64), gy.to(DType::f64)});
    const char* names[] = {"s", "y", "dx", "dr", "dweight", "dbias"};
    ASSERT_EQ(first.size(), 6u);
    for (size_t i = 0; i < first.size(); ++i) {
      EXPECT_TRUE(same_bits(first[i], second[i])) << names[i] << " " << shape_str(shape) << ": a second call differs";
      EXPECT_TRUE(same_bits(first[i], plain[i])) << names[i] << " " << shape_str(shape) << ": not the unfused bits";
      const std::vector<double> got = first[i].to(kCpu).to_vector(), ref = want[i].to_vector();
      ASSERT_EQ(got.size(), ref.size());
      double error = 0, magnitude = 0;
      for (size_t k = 0; k < got.size(); ++k) {
        error = std::max(error, std::abs(got[k] - ref[k]));
        magnitude = std::max(magnitude, std::abs(ref[k]));
      }
      EXPECT_LE(error, 1e-5 * (1 + magnitude) * (i >= 4 ? 64 : 1)) << names[i] << " " << shape_str(shape);
    }
  }
}

// bf16 and f16 live on the GPU only with REMAT_CUDA_FAST=bf16 (docs/precision.md): without it,
// making one there is a remat::Error naming the device and the dtype; with it, conversions to and
// from them (the copy kernel) and fill give the CPU's bits, rounded once to nearest even.
TEST(Cuda, SixteenBitTensorsOnlyWithTheBf16Switch) {
  REQUIRE_GPU();
  const bool on = backend(kGpu).holds(DType::bf16);
  EXPECT_EQ(on, backend(kGpu).holds(DType::f16));
  for (DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    if (!on) {
      try {
        (void)zeros({3, 5}, dtype, memory::Tag::other, kGpu);
        ADD_FAILURE() << "no error";
      } catch (const Error& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find("cuda:0"), std::string::npos) << message;
        EXPECT_NE(message.find(dtype_name(dtype)), std::string::npos) << message;
      }
      EXPECT_THROW((void)full({4}, 1.0, DType::f32).to(dtype).to(kGpu), Error);
      continue;
    }
    // values across the range, ties and values rounding to infinity included, from f32 and f64
    std::vector<double> values = {0.0, -0.0, 1.0 / 3.0, 1.00390625, 1.01171875, -2.5e-39, 65519.0, 65520.0, 3.4e38, -1e300};
    const Tensor noise = randn({4096}, DType::f64, RngState{3, 0}, 0.0, 50.0);
    for (double v : noise.to_vector()) values.push_back(v);
    const auto n = static_cast<int64_t>(values.size());
    for (DType wide : {DType::f32, DType::f64}) {
      const Tensor x = from_vector(values, {n}, wide);
      const Tensor on_gpu = x.to(kGpu).to(dtype);
      EXPECT_TRUE(same_bits(x.to(dtype), on_gpu)) << "narrowing from " << dtype_name(wide);
      EXPECT_TRUE(same_bits(x.to(dtype).to(wide), on_gpu.to(wide))) << "widening to " << dtype_name(wide);
    }
    EXPECT_TRUE(same_bits(full({7, 3}, 0.1, dtype), full({7, 3}, 0.1, dtype, memory::Tag::other, kGpu)));
    const Tensor ids = from_indices({-3, 0, 7, 300, 70000}, {5});
    EXPECT_TRUE(same_bits(ids.to(dtype), ids.to(kGpu).to(dtype)));
  }
}

// Mixed precision on the GPU (bf16 compute, float32 master weights; REMAT_CUDA_FAST=bf16): every
// policy gives save-all's gradients bitwise, on the device, and no kernel runs on the CPU.
TEST(Cuda, Bf16GptStepUnderEveryPolicyEqualsSaveAll) {
  REQUIRE_GPU();
  if (!backend(kGpu).holds(DType::bf16)) GTEST_SKIP() << "cuda:0 holds no bf16 tensors without REMAT_CUDA_FAST=bf16";
  nn::GPTConfig config = small_gpt();
  config.compute_dtype = DType::bf16;
  GptCase c(config);
  check_policies(c.model, c.loss(), "bf16 GPT");
  for (const auto& p : c.model.parameters()) EXPECT_EQ(p.grad().dtype(), DType::f32) << "master gradients are float32";
}

TEST(Cuda, DescribesTheDevice) {
  REQUIRE_GPU();
  const std::string text = describe_device(kGpu);
  EXPECT_EQ(text.rfind("cuda:0: ", 0), 0u) << text;
  EXPECT_NE(text.find("sm_"), std::string::npos) << text;
  EXPECT_EQ(compiled_backends(), (std::vector<std::string>{"cpu", "cuda"}));
  const Device past{DeviceType::cuda, device_count(DeviceType::cuda)};
  EXPECT_THROW(use_device(past), Error);
  EXPECT_FALSE(has_backend(past));
}

// Last in the file: offload moves device values to host files, a path of its own.
TEST(Cuda, OffloadEqualsSaveAll) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string offload = "offload:" + dir.path.string() + ",threshold=4KiB";
  GptCase gpt;
  expect_same_gradients(run_steps(gpt.model, gpt.loss(), "save-all"), run_steps(gpt.model, gpt.loss(), offload), "GPT offload");
  ResNetCase resnet;
  expect_same_gradients(run_steps(resnet.model, resnet.loss(), "save-all"),
                        run_steps(resnet.model, resnet.loss(), offload), "ResNet offload");
}

// every-layer with every kept value offloaded (threshold=0) gives save-all's gradients. With
// REMAT_CUDA_FAST=offload_stream the values' copies run on the copy stream (Note [the copy
// stream] in src/tensor/cuda/offload_copy.cpp), every value read back is waited for on the device,
// and a step waits for the device no more often than every-layer in memory; without it no copy
// is asynchronous (the synchronous copies of before).
TEST(Cuda, OffloadEveryLayerCopiesOnTheCopyStream) {
  REQUIRE_GPU();
  TempDir dir;
  GptCase gpt;
  const std::string offload = "every-layer+offload:" + dir.path.string() + ",threshold=0";
  const std::vector<std::string> on = cuda::fast_paths_on();
  const bool copy_stream = std::find(on.begin(), on.end(), "offload_stream") != on.end();
  const Gradients save_all = run_steps(gpt.model, gpt.loss(), "save-all");
  auto one_step = [&](const std::string& policy, DeviceActivity& used) {
    run_steps(gpt.model, gpt.loss(), policy, 1);  // sets things up
    const DeviceActivity before = device_activity(kGpu);
    Gradients g = run_steps(gpt.model, gpt.loss(), policy, 1);
    const DeviceActivity after = device_activity(kGpu);
    used.host_synchronizations = after.host_synchronizations - before.host_synchronizations;
    used.async_copies = after.async_copies - before.async_copies;
    used.device_waits = after.device_waits - before.device_waits;
    return g;
  };
  DeviceActivity in_memory, offloaded;
  expect_same_gradients(save_all, one_step("every-layer", in_memory), "every-layer");
  expect_same_gradients(save_all, one_step(offload, offloaded), "every-layer offloaded");
  if (!copy_stream) {
    EXPECT_EQ(offloaded.async_copies, 0u);
    return;
  }
  EXPECT_GT(offloaded.async_copies, 0u);
  EXPECT_GT(offloaded.device_waits, 0u);
  EXPECT_EQ(offloaded.host_synchronizations, in_memory.host_synchronizations);
}

// Clipping scales the gradients with the bits of x * T(coefficient) (the CPU's mul_scalar on the
// same values), by default with the mul_scalar and copy kernels per gradient, with
// REMAT_CUDA_FAST=grad_norm in one launch (scale_each).
TEST(Cuda, ClipGradNormScalesAsMulScalar) {
  REQUIRE_GPU();
  GptCase gpt;
  run_steps(gpt.model, gpt.loss(), "save-all", 1);
  const TensorList params = gpt.model.parameters();
  TensorList before;
  for (const auto& p : params) before.push_back(p.grad().to(kCpu));
  const double norm = nn::clip_grad_norm(params, 1e30);
  const DeviceActivity from = device_activity(kGpu);
  EXPECT_EQ(nn::clip_grad_norm(params, norm / 4), norm);
  const DeviceActivity to = device_activity(kGpu);
  EXPECT_EQ(to.calls_by_kernel[static_cast<size_t>(Kernel::scale_each)] -
                from.calls_by_kernel[static_cast<size_t>(Kernel::scale_each)],
            1u);
  const double coefficient = (norm / 4) / (norm + 1e-6);
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(same_bits(params[i].grad().to(kCpu), mul_scalar(before[i], coefficient))) << "parameter " << i;
}
