// The device seam, proven on the test-only emulated device (emulated_backend.h): factories,
// explicit copies, refused host access, per-device counters, the CPU fallback for kernels a
// backend lacks, and whole programs (a checkpointed GPT training step under several policies, a
// Revolve scan) whose results on the device equal the CPU's bit for bit. The op harness runs
// every op row on this device too (test_ops.cpp).
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "checkpoint_models.h"
#include "emulated_backend.h"
#include "remat/backend.h"
#include "remat/checkpoint.h"
#include "remat/nn.h"
#include "remat/scan.h"

using namespace remat;
using remat::testing::EmulatedDevice;

namespace {

// a and b (on any devices) hold the same bits.
bool same_bits(const Tensor& a, const Tensor& b) {
  return remat::testing::bitwise_equal(a.to(kCpu), b.to(kCpu));
}

template <class F>
void expect_error_with(F&& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "no remat::Error";
  } catch (const Error& e) {
    for (const char* p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(DeviceSeam, FactoriesAllocateOnTheDeviceAndCopiesRoundTrip) {
  EmulatedDevice dev;
  const memory::Stats cpu_before = memory::stats();
  Tensor z = zeros({3, 4}, DType::f32, memory::Tag::other, dev.device);
  Tensor f = full({5}, 2.5, DType::f64, memory::Tag::other, dev.device);
  Tensor a = arange(0.0, 6.0, 1.5, DType::f32, dev.device);
  Tensor v = from_vector(std::vector<double>{1, -2, 3}, {3}, DType::f64, memory::Tag::other, dev.device);
  Tensor i = from_indices({4, 1, 7}, {3}, dev.device);
  Tensor r = randn({2, 3}, DType::f32, RngState{5, 0}, 0.0, 1.0, dev.device);
  for (const Tensor* t : {&z, &f, &a, &v, &i, &r}) EXPECT_EQ(t->device(), dev.device);
  // every byte is on the device's account, none on the CPU's
  EXPECT_EQ(memory_stats(dev.device).live_total, z.nbytes() + f.nbytes() + a.nbytes() + v.nbytes() + i.nbytes() + r.nbytes());
  EXPECT_EQ(memory::stats().live_total, cpu_before.live_total);
  EXPECT_EQ(f.to(kCpu).to_vector(), std::vector<double>(5, 2.5));
  EXPECT_EQ(a.to(kCpu).to_vector(), (std::vector<double>{0, 1.5, 3, 4.5}));
  EXPECT_EQ(v.to(kCpu).to_vector(), (std::vector<double>{1, -2, 3}));
  EXPECT_EQ(i.to(kCpu).to_vector(), (std::vector<double>{4, 1, 7}));
  EXPECT_TRUE(same_bits(r, randn({2, 3}, DType::f32, RngState{5, 0})));  // the same draws as on the CPU
  // a strided view crosses devices in both directions
  Tensor host = randn({4, 6}, DType::f64, RngState{9, 0});
  Tensor view = host.transpose(0, 1).slice(0, 1, 5);
  EXPECT_TRUE(same_bits(view.to(dev.device), view));
  Tensor on_dev = host.to(dev.device);
  EXPECT_TRUE(same_bits(on_dev.transpose(0, 1).slice(0, 1, 5).to(kCpu), view));
  EXPECT_GT(dev.backend.host_to_device, 0u);
  EXPECT_GT(dev.backend.device_to_host, 0u);
}

TEST(DeviceSeam, HostAccessNeedsAnExplicitCopy) {
  EmulatedDevice dev;
  Tensor t = ones({2, 2}, DType::f32, memory::Tag::other, dev.device);
  expect_error_with([&] { (void)t.data<float>(); }, {"emulated:0", "not in host memory", ".to(remat::kCpu)"});
  expect_error_with([&] { (void)t.raw_data(); }, {"emulated:0"});
  expect_error_with([&] { (void)t.sum().item(); }, {"item", "emulated:0"});
  expect_error_with([&] { (void)t.to_vector(); }, {"to_vector", "emulated:0"});
  expect_error_with([&] { (void)t.at({0, 0}); }, {"at", "emulated:0"});
  EXPECT_NE(to_string(t).find("1"), std::string::npos);  // printing copies to the host
  EXPECT_EQ(t.sum().to(kCpu).item(), 4.0);
}

TEST(DeviceSeam, ErrorsNameTheDevices) {
  EmulatedDevice dev;
  Tensor a = ones({3}), b = ones({3}, DType::f32, memory::Tag::other, dev.device);
  expect_error_with([&] { add(a, b); }, {"add", "cpu", "emulated:0", ".to(device)"});
  expect_error_with([&] { zeros({2}, DType::f32, memory::Tag::other, Device{DeviceType::cuda, 0}); },
                    {"no backend registered for device cuda:0"});
  expect_error_with([&] { a.to(Device{DeviceType::emulated, 3}); }, {"emulated:3"});
  expect_error_with([&] { register_backend(kCpu, &dev.backend); }, {"CPU backend"});
}

TEST(DeviceSeam, ToIsDifferentiableBothWays) {
  EmulatedDevice dev;
  for (DType dtype : {DType::f32, DType::f64}) {
    Tensor x = randn({3, 5}, dtype, RngState{1, 0}).requires_grad_();
    Tensor w = randn({5, 2}, dtype, RngState{2, 0}).to(dev.device).requires_grad_();
    ScopedPolicy keep_all(Policy::save_all());  // plain ops: no layer calls to checkpoint
    Tensor y = tanh(matmul(x.to(dev.device), w)).sum();
    y.backward();
    ASSERT_EQ(x.grad().device(), kCpu);
    ASSERT_EQ(w.grad().device(), dev.device);
    Tensor xc = x.detach().requires_grad_(), wc = w.detach().to(kCpu).requires_grad_();
    tanh(matmul(xc, wc)).sum().backward();
    EXPECT_TRUE(same_bits(x.grad(), xc.grad()));
    EXPECT_TRUE(same_bits(w.grad(), wc.grad()));
  }
}

TEST(DeviceSeam, KernelsABackendLacksRunOnTheCpu) {
  EmulatedDevice dev;
  dev.backend.refuse(Kernel::softmax, DType::f32);
  dev.backend.refuse(Kernel::softmax_backward, DType::f32);
  dev.backend.refuse_all_dtypes(Kernel::adamw_step);
  Tensor x = randn({4, 7}, DType::f32, RngState{3, 0});
  Tensor xd = x.to(dev.device).requires_grad_();
  Tensor xc = x.detach().requires_grad_();
  const uint64_t before = fallback_calls(dev.device);
  Tensor yd = softmax(xd, -1), yc = softmax(xc, -1);
  EXPECT_EQ(yd.device(), dev.device);
  EXPECT_TRUE(same_bits(yd, yc));
  mul(yd, yd).sum().backward();
  mul(yc, yc).sum().backward();
  EXPECT_TRUE(same_bits(xd.grad(), xc.grad()));
  EXPECT_EQ(fallback_calls(dev.device), before + 2);  // the forward and the backward kernel
  // an in-place kernel (parameter, moments) through the fallback
  nn::AdamW on_device({xd}, {.lr = 0.1, .weight_decay = 0.01}), on_cpu({xc}, {.lr = 0.1, .weight_decay = 0.01});
  on_device.step();
  on_cpu.step();
  EXPECT_TRUE(same_bits(xd, xc));
  EXPECT_EQ(fallback_calls(dev.device), before + 3);
  // f64 softmax is supported: no fallback
  softmax(x.to(DType::f64).to(dev.device), -1);
  EXPECT_EQ(fallback_calls(dev.device), before + 3);
}

namespace {

// Calls every optional kernel at least once on `device`: forward values, gradients and the
// parameters after two SGD and two AdamW steps, all made from the same host inputs.
TensorList every_kernel(Device device) {
  ScopedPolicy keep_all(Policy::save_all());
  uint64_t seed = 1;
  auto leaf = [&](const Shape& shape) {
    return randn(shape, DType::f32, RngState{seed++, 0}).to(device).requires_grad_();
  };
  TensorList results = {arange(0.0, 6.0, 1.5, DType::f32, device),                               // arange
                        rand({3, 4}, DType::f32, RngState{50, 0}, -1.0, 1.0, device),               // rand_uniform
                        randn({3, 4}, DType::f32, RngState{51, 0}, 0.0, 1.0, device)};              // rand_normal
  // rows: gemm, gemm_bias, layer and RMS norm (and add_layer_norm), unary, binary, softmax, where, embedding, cross-entropy
  Tensor x = leaf({4, 6}), w = leaf({6, 5}), gain = leaf({5}), shift = leaf({5}), table = leaf({7, 5});
  Tensor lw = leaf({5, 6});
  Tensor h = matmul(x, w) + linear(x, lw, shift);
  TensorList hn = add_layer_norm(h, tanh(h), gain, shift);  // the residual add and norm, both outputs used
  Tensor rows = softmax(tanh(layer_norm(h, gain, shift)) + rms_norm(h, gain) + hn[0] * hn[1]);
  Tensor cond = from_vector(std::vector<double>{1, 0, 0, 1, 1}, {5}, DType::f32, memory::Tag::other, device);
  Tensor logits = where(cond, rows, h) + embedding(table, from_indices({6, 0, 2, 2}, {4}, device));
  Tensor ce = cross_entropy(logits, from_indices({0, 3, 1, 4}, {4}, device), 0.1);
  Tensor dropped = dropout(x, 0.3, RngState{52, 0});
  // images: convolution, batch norm, the three poolings
  Tensor image = leaf({2, 3, 6, 6}), filters = leaf({4, 3, 3, 3}), bias = leaf({4}), scale = leaf({4});
  Tensor y = batch_norm(conv2d(image, filters, bias, {1, 1}, {1, 1}), scale, bias, Tensor(), Tensor(), true);
  Tensor pooled = max_pool2d(y, {2, 2}).sum() + avg_pool2d(y, {2, 2}).sum() + adaptive_avg_pool2d(y, {2, 2}).sum();
  // fused attention
  Tensor q = leaf({1, 2, 5, 4}), k = leaf({1, 2, 5, 4}), v = leaf({1, 2, 5, 4});
  Tensor attended = scaled_dot_product_attention(q, k, v, true);
  Tensor loss = ce + mean(mul(dropped, dropped)) + pooled + attended.sum();  // reduce
  loss.backward();
  for (const Tensor& t : {rows, logits, ce, dropped, y, attended, loss}) results.push_back(t.detach());
  Tensor digest = Tensor::empty({1}, DType::i64, memory::Tag::other, device);  // digest
  backend(device).digest(logits.detach().transpose(0, 1), digest);
  results.push_back(digest);
  TensorList params = {x, w, gain, shift, table, image, filters, bias, scale, q, k, v, lw};
  for (const Tensor& p : params) results.push_back(p.grad());
  results.push_back(from_vector({nn::clip_grad_norm(params, 1e30)}, {1}, DType::f64).to(device));  // sum_squares
  results.push_back(from_vector({nn::clip_grad_norm(params, 1e-3)}, {1}, DType::f64).to(device));  // scale_each
  nn::SGD sgd({x, w, gain, shift, table, image, lw}, {.lr = 0.1, .momentum = 0.9});   // sgd_step
  nn::AdamW adamw({filters, bias, scale, q, k, v}, {.lr = 0.1});                  // adamw_step
  for (int step = 0; step < 2; ++step) {
    sgd.step();
    adamw.step();
  }
  for (const Tensor& p : params) results.push_back(p.detach());
  return results;
}

}  // namespace

// The dispatcher's forwarding is generated from the kernel list (remat/backend.h), each tensor
// argument marked in() or inout(): on a device that supports nothing optional, every kernel must
// still give the CPU's bits (a written tensor marked in() would lose its result), and the program
// must reach every optional kernel of the list (a kernel added to the list needs a call here).
TEST(DeviceSeam, EveryOptionalKernelGivesTheCpuResultThroughTheFallback) {
#define OPTIONAL_KERNEL(name, ...) Kernel::name,
  const std::vector<Kernel> optional = {REMAT_OPTIONAL_KERNELS(OPTIONAL_KERNEL)};
#undef OPTIONAL_KERNEL
  EmulatedDevice dev(5);
  for (Kernel kernel : optional) dev.backend.refuse_all_dtypes(kernel);
  const Device device = dev.device;
  const std::set<Kernel>& asked = dev.backend.asked;
  const TensorList on_cpu = every_kernel(kCpu);
  const uint64_t before = fallback_calls(device);
  {
    const TensorList on_device = every_kernel(device);
    ASSERT_EQ(on_device.size(), on_cpu.size());
    for (size_t i = 0; i < on_cpu.size(); ++i) {
      EXPECT_EQ(on_device[i].device(), device) << "result " << i;
      EXPECT_TRUE(same_bits(on_device[i], on_cpu[i])) << "result " << i;
    }
  }
  EXPECT_GE(fallback_calls(device) - before, asked.size());
  std::string missing;
  for (Kernel kernel : optional)
    if (asked.count(kernel) == 0) missing += std::string(" ") + kernel_name(kernel);
  EXPECT_EQ(missing, "") << "optional kernels this program does not call";
  EXPECT_EQ(asked.size(), optional.size()) << "the dispatcher asked supports() for copy or fill";
}

namespace {

struct StepResult {
  double loss = 0;
  TensorList params;  // after one AdamW step, on the CPU
  size_t device_saved_peak = 0, cpu_saved_peak = 0;
};

// One training step of a small GPT (dropout on) on `device` under `policy`, from the same
// initialisation and data on every device.
StepResult gpt_step(Device device, const std::string& policy) {
  nn::GPTConfig cfg;
  cfg.vocab = 37;
  cfg.layers = 3;
  cfg.width = 16;
  cfg.heads = 2;
  cfg.seq = 8;
  cfg.dropout = 0.1;
  cfg.seed = 11;
  nn::GPT model(cfg);
  model.to(device);
  std::vector<int64_t> ids(2 * 8), targets(2 * 8);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int64_t>((i * 7 + 3) % 37);
    targets[i] = static_cast<int64_t>((i * 5 + 1) % 37);
  }
  targets[3] = -100;  // one ignored row
  Tensor x = from_indices(ids, {2, 8}, device), y = from_indices(targets, {2, 8}, device);
  nn::AdamW opt(model.parameters(), {.lr = 1e-2, .weight_decay = 0.1});
  manual_seed(123);
  memory::reset_peaks();
  if (device.type != DeviceType::cpu) reset_peaks(device);
  Tensor loss = remat::backward([&] { return model.loss(x, y); }, {.policy = Policy::parse(policy)});
  StepResult r;
  r.cpu_saved_peak = memory::stats().peak(memory::Tag::saved);
  r.device_saved_peak = memory_stats(device).peak(memory::Tag::saved);
  nn::clip_grad_norm(model.parameters(), 0.5);
  opt.step();
  r.loss = loss.to(kCpu).item();
  for (const auto& p : model.parameters()) r.params.push_back(p.detach().to(kCpu));
  return r;
}

}  // namespace

TEST(DeviceSeam, CheckpointedTrainingStepEqualsTheCpu) {
  EmulatedDevice dev;
  for (const char* policy : {"save-all", "every-layer", "selective:matmul", "every-k:2"}) {
    SCOPED_TRACE(policy);
    StepResult cpu = gpt_step(kCpu, policy);
    StepResult emu = gpt_step(dev.device, policy);
    EXPECT_EQ(cpu.loss, emu.loss);
    ASSERT_EQ(cpu.params.size(), emu.params.size());
    for (size_t i = 0; i < cpu.params.size(); ++i) EXPECT_TRUE(same_bits(cpu.params[i], emu.params[i])) << "parameter " << i;
    // the backward's values (and what regions keep) are on the device, none on the host
    EXPECT_EQ(emu.device_saved_peak, cpu.cpu_saved_peak);
    EXPECT_EQ(emu.cpu_saved_peak, 0u);
  }
  EXPECT_EQ(memory_stats(dev.device).live(memory::Tag::saved), 0u);
}

TEST(DeviceSeam, ScanOnTheDeviceEqualsTheCpu) {
  EmulatedDevice dev;
  for (DType dtype : {DType::f32, DType::f64}) {
    auto run = [&](Device device) {
      Tensor w = randn({6, 6}, dtype, RngState{1, 0}, 0.0, 0.4).to(device).requires_grad_();
      Tensor h0 = randn({3, 6}, dtype, RngState{2, 0}).to(device).requires_grad_();
      ScanStep step = [w](const Tensor& h, int64_t) { return dropout(tanh(matmul(h, w)), 0.1); };
      manual_seed(7);
      Tensor out = scan(step, h0, 12, {ScanSchedule::revolve, 3});
      TensorList g = remat::grad({sum(out)}, {w, h0});
      return TensorList{out.detach().to(kCpu), g[0].to(kCpu), g[1].to(kCpu)};
    };
    TensorList cpu = run(kCpu), emu = run(dev.device);
    for (size_t i = 0; i < cpu.size(); ++i) EXPECT_TRUE(same_bits(cpu[i], emu[i])) << i;
  }
}

namespace {

// One SGD step of a ResNet on `device`: the loss, then every parameter and every buffer (BatchNorm's
// running statistics), on the host.
TensorList resnet_step(Device device, size_t* buffers_on_device) {
  nn::ResNet model({.stages = 2, .blocks_per_stage = 1, .width = 8, .classes = 5, .seed = 3});
  model.to(device);
  *buffers_on_device = 0;
  for (const auto& [name, b] : model.named_buffers()) *buffers_on_device += b.device() == device ? 1 : 0;
  const nn::SyntheticImages data = nn::make_synthetic_images({.count = 4, .classes = 5, .size = 16, .seed = 2});
  nn::SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9});
  Tensor loss = remat::backward([&] { return model.loss(data.images.to(device), data.labels.to(device)); },
                                {.policy = Policy::every_layer()});
  opt.step();
  TensorList out{loss.to(kCpu)};
  for (const auto& p : model.parameters()) out.push_back(p.detach().to(kCpu));
  for (const auto& [name, b] : model.named_buffers()) out.push_back(b.to(kCpu));
  return out;
}

}  // namespace

