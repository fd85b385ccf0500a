// bf16 and f16: the element types' rounding, tensors and their accounting, safetensors entries
// read and written as themselves, devices that hold no 16-bit floats, and mixed precision
// (nn::Module::set_compute_dtype): float32 master weights, 16-bit activations and saved values,
// float32 gradients, bitwise equal under every policy on the CPU and on the emulated device, and
// about half the saved bytes of float32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>

#include "checkpoint_models.h"
#include "emulated_backend.h"
#include "gpt_steps.h"
#include "remat/cpu_features.h"
#include "remat/nn.h"
#include "remat/nn/safetensors.h"
#include "remat/remat.h"
#include "temp_dir.h"

using namespace remat;
using remat::testing::bitwise_equal;

namespace {

uint16_t bf16_bits(double v) { return bfloat16(v).bits; }
uint16_t f16_bits(double v) { return float16(v).bits; }

}  // namespace

// ---- the element types

TEST(Bfloat16, RoundsToNearestEvenOnce) {
  EXPECT_EQ(bf16_bits(1.0), 0x3f80);
  EXPECT_EQ(bfloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(bf16_bits(1.0 + 0x1p-8), 0x3f80);      // a tie: to the even neighbour, 1
  EXPECT_EQ(bf16_bits(1.0 + 3 * 0x1p-8), 0x3f82);  // a tie: to the even neighbour, up
  EXPECT_EQ(bf16_bits(-2.5), 0xc020);
  // from double in one rounding: a float would first drop the 2^-40 and leave a tie (to 1)
  EXPECT_EQ(bf16_bits(1.0 + 0x1p-8 + 0x1p-40), 0x3f81);
  EXPECT_EQ(bf16_bits(1.0 + 0x1p-8 - 0x1p-40), 0x3f80);
  // overflow to infinity, NaN stays a (quiet) NaN, signed zero kept
  EXPECT_TRUE(std::isinf(static_cast<float>(bfloat16(std::numeric_limits<float>::max()))));
  EXPECT_TRUE(std::isnan(static_cast<float>(bfloat16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(static_cast<float>(bfloat16(std::numeric_limits<double>::signaling_NaN()))));
  EXPECT_EQ(bf16_bits(-0.0), 0x8000);
}

TEST(Float16, RoundsToNearestEvenOnceWithSubnormals) {
  EXPECT_EQ(f16_bits(1.0), 0x3c00);
  EXPECT_EQ(f16_bits(65504.0), 0x7bff);         // the largest finite
  EXPECT_EQ(f16_bits(65519.0), 0x7bff);         // below the midpoint to infinity
  EXPECT_EQ(f16_bits(65520.0), 0x7c00);         // the midpoint: to infinity (even)
  EXPECT_EQ(f16_bits(0x1p-24), 0x0001);         // the smallest subnormal
  EXPECT_EQ(f16_bits(0x1p-25), 0x0000);         // a tie: to zero (even)
  EXPECT_EQ(f16_bits(3 * 0x1p-25), 0x0002);     // a tie: up (even)
  EXPECT_EQ(f16_bits(1.0 + 0x1p-11 + 0x1p-40), 0x3c01);  // one rounding from double
  EXPECT_EQ(f16_bits(-0.0), 0x8000);
  EXPECT_TRUE(std::isnan(static_cast<float>(float16(std::numeric_limits<float>::quiet_NaN()))));
}

// Every non-NaN bit pattern of H converts to float and double and back to itself.
template <class H>
void expect_every_value_round_trips() {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    H h;
    h.bits = static_cast<uint16_t>(b);
    const float f = static_cast<float>(h);
    if (std::isnan(f)) continue;
    ASSERT_EQ(H(f).bits, h.bits) << std::hex << b;
    ASSERT_EQ(H(static_cast<double>(f)).bits, h.bits) << std::hex << b;
  }
}

TEST(SixteenBitFloats, EveryValueSurvivesARoundTripThroughFloat) {
  expect_every_value_round_trips<bfloat16>();
  expect_every_value_round_trips<float16>();
}

// ---- tensors

TEST(SixteenBitFloats, TensorsTakeTwoBytesAnElementInTheAccounting) {
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_STREQ(dtype_name(DType::bf16), "bf16");
  EXPECT_STREQ(dtype_name(DType::f16), "f16");
  for (DType d : {DType::bf16, DType::f16}) {
    const size_t before = memory::stats().live(memory::Tag::other);
    Tensor t = Tensor::empty({1000, 3}, d);
    EXPECT_EQ(t.nbytes(), 6000u);
    EXPECT_EQ(memory::stats().live(memory::Tag::other) - before, 6000u);
  }
}

TEST(SixteenBitFloats, ConvertPrintAndComputeInFloat32) {
  Tensor x = from_vector({1.0, 1.0 + 0x1p-8 + 0x1p-40, -3.0, 1e30}, {4}, DType::bf16);
  EXPECT_EQ(x.dtype(), DType::bf16);
  EXPECT_EQ(x.data<bfloat16>()[1].bits, 0x3f81);
  EXPECT_THROW((void)x.data<float>(), Error);
  Tensor wide = x.to(DType::f32);
  EXPECT_EQ(wide.to_vector(), (std::vector<double>{1.0, 1.0078125, -3.0, static_cast<float>(bfloat16(1e30))}));
  EXPECT_NE(to_string(x).find("1.008"), std::string::npos) << to_string(x);
  // an op: the float32 result on the same values, rounded once
  Tensor y = mul(x, x);
  EXPECT_EQ(y.dtype(), DType::bf16);
  for (int64_t i = 0; i < 4; ++i) {
    const float v = static_cast<float>(x.data<bfloat16>()[i]);
    EXPECT_EQ(y.data<bfloat16>()[i].bits, bfloat16(v * v).bits) << i;
  }
  // a sum accumulates in float32 and rounds once: 256 ones plus 1 is 257 in float32, 256 in bf16
  Tensor ones = remat::ones({257}, DType::bf16);
  EXPECT_EQ(sum(ones).item(), static_cast<double>(bfloat16(257.0f)));
}

// The level this process runs at is the one REMAT_CPU_LEVEL names (tests/at_cpu_level.sh runs this
// binary at each level the CPU has), or the widest; bf16 products in bf16 only at avx512.
TEST(SixteenBitFloats, TheKernelsRunAtTheForcedLevel) {
  const CpuFeatures& cpu = cpu_features();
  const char* forced = std::getenv("REMAT_CPU_LEVEL");
  if (forced != nullptr && *forced != '\0') {
    EXPECT_EQ(std::string(cpu_level_name(cpu.level)), forced);
    EXPECT_TRUE(cpu.forced);
  } else {
    EXPECT_EQ(cpu.level, cpu.widest);
    EXPECT_FALSE(cpu.forced);
  }
  if (cpu.level != CpuLevel::avx512) EXPECT_FALSE(cpu.bf16_products);
}

// bf16 matrix products (docs/precision.md, "bf16 matrix products, per CPU kind"): on a CPU with
// bf16 units (cpu_features().bf16_products) oneDNN's bf16 matmul, elsewhere the float32 product of
// the widened values; either way within float32 accumulation of the exact products of the float64
// reference, rounded once to bf16, and the same bits on every call.
TEST(SixteenBitFloats, MatrixProductsAccumulateInFloat32AndRepeatBitForBit) {
  const int64_t batch = 3, m = 37, k = 129, n = 53;
  ::testing::Test::RecordProperty("bf16_products", cpu_features().bf16_products ? "bf16" : "float32");
  auto values = [](int64_t count, int seed) {
    std::vector<double> v(static_cast<size_t>(count));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = std::sin(0.37 * static_cast<double>(i) + seed) * (1.0 + static_cast<double>((i * 7 + seed) % 5));
    return v;
  };
  for (const bool trans_b : {false, true}) {
    SCOPED_TRACE(trans_b ? "b transposed" : "b as it is");
    const Tensor a = from_vector(values(batch * m * k, 1), {batch, m, k}, DType::bf16);
    const Tensor b = from_vector(values(k * n, 2), trans_b ? Shape{n, k} : Shape{k, n}, DType::bf16);
    const Tensor bias = from_vector(values(n, 3), {n}, DType::bf16);
    const Tensor y = matmul(a, b, false, trans_b), z = linear(a, trans_b ? b : b.transpose(0, 1), bias);
    EXPECT_TRUE(bitwise_equal(y, matmul(a, b, false, trans_b)));
    EXPECT_TRUE(bitwise_equal(z, linear(a, trans_b ? b : b.transpose(0, 1), bias)));
    const std::vector<double> av = a.to_vector(), bv = b.to_vector(), biasv = bias.to_vector(), yv = y.to_vector(),
                              zv = z.to_vector();
    for (int64_t p = 0; p < batch; ++p)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double exact = 0, magnitude = 0;
          for (int64_t e = 0; e < k; ++e) {
            const double x = av[static_cast<size_t>((p * m + i) * k + e)];
            const double w = bv[static_cast<size_t>(trans_b ? j * k + e : e * n + j)];
            exact += x * w, magnitude += std::fabs(x * w);
          }
          // float32 accumulation: k additions of at most 2^-24 of the running magnitude each; bf16
          // rounding: 2^-9 of the result
          const size_t at = static_cast<size_t>((p * m + i) * n + j);
          const double accumulation = static_cast<double>(k) * 0x1p-24 * magnitude;
          EXPECT_NEAR(yv[at], exact, accumulation + 0x1p-8 * std::fabs(exact)) << p << " " << i << " " << j;
          const double with_bias = exact + biasv[static_cast<size_t>(j)];
          EXPECT_NEAR(zv[at], with_bias, accumulation + 0x1p-8 * std::fabs(with_bias)) << p << " " << i << " " << j;
        }
  }
}

// ---- safetensors

TEST(SixteenBitFloats, SafetensorsEntriesAreReadAndWrittenAsThemselves) {
  const std::string dir = remat::testing::fresh_dir("bf16-safetensors");
  const std::string path = dir + "/w.safetensors";
  Tensor b = randn({3, 5}, DType::f32, RngState{3, 0}).to(DType::bf16);
  Tensor h = randn({7}, DType::f32, RngState{4, 0}).to(DType::f16);
  nn::save_safetensors(path, {{"b", b}, {"h", h}});
  nn::SafetensorsFile file = nn::load_safetensors(path);
  EXPECT_EQ(file.tensors.at("b").dtype(), DType::bf16);
  EXPECT_EQ(file.tensors.at("h").dtype(), DType::f16);
  EXPECT_TRUE(bitwise_equal(file.tensors.at("b"), b));
  EXPECT_TRUE(bitwise_equal(file.tensors.at("h"), h));
  // widened on request: exact float32 values
  nn::SafetensorsFile wide = nn::load_safetensors(path, {.widen_16bit_floats = true});
  EXPECT_EQ(wide.tensors.at("b").dtype(), DType::f32);
  EXPECT_TRUE(bitwise_equal(wide.tensors.at("b"), b.to(DType::f32)));
  EXPECT_TRUE(bitwise_equal(wide.tensors.at("h"), h.to(DType::f32)));
  // a bf16 file loads into a float32 model, exactly
  nn::Linear layer(5, 3, false);
  nn::save_safetensors(path, {{"weight", b}});
  layer.load(path);
  EXPECT_TRUE(bitwise_equal(layer.weight, b.to(DType::f32)));
  std::filesystem::remove_all(dir);
}

// ---- devices

TEST(SixteenBitFloats, ADeviceThatHoldsNoneRefusesThemByName) {
  remat::testing::EmulatedDevice dev(3);
  dev.backend.holds_16bit_floats = false;  // as the CUDA backend today
  Tensor x = randn({2, 3}, DType::f32, RngState{1, 0}).to(DType::bf16);
  try {
    (void)x.to(dev.device);
    FAIL() << "expected a remat::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds no bf16"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)Tensor::empty({4}, DType::f16, memory::Tag::other, dev.device), Error);
  // float32 still goes
  EXPECT_EQ(x.to(DType::f32).to(dev.device).to(kCpu).to_vector(), x.to(DType::f32).to_vector());
}

