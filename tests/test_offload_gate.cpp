// The offload store's gate (detail::OffloadGate), which a budget plan uses: a closed gate keeps
// values in memory, an every-value gate writes each one whatever its size, and a cap on the saved
// bytes makes the store wait for its writes in flight before a value would lift the saved bytes
// above it, so that writes overlap the work after them without the memory they hold going past
// the cap. Gradients stay bitwise equal to keeping everything.
#include <gtest/gtest.h>

#include "checkpoint_models.h"
#include "temp_dir.h"

using namespace remat;

namespace {

constexpr int kLayers = 10;
constexpr size_t kValueBytes = 64 * 64 * 4;

Tensor chain_loss(const Tensor& x, const Tensor& weight) {
  Tensor h = x;
  for (int i = 0; i < kLayers; ++i) h = tanh(matmul(h, weight));
  return mean(h);
}

struct GatedRun {
  Tensor gradient;
  size_t peak_saved = 0;     // during the forward pass, above what was saved before it
  size_t bytes_offloaded = 0;
  size_t bytes_over_plan = 0;  // DynamicCounters::bytes_over_plan
};

// mean(tanh(...tanh(x W)... W)): each layer saves its matmul's input and its tanh's output, every
// one a 64 x 64 f32 value, under a gate of `mode` and `cap` above what was saved before.
GatedRun tanh_chain_step(const Tensor& x, const Tensor& weight, detail::OffloadGate::Mode mode, size_t cap_above,
                    double write_delay) {
  GatedRun run;
  const std::string dir = remat::testing::fresh_dir("offload-gate");
  const OffloadTarget options{dir, /*threshold_bytes=*/size_t{1} << 30, /*ram_bytes=*/0};
  OffloadFaults slow;
  slow.write_delay_seconds = write_delay;
  reset_counters();
  ScopedPolicy keep(Policy::save_all());
  OffloadScope scope(options, slow);
  const size_t before = memory::live_bytes(memory::Tag::saved);
  memory::reset_peaks();
  Tensor loss;
  {
    detail::OffloadGate gate(mode, cap_above == 0 ? 0 : before + cap_above);
    loss = chain_loss(x, weight);
  }
  run.peak_saved = memory::peak_bytes(memory::Tag::saved) - before;
  run.gradient = remat::grad(TensorList{loss}, {weight})[0];
  run.bytes_offloaded = counters().dynamic.bytes_offloaded;
  run.bytes_over_plan = counters().dynamic.bytes_over_plan;
  return run;
}

}  // namespace

TEST(OffloadGate, ACapMakesWritesWaitOnlyWhenTheSavedBytesWouldPassIt) {
  Tensor weight = randn({64, 64}, DType::f32, RngState{3, 0}, 0.0, 0.12).requires_grad_();
  Tensor x = randn({64, 64}, DType::f32, RngState{4, 0});
  Tensor reference;
  {
    ScopedPolicy keep(Policy::save_all());
    reference = remat::grad(TensorList{chain_loss(x, weight)}, {weight})[0];
  }
  using Mode = detail::OffloadGate::Mode;
  // 20 ms a write: the forward pass outruns the disk. The uncapped run needs the disk to lag
  // behind a whole forward pass, which on a loaded machine can take tens of milliseconds (it
  // failed at 20 ms under four parallel builds on 2 cores: 5 values in memory at the peak), so
  // its disk is slower still: 150 ms a write.
  const double slow = 0.02, lagging = 0.15;

  // closed: nothing is written, whatever the threshold
  const GatedRun closed = tanh_chain_step(x, weight, Mode::closed, 0, 0);
  EXPECT_EQ(closed.bytes_offloaded, 0u);
  EXPECT_EQ(closed.peak_saved, (kLayers + 2) * kValueBytes);  // x, the weight, every activation
  EXPECT_TRUE(remat::testing::bitwise_equal(closed.gradient, reference));

  // every value, no cap, a slow disk: the writes lag, so nearly everything is in memory at once
  const GatedRun uncapped = tanh_chain_step(x, weight, Mode::every_value, 0, lagging);
  EXPECT_GT(uncapped.peak_saved, 8 * kValueBytes);
  EXPECT_TRUE(remat::testing::bitwise_equal(uncapped.gradient, reference));

  // the same with a cap of four values: the store waits for the oldest writes instead
  const size_t cap = 4 * kValueBytes;
  const GatedRun capped = tanh_chain_step(x, weight, Mode::every_value, cap, slow);
  EXPECT_LE(capped.peak_saved, cap);
  EXPECT_GE(capped.bytes_offloaded, (kLayers - 4) * kValueBytes);  // the writes it waited for
  EXPECT_EQ(capped.bytes_over_plan, 0u);
  EXPECT_TRUE(remat::testing::bitwise_equal(capped.gradient, reference));

  // a cap below one value: once nothing is left in flight the value is kept all the same, and the
  // counters say by how much the saved bytes went over the cap
  const size_t tight = kValueBytes / 2;
  const GatedRun over = tanh_chain_step(x, weight, Mode::every_value, tight, slow);
  EXPECT_GE(over.bytes_over_plan, kValueBytes - tight);
  EXPECT_LE(over.peak_saved, tight + over.bytes_over_plan);
  EXPECT_TRUE(remat::testing::bitwise_equal(over.gradient, reference));
}
