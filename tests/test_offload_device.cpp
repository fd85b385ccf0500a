// offload:DIR of values saved on a device other than the CPU, proven on the test-only emulated
// device (emulated_backend.h): gradients bitwise equal to save-all on the same device, the
// device's saved bytes gone while the values are offloaded and back (counted as saved) while the
// backward pass uses them, small values kept on the device, the copies running behind the
// device's work (held until done, failures raised with nothing lost), and a GPT and a ResNet step
// with no kernel run on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>

#include "checkpoint_models.h"
#include "emulated_backend.h"
#include "remat/backend.h"
#include "remat/budget.h"
#include "remat/chain.h"
#include "remat/offload.h"
#include "remat/checkpoint.h"
#include "remat/dynamic.h"
#include "remat/nn.h"
#include "temp_dir.h"

using namespace remat;
using remat::testing::EmulatedDevice;
using remat::testing::fresh_dir;

namespace {

bool same_bits(const Tensor& a, const Tensor& b) { return remat::testing::bitwise_equal(a.to(kCpu), b.to(kCpu)); }

size_t device_saved(Device device) { return memory_stats(device).live(memory::Tag::saved); }

// mean(tanh(...tanh(x W)... W)), n layers: saves x, the n activations and W, each 64 x 64 f32.
Tensor tanh_chain(const Tensor& x, const Tensor& weight, int n) {
  Tensor h = x;
  for (int i = 0; i < n; ++i) h = tanh(matmul(h, weight));
  return mean(h);
}

constexpr int kLayers = 12;
constexpr size_t kValueBytes = 64 * 64 * 4;

// The weight's gradient of the chain under save-all.
Tensor save_all_gradient(const Tensor& x, const Tensor& weight) {
  ScopedPolicy keep(Policy::save_all());
  return remat::grad(TensorList{tanh_chain(x, weight, kLayers)}, {weight})[0];
}

// The chain's inputs on a device (seeds `seed` and `seed + 1`), its save-all gradient, and a target
// in `dir` that offloads every value of the chain (threshold 1 KiB).
struct ChainCase {
  Tensor weight, x, reference;
  OffloadTarget options;
  ChainCase(Device device, uint64_t seed, const std::string& dir) {
    weight = randn({64, 64}, DType::f32, RngState{seed, 0}, 0.0, 0.12).to(device).requires_grad_();
    x = randn({64, 64}, DType::f32, RngState{seed + 1, 0}).to(device);
    reference = save_all_gradient(x, weight);
    options.directory = dir;
    options.threshold_bytes = 1024;
  }
  // The chain under offload with nothing failing gives save-all's gradient.
  void expect_a_healthy_run_equals_save_all() const {
    OffloadScope scope(options);
    Tensor got = remat::grad(TensorList{tanh_chain(x, weight, kLayers)}, {weight})[0];
    EXPECT_TRUE(same_bits(got, reference));
  }
};

}  // namespace