// ---- mixed precision

namespace {

nn::GPTConfig small_gpt(std::optional<DType> compute) {
  nn::GPTConfig c;
  c.vocab = 37;
  c.layers = 3;
  c.width = 64;
  c.heads = 4;
  c.seq = 32;
  c.dropout = 0.1;
  c.seed = 5;
  c.tie_embeddings = true;  // one weight read by two layers: one compute copy, two uses
  c.compute_dtype = compute;
  return c;
}

struct Step {
  Tensor loss;
  TensorList grads;  // on the CPU
  size_t peak_saved = 0;
};

Step gpt_step(nn::GPT& model, Device device, const std::string& policy) {
  std::vector<int64_t> ids(4 * 32), targets(4 * 32);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int64_t>((i * 7 + 3) % 37);
    targets[i] = static_cast<int64_t>((i * 5 + 1) % 37);
  }
  Tensor x = from_indices(ids, {4, 32}, device), y = from_indices(targets, {4, 32}, device);
  model.zero_grad();
  manual_seed(9);
  reset_peaks(device);
  const size_t base = memory_stats(device).live(memory::Tag::saved);
  Step s;
  s.loss = remat::backward([&] { return model.loss(x, y); }, {.policy = Policy::parse(policy)});
  s.peak_saved = memory_stats(device).peak(memory::Tag::saved) - base;
  for (const auto& p : model.parameters()) s.grads.push_back(p.grad().to(kCpu));
  return s;
}

}  // namespace

