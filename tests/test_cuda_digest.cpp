// The CUDA digest kernel (src/tensor/cuda/digest.cu), built only with REMAT_WITH_CUDA; every test
// skips with the reason when no device is usable. It is behind a switch (tensor/cuda/digest.h),
// off by default, until these pass on a device (scripts/cuda-check runs them):
//   - the device's digest is the CPU's for the same bytes, whatever the size, dtype and layout
//     (block edges, tails, strided and unaligned views);
//   - with it on, a region's recomputation check catches a changed captured scalar on the GPU as
//     on the CPU, and a GPT step under every policy (dropout on) raises no false mismatch and
//     still gives save-all's bits; a scan's check works there too;
//   - off, values on the GPU are not checked and nothing is copied to the host for them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autodiff/digest.h"
#include "gpt_steps.h"
#include "module_models.h"
#include "remat/devices.h"
#include "remat/nn.h"
#include "remat/remat.h"
#include "remat/scan.h"
#include "tensor/cuda/digest.h"

using namespace remat;

namespace {

const Device kGpu{DeviceType::cuda, 0};

// Skips the calling test (with the reason) unless cuda:0 is usable; registers its backend and
// switches the device digest on for the test's duration.
#define REQUIRE_GPU()                                                                                       \
  if (device_count(DeviceType::cuda) == 0) GTEST_SKIP() << "no CUDA device: " << unavailable_reason(DeviceType::cuda); \
  use_device(kGpu);                                                                                         \
  DigestOn digest_on

struct DigestOn {
  DigestOn() : previous(cuda::device_digest()) { cuda::set_device_digest(true); }
  ~DigestOn() { cuda::set_device_digest(previous); }
  bool previous;
};

// Contiguous values of many sizes (empty, a tail only, block edges, many blocks) and dtypes.
TensorList contiguous_cases() {
  TensorList c;
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{16}, int64_t{16383}, int64_t{16384},
                    int64_t{16385}, int64_t{1} << 20})
    c.push_back(randn({n}, DType::f32, RngState{static_cast<uint64_t>(n), 2}));
  c.push_back(randn({97, 300}, DType::f64, RngState{3, 3}));
  c.push_back(arange(0.0, 100000.0, 1.0, DType::i64));
  return c;
}

}  // namespace

TEST(CudaDigest, TheDevicesDigestIsTheCpusForEverySizeDtypeAndLayout) {
  REQUIRE_GPU();
  NoGradGuard no_grad;
  for (const Tensor& t : contiguous_cases())
    EXPECT_EQ(detail::recompute_digest(t.to(kGpu)).value(), detail::recompute_digest(t).value())
        << dtype_name(t.dtype()) << " " << shape_str(t.shape());
  // strided views on the device: transposed, sliced with a step, starting 4 bytes into a block
  Tensor m = randn({97, 300}, DType::f64, RngState{3, 3});
  Tensor g = m.to(kGpu);
  EXPECT_EQ(detail::recompute_digest(g.transpose(0, 1)).value(), detail::recompute_digest(m.transpose(0, 1)).value());
  EXPECT_EQ(detail::recompute_digest(g.slice(1, 1, 300, 3)).value(), detail::recompute_digest(m.slice(1, 1, 300, 3)).value());
  Tensor v = randn({40097}, DType::f32, RngState{5, 5});
  EXPECT_EQ(detail::recompute_digest(v.to(kGpu).slice(0, 1, 40097)).value(), detail::recompute_digest(v.slice(0, 1, 40097)).value());
}

TEST(CudaDigest, ACapturedScalarChangedIsCaughtOnTheGpuAsOnTheCpu) {
  REQUIRE_GPU();
  const std::string on_cpu = remat::testing::captured_scalar_error(kCpu);
  ASSERT_NE(on_cpu.find("'scaled'"), std::string::npos) << on_cpu;
  EXPECT_EQ(remat::testing::captured_scalar_error(kGpu), on_cpu);
}

// Pure models raise no false mismatch with the check on the device, and keep save-all's bits.
TEST(CudaDigest, AGptStepUnderEveryPolicyRaisesNoFalseMismatch) {
  REQUIRE_GPU();
  nn::GPTConfig cfg;
  cfg.vocab = 61;
  cfg.layers = 3;
  cfg.width = 32;
  cfg.heads = 4;
  cfg.seq = 16;
  cfg.dropout = 0.1;
  cfg.seed = 5;
  nn::GPT model(cfg);
  model.to(kGpu);
  const Tensor ids = remat::testing::token_ids(2, 16, 61, 1).to(kGpu);
  const Tensor targets = remat::testing::token_ids(2, 16, 61, 2).to(kGpu);
  const TensorList reference = remat::testing::gpt_gradients(model, ids, targets, Policy::save_all(), 9);
  for (const char* p : {"every-layer", "every-k:2", "selective:matmul", "dynamic:64KiB"}) {
    const TensorList got = remat::testing::gpt_gradients(model, ids, targets, Policy::parse(p), 9);
    ASSERT_EQ(got.size(), reference.size()) << p;
    for (size_t i = 0; i < got.size(); ++i) {
      Tensor a = got[i].to(kCpu).contiguous(), b = reference[i].to(kCpu).contiguous();
      EXPECT_EQ(detail::recompute_digest(a).value(), detail::recompute_digest(b).value()) << p << ": gradient " << i;
    }
  }
}

TEST(CudaDigest, AScanStepReadingAChangedScalarIsCaughtOnTheGpu) {
  REQUIRE_GPU();
  Tensor w = randn({8, 8}, DType::f32, RngState{1, 0}, 0.0, 0.4).to(kGpu).requires_grad_();
  Tensor h0 = randn({3, 8}, DType::f32, RngState{3, 0}).to(kGpu).requires_grad_();
  double scale = 0.9;
  Tensor out = scan([w, &scale](const Tensor& h, int64_t) { return tanh(mul_scalar(matmul(h, w), scale)); }, h0, 20,
                    {ScanSchedule::revolve, 3});
  scale = 1.2;
  try {
    remat::grad({sum(out)}, {w});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scan, step "), std::string::npos) << e.what();
  }
}

TEST(CudaDigest, OffValuesOnTheGpuAreNotCheckedAndNotCopied) {
  if (device_count(DeviceType::cuda) == 0) GTEST_SKIP() << "no CUDA device: " << unavailable_reason(DeviceType::cuda);
  use_device(kGpu);
  const bool previous = cuda::device_digest();
  cuda::set_device_digest(false);
  const uint64_t fallbacks = fallback_calls(kGpu);
  EXPECT_FALSE(detail::recompute_digest(randn({64}).to(kGpu)).has_value());
  EXPECT_EQ(fallback_calls(kGpu), fallbacks);
  cuda::set_device_digest(previous);
}
