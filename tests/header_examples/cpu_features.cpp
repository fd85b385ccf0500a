// The example of include/remat/cpu_features.h: the kernels' level and the CPU's features.
#include <gtest/gtest.h>

#include <cstdio>

#include "remat/cpu_features.h"

using namespace remat;

TEST(CpuFeaturesH, Example) {
REMAT_EXAMPLE(include/remat/cpu_features.h: const remat::CpuFeatures& cpu = remat::cpu_features)
  EXPECT_LE(cpu.level, cpu.widest);
  EXPECT_EQ(&cpu, &cpu_features());  // chosen once
  EXPECT_FALSE(cpu.features.empty());
  EXPECT_NE(cpu.text().find(cpu_level_name(cpu.level)), std::string::npos);
}