TEST(MixedPrecision, MasterWeightsStayFloat32AndGradientsArriveInFloat32) {
  nn::GPT model(small_gpt(DType::bf16));
  EXPECT_EQ(model.compute_dtype(), DType::bf16);
  EXPECT_EQ(model.blocks->compute_dtype(), DType::bf16);  // the whole tree
  Step s = gpt_step(model, kCpu, "save-all");
  EXPECT_EQ(s.loss.dtype(), DType::f32);
  for (const auto& p : model.parameters()) EXPECT_EQ(p.dtype(), DType::f32);
  for (const auto& g : s.grads) {
    ASSERT_TRUE(g.defined());
    EXPECT_EQ(g.dtype(), DType::f32);
  }
  // the activations are bf16: the logits the model returns
  Tensor logits = model.forward(remat::testing::token_ids(2, 8, 37, 1));
  EXPECT_EQ(logits.dtype(), DType::bf16);
  // near the float32 model's loss from the same weights (bf16 keeps 8 bits)
  nn::GPT f32(small_gpt(std::nullopt));
  Step r = gpt_step(f32, kCpu, "save-all");
  EXPECT_NEAR(s.loss.item(), r.loss.item(), 0.02);
  // off again: float32 throughout
  model.set_compute_dtype(std::nullopt);
  EXPECT_EQ(model.forward(remat::testing::token_ids(2, 8, 37, 1)).dtype(), DType::f32);
  EXPECT_THROW(model.set_compute_dtype(DType::f64), Error);
}

