// The example of include/remat/random.h: a seeded default generator and an explicit state agree.
#include <gtest/gtest.h>

#include "remat/remat.h"

using namespace remat;

TEST(RandomH, Example) {
REMAT_EXAMPLE(include/remat/random.h: remat::manual_seed(42);)
  EXPECT_EQ(noise.to_vector(), same.to_vector());
  EXPECT_EQ(noise.shape(), (Shape{128, 64}));
}