TEST(OffloadOnADevice, GradientsEqualSaveAllAndSavedBytesLeaveTheDevice) {
  EmulatedDevice dev;
  const std::string dir = fresh_dir("offload-device");
  Tensor weight = randn({64, 64}, DType::f32, RngState{3, 0}, 0.0, 0.12).to(dev.device).requires_grad_();
  Tensor x = randn({64, 64}, DType::f32, RngState{4, 0}).to(dev.device);

  const Tensor reference = save_all_gradient(x, weight);
  // under save-all the device keeps x, the n activations and the weight (a plain tensor here, not
  // a module's parameter) as saved values until the backward pass
  const size_t save_all_saved = (kLayers + 2) * kValueBytes;
  {
    ScopedPolicy keep(Policy::save_all());
    Tensor loss = tanh_chain(x, weight, kLayers);
    EXPECT_EQ(device_saved(dev.device), save_all_saved);
  }
  ASSERT_EQ(reference.device(), dev.device);

  // threshold 1 KiB: every value goes to the host and the file; 1 MiB: every value stays
  for (size_t threshold : {size_t{1024}, size_t{1} << 20}) {
    SCOPED_TRACE(threshold);
    const bool moves = threshold <= kValueBytes;
    reset_counters();
    const uint64_t to_host = dev.backend.device_to_host, to_device = dev.backend.host_to_device;
    const uint64_t fallbacks = fallback_calls(dev.device);
    Tensor got;
    {
      OffloadTarget options;
      options.directory = dir;
      options.threshold_bytes = threshold;
      OffloadScope scope(options);
      Tensor loss = tanh_chain(x, weight, kLayers);
      scope.wait_for_writes();
      EXPECT_EQ(device_saved(dev.device), moves ? 0 : save_all_saved);
      EXPECT_EQ(memory::live_bytes(memory::Tag::saved), 0u) << "host copies are dropped once written";
      EXPECT_EQ(counters().dynamic.bytes_offloaded, moves ? (kLayers + 2) * kValueBytes : 0);
      EXPECT_EQ(dev.backend.device_to_host - to_host, moves ? kLayers + 2 : 0u);
      reset_peaks(dev.device);
      got = remat::grad(TensorList{loss}, {weight})[0];
      // read back onto the device and counted as saved there while the backward used them
      if (moves) EXPECT_GE(memory_stats(dev.device).peak(memory::Tag::saved), kValueBytes);
      EXPECT_EQ(dev.backend.host_to_device - to_device, moves ? kLayers + 2 : 0u);
    }
    EXPECT_EQ(got.device(), dev.device);
    EXPECT_TRUE(same_bits(got, reference));
    EXPECT_EQ(fallback_calls(dev.device), fallbacks) << "a kernel ran on the CPU";
    EXPECT_EQ(device_saved(dev.device), 0u);
    EXPECT_EQ(memory::live_bytes(memory::Tag::saved), 0u);
  }
  release_offload_files();
  std::filesystem::remove_all(dir);
}