TEST(MixedPrecision, GradientsUnderEveryPolicyAreSaveAllsBitForBitOnTheCpuAndTheEmulatedDevice) {
  for (Device device : {kCpu, remat::testing::emulated_device()}) {
    SCOPED_TRACE(device_name(device));
    nn::GPT model(small_gpt(DType::bf16));
    model.to(device);
    Step reference = gpt_step(model, device, "save-all");
    const std::string dir = remat::testing::fresh_dir("bf16-policies");
    const std::vector<std::string> policies = {
        "every-layer", "every-k:2", "selective:matmul", "budget:" + std::to_string(reference.peak_saved / 3),
        "dynamic:" + std::to_string(reference.peak_saved / 2), "every-layer+offload:" + dir + ",threshold=0"};
    for (const std::string& policy : policies) {
      SCOPED_TRACE(policy);
      for (int run = 0; run < 2; ++run) {  // budget: the first step profiles, the second runs the plan
        Step s = gpt_step(model, device, policy);
        EXPECT_TRUE(bitwise_equal(s.loss.to(kCpu), reference.loss.to(kCpu)));
        ASSERT_EQ(s.grads.size(), reference.grads.size());
        for (size_t i = 0; i < s.grads.size(); ++i) EXPECT_TRUE(bitwise_equal(s.grads[i], reference.grads[i])) << i;
        if (policy != "selective:matmul" && run == 1) EXPECT_LT(s.peak_saved, reference.peak_saved);  // it kept less
      }
    }
    std::filesystem::remove_all(dir);
    if (device != kCpu) {  // and the device's are the CPU's
      nn::GPT on_cpu(small_gpt(DType::bf16));
      Step c = gpt_step(on_cpu, kCpu, "every-layer");
      for (size_t i = 0; i < c.grads.size(); ++i) EXPECT_TRUE(bitwise_equal(c.grads[i], reference.grads[i])) << i;
    }
  }
}

