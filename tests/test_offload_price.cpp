// What a budget plan with an offload target charges a byte (remat::offload_price; Note [measuring
// the offload target] in src/saved/offload_file.cpp): the page cache's bandwidths while the host's
// available memory holds ten times what a step may offload, else the disk's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <thread>

#include "checkpoint_models.h"
#include "remat/backend.h"
#include "remat/budget.h"
#include "remat/devices.h"
#include "remat/offload.h"
#include "temp_dir.h"

using namespace remat;
using remat::testing::TanhChain;

namespace {

OffloadBandwidth made_up() {
  OffloadBandwidth b;
  b.write_bytes_per_second = 1e8;
  b.read_bytes_per_second = 2e8;
  b.cached_write_bytes_per_second = 4e9;
  b.cached_read_bytes_per_second = 8e9;
  return b;
}

}  // namespace

TEST(OffloadPrice, ThePageCacheUpToATenthOfTheAvailableMemoryThenTheDisk) {
  const OffloadBandwidth b = made_up();
  const OffloadPrice cached = offload_price(b, 100, 1000);
  EXPECT_TRUE(cached.page_cache);
  EXPECT_EQ(cached.write_bytes_per_second, 4e9);
  EXPECT_EQ(cached.read_bytes_per_second, 8e9);
  EXPECT_DOUBLE_EQ(cached.seconds_per_byte(), 1 / 4e9 + 1 / 8e9);
  EXPECT_DOUBLE_EQ(cached.write_seconds_per_byte(), 1 / 4e9);
  const OffloadPrice disk = offload_price(b, 101, 1000);
  EXPECT_FALSE(disk.page_cache);
  EXPECT_EQ(disk.write_bytes_per_second, 1e8);
  EXPECT_EQ(disk.read_bytes_per_second, 2e8);
  EXPECT_DOUBLE_EQ(disk.seconds_per_byte(), b.seconds_per_byte());
  EXPECT_FALSE(offload_price(b, 1, 0).page_cache);  // no memory to spare
}

// Both ways measured once per directory: every bandwidth positive and finite.
TEST(OffloadPrice, TheDirectoryIsMeasuredBothWaysOnce) {
  const std::string dir = remat::testing::fresh_dir("offload-price");
  const OffloadBandwidth b = offload_bandwidth(dir);
  for (double v : {b.write_bytes_per_second, b.read_bytes_per_second, b.cached_write_bytes_per_second,
                   b.cached_read_bytes_per_second}) {
    EXPECT_GT(v, 0.0);
    EXPECT_TRUE(std::isfinite(v));
  }
  EXPECT_EQ(offload_bandwidth(dir).cached_read_bytes_per_second, b.cached_read_bytes_per_second);
}

// A budget plan prices its target as offload_price does: here, a few KiB a step against the host's
// memory, the page cache's bandwidths, in the report and in the costs it planned with; and it
// charges each transfer in full where the store's copies share the step's cores (the CPU, the
// step's threads on every core), else hides the write behind the forward and reads ahead.
TEST(OffloadPrice, ABudgetPlanPricesTheTargetAsTheRuleSays) {
  TanhChain model(6, 32, DType::f32, 5);
  Tensor x = randn({8, 32}, DType::f32, RngState{1, 0});
  const std::string dir = remat::testing::fresh_dir("offload-price-plan");
  const Policy policy = Policy::budget(size_t{1} << 30).with_offload(OffloadTarget{dir, 0, 0});
  model.chain.set_planner(std::make_shared<BudgetPlanner>());
  for (int i = 0; i <= BudgetPlanner::kProfilingSteps; ++i) {
    model.zero_grad();
    backward([&] { return mean(model.chain.forward(x)); }, GradOptions{policy});
  }
  ASSERT_TRUE(model.chain.planner()->report().has_value());
  const BudgetPlanner::Report report = *model.chain.planner()->report();
  const OffloadPrice price =
      offload_price(offload_bandwidth(dir), report.costs.offloadable_bytes(), device_memory(Device{}).free_bytes);
  ASSERT_TRUE(price.page_cache);
  EXPECT_EQ(report.offload_priced_as, "page cache");
  EXPECT_EQ(report.offload_write_bytes_per_second, price.write_bytes_per_second);
  EXPECT_EQ(report.offload_read_bytes_per_second, price.read_bytes_per_second);
  EXPECT_DOUBLE_EQ(report.costs.offload_seconds_per_byte, price.seconds_per_byte());
  const bool in_full = offload_copies_share_the_cores(Device{});
  EXPECT_EQ(report.offload_in_full, in_full);
  EXPECT_DOUBLE_EQ(report.costs.offload_write_seconds_per_byte, in_full ? 0.0 : price.write_seconds_per_byte());
  EXPECT_EQ(report.costs.reads_ahead, !in_full);
}

TEST(OffloadPrice, CopiesShareTheCoresOnTheCpuWhenTheStepTakesThemAll) {
  const int threads = num_threads();
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  set_num_threads(std::max(1, cores));
  EXPECT_TRUE(offload_copies_share_the_cores(Device{}));
  EXPECT_FALSE(offload_copies_share_the_cores(Device{DeviceType::emulated, 0}));
  if (cores > 1) {
    set_num_threads(cores - 1);  // a core left for the store's worker
    EXPECT_FALSE(offload_copies_share_the_cores(Device{}));
  }
  set_num_threads(threads);
}
