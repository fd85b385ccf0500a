// The CUDA backend's options (BackendOptions), each on a backend of cuda:0 of its own beside the
// process's default path (test_cuda_options.h), so that one process checks both with no
// environment variable (built only with REMAT_WITH_CUDA; every test skips without a device):
//   - TF32: off by default, and a backend with it computes float32 products on TF32 cores;
//   - sixteen_bit: without it bf16 and f16 are refused with the reason; with it they convert as on
//     the CPU, and a bf16 mixed-precision GPT step under every policy equals save-all's;
//   - async: a GPT step waits for the device as often as the emulated device told to wait as CUDA
//     does, on the default path (one per index check and time mark, and the loss read) and with
//     async (once);
//   - copy_stream: offloaded device values copied on the copy stream, without more waits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "emulated_backend.h"
#include "test_cuda_common.h"

using namespace remat;
using namespace remat::testing::cuda_tests;
using remat::testing::CudaWithOptions;

// TF32 is a backend option, off by default (float32 means float32); a backend with it computes
// float32 products on TF32 tensor cores.
TEST(Cuda, Tf32IsAnOptionOffByDefault) {
  REQUIRE_GPU();
  EXPECT_EQ(backend(kGpu).options().tf32, default_backend_options().tf32);
  // a float32 GEMM with TF32 off matches the float64 product to float32 accuracy
  const Tensor a = randn({256, 512}, DType::f32, RngState{4, 0}), b = randn({512, 128}, DType::f32, RngState{5, 0});
  const std::vector<double> want = matmul(a.to(DType::f64), b.to(DType::f64)).to_vector();
  auto max_error = [&] {
    const std::vector<double> got = matmul(a.to(kGpu), b.to(kGpu)).to(kCpu).to_vector();
    double e = 0;
    for (size_t i = 0; i < got.size(); ++i) e = std::max(e, std::abs(got[i] - want[i]));
    return e;
  };
  if (backend(kGpu).options().tf32) GTEST_SKIP() << "cuda:0 runs with tf32 (REMAT_BACKEND_OPTIONS)";
  const double f32_error = max_error();
  EXPECT_LT(f32_error, 1e-3);
  double tf32_error = 0;
  {
    CudaWithOptions tf32({.tf32 = true});
    EXPECT_TRUE(backend(kGpu).options().tf32);
    EXPECT_NE(describe_backend_options(kGpu).text.find("tf32"), std::string::npos);
    tf32_error = max_error();
  }
  EXPECT_GT(tf32_error, f32_error);  // the option takes effect: products with about 10 bits of mantissa
  EXPECT_LT(tf32_error, 0.5);
  EXPECT_LT(max_error(), tf32_error);  // and the process's backend is as it was
}