TEST(MixedPrecision, SavedValuesTakeAboutHalfTheBytesOfFloat32) {
  for (const char* policy : {"save-all", "every-layer"}) {
    SCOPED_TRACE(policy);
    nn::GPT half(small_gpt(DType::bf16)), full(small_gpt(std::nullopt));
    const size_t h = gpt_step(half, kCpu, policy).peak_saved, f = gpt_step(full, kCpu, policy).peak_saved;
    ASSERT_GT(f, 0u);
    EXPECT_LE(static_cast<double>(h), 0.55 * static_cast<double>(f)) << h << " bf16 bytes against " << f << " f32";
    EXPECT_GE(static_cast<double>(h), 0.45 * static_cast<double>(f)) << h << " bf16 bytes against " << f << " f32";
  }
}

TEST(MixedPrecision, F16ComputesTheSameWay) {
  nn::GPT model(small_gpt(DType::f16)), f32(small_gpt(std::nullopt));
  Step save_all = gpt_step(model, kCpu, "save-all"), every_layer = gpt_step(model, kCpu, "every-layer");
  EXPECT_EQ(model.forward(remat::testing::token_ids(2, 8, 37, 1)).dtype(), DType::f16);
  EXPECT_NEAR(save_all.loss.item(), gpt_step(f32, kCpu, "save-all").loss.item(), 0.01);
  for (size_t i = 0; i < save_all.grads.size(); ++i) {
    EXPECT_EQ(save_all.grads[i].dtype(), DType::f32);
    EXPECT_TRUE(bitwise_equal(save_all.grads[i], every_layer.grads[i])) << i;
  }
}

// A 16-bit operand beside a float32 one (a layer that reads its float32 master directly) is an
// error naming both dtypes, not a silent conversion.
TEST(MixedPrecision, MixingSixteenBitAndFloat32OperandsIsAnErrorNamingBoth) {
  Tensor x = randn({2, 4}, DType::f32, RngState{1, 0}).to(DType::bf16);
  Tensor w = randn({3, 4}, DType::f32, RngState{2, 0});
  for (const auto& f : std::vector<std::function<Tensor()>>{[&] { return linear(x, w, Tensor()); },
                                                            [&] { return add(x, x.to(DType::f32)); },
                                                            [&] { return matmul(x, w.transpose(0, 1)); }}) {
    try {
      (void)f();
      ADD_FAILURE() << "expected a remat::Error";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("bf16"), std::string::npos) << m;
      EXPECT_NE(m.find("f32"), std::string::npos) << m;
      EXPECT_EQ(m.find("internal"), std::string::npos) << m;
    }
  }
}