TEST(OffloadOnADevice, AFailedWriteKeepsTheValueAndItComesBackToTheDevice) {
  EmulatedDevice dev;
  const std::string dir = fresh_dir("offload-device-full");
  ChainCase c(dev.device, 5, dir);
  const Tensor &weight = c.weight, &x = c.x;
  const OffloadTarget& options = c.options;
  OffloadFaults full;
  full.fail_after_bytes = 4 * kValueBytes;  // the fifth write fails, as on a full disk
  bool failed = false;
  try {
    OffloadScope scope(options, full);
    Tensor loss = tanh_chain(x, weight, kLayers);
    scope.wait_for_writes();
    (void)remat::grad(TensorList{loss}, {weight});
  } catch (const Error& e) {
    failed = true;
    EXPECT_NE(std::string(e.what()).find("nothing was lost"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(failed);
  EXPECT_EQ(device_saved(dev.device), 0u);
  c.expect_a_healthy_run_equals_save_all();  // the same program under a healthy disk
  release_offload_files();
  std::filesystem::remove_all(dir);
}

// The copies to host memory run behind the device's work (emulated: their bytes move when the copy
// completes), so the device storage is held, and counted as saved on the device, until each copy
// is done: the values saved last are still being copied when the forward ends, then
// wait_for_writes lets them all go. No wait for the device was made for them.
TEST(OffloadOnADevice, DeviceValuesAreHeldUntilTheirCopiesAreDone) {
  EmulatedDevice dev;
  const std::string dir = fresh_dir("offload-device-async");
  ChainCase c(dev.device, 3, dir);
  const Tensor &weight = c.weight, &x = c.x;
  Tensor got;
  {
    OffloadScope scope(c.options);
    const uint64_t waits = dev.backend.waits;
    Tensor loss = tanh_chain(x, weight, kLayers);
    EXPECT_EQ(dev.backend.waits, waits) << "a copy to host memory waited for the device";
    EXPECT_GT(dev.backend.copies_in_flight(), 0u);
    EXPECT_EQ(device_saved(dev.device), dev.backend.copies_in_flight() * kValueBytes)
        << "a value whose copy runs is not held on the device (or one whose copy is done still is)";
    scope.wait_for_writes();
    EXPECT_EQ(dev.backend.copies_in_flight(), 0u);
    EXPECT_EQ(device_saved(dev.device), 0u);
    got = remat::grad(TensorList{loss}, {weight})[0];
  }
  EXPECT_TRUE(same_bits(got, c.reference));
  release_offload_files();
  std::filesystem::remove_all(dir);
}

// A copy that fails raises a remat::Error that says nothing was lost, at a defined point: a copy
// to host memory at the next pack, unpack or wait_for_writes (the value stays on its device); a
// copy back to the device at the unpack that needed it (the host copy stays), so the backward pass
// fails before it commits a gradient. The same program then gives save-all's gradient.
TEST(OffloadOnADevice, AFailedCopyRaisesAndLosesNothing) {
  EmulatedDevice dev;
  const std::string dir = fresh_dir("offload-device-copy-fault");
  ChainCase c(dev.device, 5, dir);
  const Tensor &weight = c.weight, &x = c.x;
  const OffloadTarget& options = c.options;
  const uint64_t values = kLayers + 2;
  for (const uint64_t failing : {uint64_t{3}, values + 4}) {  // the third copy out; the fourth back
    SCOPED_TRACE(failing);
    dev.backend.fail_async_copy = dev.backend.async_copies + failing;
    std::string error;
    bool in_forward = false;
    try {
      OffloadScope scope(options);
      Tensor loss = tanh_chain(x, weight, kLayers);
      try {
        scope.wait_for_writes();
      } catch (const Error&) {
        in_forward = true;
        throw;
      }
      EXPECT_FALSE(weight.grad().defined());
      loss.backward();
    } catch (const Error& e) {
      error = e.what();
    }
    ASSERT_FALSE(error.empty()) << "no error";
    EXPECT_NE(error.find("nothing was lost"), std::string::npos) << error;
    EXPECT_NE(error.find("injected for a test"), std::string::npos) << error;
    if (failing <= values) {
      EXPECT_NE(error.find("to host memory failed"), std::string::npos) << error;
    } else {
      EXPECT_FALSE(in_forward);
      EXPECT_NE(error.find("back to emulated:0 failed"), std::string::npos) << error;
    }
    EXPECT_FALSE(weight.grad().defined()) << "a gradient was committed";
    EXPECT_EQ(device_saved(dev.device), 0u);
    EXPECT_EQ(memory::live_bytes(memory::Tag::saved), 0u);
  }
  dev.backend.fail_async_copy = 0;
  c.expect_a_healthy_run_equals_save_all();
  release_offload_files();
  std::filesystem::remove_all(dir);
}

namespace {

// One forward + backward of `loss` under `policy`; the loss and every parameter's gradient.
TensorList step(nn::Module& model, const std::function<Tensor()>& loss, const Policy& policy) {
  model.zero_grad();
  manual_seed(77);  // the same dropout masks every step
  Tensor value = backward(loss, GradOptions{policy});
  TensorList out{value.detach().to(kCpu)};
  for (const auto& p : model.parameters()) out.push_back(p.grad().defined() ? p.grad().to(kCpu) : Tensor());
  return out;
}

// Saved values went to the host: the offload step copies more from the device than the save-all
// step (both copy their results to the CPU). Counted at the copies the forward makes, not at the
// file writes (bytes_offloaded), which a short backward may overtake on a loaded machine.
void expect_offload_equals_save_all(nn::Module& model, const std::function<Tensor()>& loss, EmulatedDevice& dev) {
  const Device device = dev.device;
  const std::string dir = fresh_dir("offload-device-model");
  const uint64_t fallbacks = fallback_calls(device);
  uint64_t copies = dev.backend.device_to_host;
  const TensorList want = step(model, loss, Policy::save_all());
  const uint64_t save_all_copies = dev.backend.device_to_host - copies;
  copies = dev.backend.device_to_host;
  const TensorList got = step(model, loss, Policy::offload(dir, /*threshold=*/4096));
  EXPECT_GT(dev.backend.device_to_host - copies, save_all_copies) << "no saved value left the device";
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(remat::testing::bitwise_equal(want[i], got[i])) << "output " << i;
  EXPECT_EQ(fallback_calls(device), fallbacks) << "a kernel ran on the CPU";
  EXPECT_EQ(device_saved(device), 0u);
  release_offload_files();
  std::filesystem::remove_all(dir);
}

}  // namespace

TEST(OffloadOnADevice, GptAndResNetStepsEqualSaveAllOnTheDevice) {
  EmulatedDevice dev;
  {
    SCOPED_TRACE("GPT");
    nn::GPT gpt({.vocab = 37, .layers = 3, .width = 32, .heads = 2, .seq = 16, .dropout = 0.1, .seed = 5});
    gpt.to(dev.device);
    std::vector<int64_t> ids(2 * 16), targets(2 * 16);
    for (size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<int64_t>((i * 7 + 3) % 37);
      targets[i] = static_cast<int64_t>((i * 5 + 1) % 37);
    }
    Tensor x = from_indices(ids, {2, 16}, dev.device), y = from_indices(targets, {2, 16}, dev.device);
    expect_offload_equals_save_all(gpt, [&] { return gpt.loss(x, y); }, dev);
  }
  {
    SCOPED_TRACE("ResNet");
    nn::ResNet resnet({.stages = 2, .blocks_per_stage = 1, .width = 8, .classes = 5, .seed = 3});
    resnet.to(dev.device);
    const nn::SyntheticImages data = nn::make_synthetic_images({.count = 4, .classes = 5, .size = 16, .seed = 2});
    Tensor images = data.images.to(dev.device), labels = data.labels.to(dev.device);
    expect_offload_equals_save_all(resnet, [&] { return resnet.loss(images, labels); }, dev);
  }
}

// The host copies' bandwidth, measured through the backend's host-copy verbs on the device, and
// what a budget plan on the device charges an offloaded byte with it: the file's write and the
// copy home as the write, the file's read and the copy back as the rest.
TEST(OffloadOnADevice, BudgetPlansChargeTheMeasuredHostCopies) {
  EmulatedDevice dev;
  const HostCopyBandwidth copies = host_copy_bandwidth(dev.device);
  EXPECT_GT(copies.to_host_bytes_per_second, 0.0);
  EXPECT_GT(copies.from_host_bytes_per_second, 0.0);
  EXPECT_TRUE(std::isfinite(copies.to_host_seconds_per_byte() + copies.from_host_seconds_per_byte()));
  EXPECT_EQ(host_copy_bandwidth(dev.device).to_host_bytes_per_second, copies.to_host_bytes_per_second);  // once
  EXPECT_EQ(host_copy_bandwidth(kCpu).to_host_seconds_per_byte(), 0.0);  // no copy on the CPU

  Chain chain;
  std::vector<Tensor> weights;
  for (int i = 0; i < 4; ++i) {
    Tensor w = randn({32, 32}, DType::f32, RngState{7, static_cast<uint64_t>(i)}, 0.0, 0.2).to(dev.device);
    w.requires_grad_();
    weights.push_back(w);
    chain.add([w](const Tensor& h) { return tanh(matmul(h, w)); }, "block" + std::to_string(i));
  }
  Tensor x = randn({16, 32}, DType::f32, RngState{8, 0}).to(dev.device);
  const std::string dir = remat::testing::fresh_dir("budget-device-offload");
  const Policy policy = Policy::budget(size_t{1} << 30).with_offload(OffloadTarget{dir, 0, 0});
  chain.set_planner(std::make_shared<BudgetPlanner>());
  for (int i = 0; i <= BudgetPlanner::kProfilingSteps; ++i) {
    for (Tensor& w : weights) w.zero_grad();
    backward([&] { return mean(chain.forward(x)); }, GradOptions{policy});
  }
  ASSERT_TRUE(chain.planner()->report().has_value());
  const BudgetPlanner::Report report = *chain.planner()->report();
  // the file's price: the page cache's here (a step's few KiB against the host's memory)
  const OffloadBandwidth measured = offload_bandwidth(dir);
  const OffloadPrice file = offload_price(measured, report.costs.offloadable_bytes(), device_memory(Device{}).free_bytes);
  ASSERT_TRUE(file.page_cache);
  EXPECT_EQ(report.offload_priced_as, "page cache");
  EXPECT_EQ(report.offload_write_bytes_per_second, measured.cached_write_bytes_per_second);
  EXPECT_EQ(report.offload_to_host_bytes_per_second, copies.to_host_bytes_per_second);
  EXPECT_EQ(report.offload_from_host_bytes_per_second, copies.from_host_bytes_per_second);
  EXPECT_NEAR(report.costs.offload_seconds_per_byte,
              file.seconds_per_byte() + copies.to_host_seconds_per_byte() + copies.from_host_seconds_per_byte(),
              1e-6 * report.costs.offload_seconds_per_byte);
  EXPECT_NEAR(report.costs.offload_write_seconds_per_byte, file.write_seconds_per_byte() + copies.to_host_seconds_per_byte(),
              1e-6 * report.costs.offload_write_seconds_per_byte);
}