// bf16 and f16 live on the GPU only with the backend option sixteen_bit (docs/backends.md):
// without it, making one there is a remat::Error naming the device, the dtype and why (its
// kernels have not passed a device check; the option); with it, conversions to and from them (the
// copy kernel) and fill give the CPU's bits, rounded once to nearest even.
TEST(Cuda, SixteenBitTensorsOnlyWithTheOption) {
  REQUIRE_GPU();
  if (backend(kGpu).holds(DType::bf16)) GTEST_SKIP() << "cuda:0 runs with sixteen_bit (REMAT_BACKEND_OPTIONS)";
  EXPECT_FALSE(backend(kGpu).holds(DType::f16));
  for (DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    try {
      (void)zeros({3, 5}, dtype, memory::Tag::other, kGpu);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string message = e.what();
      for (const char* part : {"cuda:0", dtype_name(dtype), "has not passed a device check", "sixteen_bit"})
        EXPECT_NE(message.find(part), std::string::npos) << message;
    }
    EXPECT_THROW((void)full({4}, 1.0, DType::f32).to(dtype).to(kGpu), Error);
  }
  CudaWithOptions sixteen_bit({.sixteen_bit = true});
  for (DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
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

// Mixed precision on the GPU (bf16 compute, float32 master weights; the option sixteen_bit): every
// policy gives save-all's gradients bitwise, on the device, and no kernel runs on the CPU.
TEST(Cuda, Bf16GptStepUnderEveryPolicyEqualsSaveAll) {
  REQUIRE_GPU();
  CudaWithOptions sixteen_bit({.sixteen_bit = true});
  nn::GPTConfig config = small_gpt();
  config.compute_dtype = DType::bf16;
  GptCase c(config);
  check_policies(c.model, c.loss(), "bf16 GPT");
  for (const auto& p : c.model.parameters()) EXPECT_EQ(p.grad().dtype(), DType::f32) << "master gradients are float32";
}

// A GPT step on cuda:0 waits for the device as often as on the emulated device told to wait as
// CUDA does (tests/test_device_sync.cpp counts where: the loss read, each index kernel's check,
// each time mark), on the default path and with the option async (then once: the loss read).
TEST(Cuda, DefaultPathWaitsWhereTheEmulatedDeviceDoes) {
  REQUIRE_GPU();
  remat::testing::EmulatedDevice emulated;
  emulated.backend.refuse_all_dtypes(Kernel::digest);  // as on CUDA: no digest kernel
  for (const bool async : {false, true}) {
    emulated.backend.backend_options.async = async;
    const CudaWithOptions cuda_options({.async = async});  // whatever REMAT_BACKEND_OPTIONS says
    for (const char* text : {"save-all", "every-layer"}) {
      uint64_t waits[2] = {0, 0};
      for (const Device device : {emulated.device, kGpu}) {
        nn::GPT model(small_gpt());
        model.to(device);
        const int64_t batch = 4, seq = small_gpt().seq;
        const Tensor ids = from_indices(token_ids(batch * seq, 61, 1), {batch, seq}, device);
        const Tensor targets = from_indices(token_ids(batch * seq, 61, 2), {batch, seq}, device);
        for (int s = 0; s < 2; ++s) {  // the second step is counted
          model.zero_grad();
          const DeviceActivity before = device_activity(device);
          Tensor loss = backward([&] { return model.loss(ids, targets); }, GradOptions{Policy::parse(text)});
          (void)loss.detach().to(kCpu).item();
          waits[device == kGpu] = device_activity(device).host_synchronizations - before.host_synchronizations;
        }
      }
      EXPECT_EQ(waits[1], waits[0]) << text << (async ? " with async" : " on the default path");
      if (async) EXPECT_EQ(waits[1], 1u) << text;
      std::printf("%s, %s: %llu waits per step on cuda:0\n", text, async ? "async" : "the default path",
                  static_cast<unsigned long long>(waits[1]));
    }
  }
}

// every-layer with every kept value offloaded (threshold=0) gives save-all's gradients. With the
// option copy_stream the values' copies run on the copy stream (Note [the copy stream] in
// src/tensor/cuda/offload_copy.cpp), every value read back is waited for on the device, and a step
// waits for the device no more often than every-layer in memory; without it no copy is
// asynchronous.
TEST(Cuda, OffloadEveryLayerCopiesOnTheCopyStream) {
  REQUIRE_GPU();
  for (const bool copy_stream : {false, true}) {
    SCOPED_TRACE(copy_stream ? "copy_stream" : "the default path");
    const CudaWithOptions cuda_options({.copy_stream = copy_stream});  // whatever REMAT_BACKEND_OPTIONS says
    TempDir dir;
    GptCase gpt;
    const std::string offload = "every-layer+offload:" + dir.path.string() + ",threshold=0";
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
      continue;
    }
    EXPECT_GT(offloaded.async_copies, 0u);
    EXPECT_GT(offloaded.device_waits, 0u);
    EXPECT_EQ(offloaded.host_synchronizations, in_memory.host_synchronizations);
  }
}