TEST(DeviceSeam, ModuleToMovesBatchNormRunningStatsAndTheResNetTrainsThere) {
  EmulatedDevice dev;
  nn::BatchNorm2d bn(4);
  const auto buffers = bn.named_buffers();
  ASSERT_EQ(buffers.size(), 2u);
  EXPECT_EQ(buffers[0].first, "running_mean");
  EXPECT_EQ(buffers[1].first, "running_var");
  bn.to(dev.device);
  EXPECT_EQ(bn.running_mean.device(), dev.device);
  EXPECT_EQ(bn.running_var.device(), dev.device);
  EXPECT_EQ(bn.running_var.storage()->tag(), memory::Tag::parameter);
  EXPECT_TRUE(same_bits(bn.running_var, ones({4})));

  size_t cpu_buffers = 0, device_buffers = 0;
  const TensorList cpu = resnet_step(kCpu, &cpu_buffers);
  dev.backend.asked.clear();
  const uint64_t fallbacks = fallback_calls(dev.device);
  const TensorList emu = resnet_step(dev.device, &device_buffers);
  // 2 stages of one pre-activation block (2 BatchNorms each) and the final BatchNorm: 5 x 2
  EXPECT_EQ(device_buffers, 10u);
  EXPECT_EQ(cpu_buffers, 10u);
  EXPECT_EQ(fallback_calls(dev.device), fallbacks) << "a kernel ran on the CPU";
  EXPECT_TRUE(dev.backend.asked.count(Kernel::batch_norm_statistics));
  ASSERT_EQ(cpu.size(), emu.size());
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_TRUE(same_bits(cpu[i], emu[i])) << i;
  // the running statistics were updated (the last tensor: the last BatchNorm's running_var)
  EXPECT_FALSE(same_bits(cpu.back(), ones(cpu.back().shape())));
}
