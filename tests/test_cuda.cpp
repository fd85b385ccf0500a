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
//   - cross-entropy over masked and infinite rows follows the CPU's, keeping lse [N].
// The backend options, each beside the default path: test_cuda_options.cpp.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "remat/scan.h"
#include "test_cuda_common.h"

using namespace remat;
using namespace remat::testing::cuda_tests;


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

// The gradient norm's sum of squares (sum_squares) on the GPU: within float64 rounding of the
// CPU's for gradients of many sizes (an empty one, 300 of them), the same bits on every call, and
// a list of one dtype and of mixed contiguity handled.
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

// A linear layer's product and bias (gemm_bias) at GPT-2 small's fc shape, folded and batched:
// float32 accuracy against float64, the same bits on a second call, and the bias gradient against
// a float64 sum of the output.
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

// Cross-entropy over rows with masked (-inf) logits, a row masked but for its target, and rows with
// a +inf or a NaN logit: the loss and the logits' gradient follow the CPU's (NaN where it has NaN),
// with label smoothing. The op keeps the logits and lse [N] on every device (Note [cross entropy
// from checked kernels] in src/tensor/cuda/indexing.cu).
TEST(Cuda, CrossEntropyOfMaskedAndInfiniteRowsFollowsTheCpu) {
  REQUIRE_GPU();
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
      // saved: the targets, the weight, lse [N] and the logits
      EXPECT_EQ(loss.grad_fn()->saved_bytes(), rows * sizeof(int64_t) + 4 + rows * 4 + rows * cols * 4)
          << device_name(device);
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

// The kernels at GPT-2's vocabulary with ignored rows and smoothing, float32 and float64: lse [N]
// is the float64 log-sum-exp of the row within float32 rounding (bitwise in float64 terms: the
// reduction adds the row's exponentials in float64), the losses and gradient follow the CPU's,
// and a second call repeats every bit (with async, through the checked row kernel).
TEST(Cuda, CrossEntropyKeepsEachRowsLogSumExp) {
  REQUIRE_GPU();
  const int64_t rows = 24, cols = 50257;
  for (const DType dtype : {DType::f32, DType::f64}) {
    const Tensor host = randn({rows, cols}, dtype, RngState{71, 0}, 0.0, 3.0);
    const Tensor x = host.to(kGpu);
    std::vector<int64_t> t(rows);
    for (int64_t r = 0; r < rows; ++r) t[static_cast<size_t>(r)] = r % 5 == 2 ? -100 : (r * 7919) % cols;
    const Tensor targets = from_indices(t, {rows}), gloss = full({rows}, 1.0 / rows, dtype);
    Backend& b = backend(kGpu);
    for (const double smoothing : {0.0, 0.1}) {
      auto run = [&](Backend& on, Device d) {
        auto empty = [&](const Shape& shape) { return Tensor::empty(shape, dtype, memory::Tag::other, d); };
        TensorList out = {empty({rows}), empty({rows}), empty({}), empty({rows, cols})};
        const Tensor xd = d == kCpu ? host : x, td = targets.to(d), gd = gloss.to(d);
        on.cross_entropy(xd, td, smoothing, -100, out[0], out[1], out[2]);
        on.cross_entropy_backward(xd, out[1], td, gd, smoothing, -100, out[3]);
        for (Tensor& o : out) o = o.to(kCpu);
        return out;
      };
      const TensorList gpu = run(b, kGpu), again = run(b, kGpu), cpu = run(cpu_backend(), kCpu);
      for (size_t k = 0; k < gpu.size(); ++k) {
        EXPECT_TRUE(same_bits(gpu[k], again[k])) << dtype_name(dtype) << " output " << k << ": a second call differs";
        const std::vector<double> g = gpu[k].to_vector(), c = cpu[k].to_vector();
        ASSERT_EQ(g.size(), c.size());
        const double tol = dtype == DType::f32 ? 1e-5 : 1e-12;
        for (size_t i = 0; i < g.size(); ++i)
          ASSERT_NEAR(g[i], c[i], tol * (1 + std::abs(c[i]))) << dtype_name(dtype) << " output " << k << " element "
                                                              << i << " smoothing " << smoothing;
      }
      const std::vector<double> xs = host.to_vector(), lse = gpu[1].to_vector();
      for (int64_t r = 0; r < rows; ++r) {
        double m = -INFINITY, sum = 0;
        for (int64_t c = 0; c < cols; ++c) m = std::max(m, xs[static_cast<size_t>(r * cols + c)]);
        for (int64_t c = 0; c < cols; ++c) sum += std::exp(xs[static_cast<size_t>(r * cols + c)] - m);
        const double want = m + std::log(sum);
        EXPECT_NEAR(lse[static_cast<size_t>(r)], want, (dtype == DType::f32 ? 1e-6 : 1e-14) * std::abs(want))
            << dtype_name(dtype) << " row " << r;
      }
    }
  }
}

// The residual add fused into layer norm (add_layer_norm, which CUDA runs as the kernels it fuses)
// at GPT-2 small's width and past 2048 columns: the sum, the norm and every gradient against
// float64, the same bits on a second call, and the bits of the unfused ops (add, then layer_norm;
// layer_norm_backward, then add).
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

// Clipping scales the gradients with the bits of x * T(coefficient) (the CPU's mul_scalar on the
// same values): one scale_each call, the mul_scalar and copy kernels per gradient.
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
