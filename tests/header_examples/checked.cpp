// The example of include/remat/checked.h: an overflowing byte size is a remat::Error saying so.
#include <gtest/gtest.h>

#include "remat/remat.h"

using namespace remat;

TEST(CheckedH, Example) {
  const int64_t numel = int64_t{1} << 61;  // 2305843009213693952 elements
  const DType dtype = DType::f64;
  const Shape shape = {numel};
  try {
REMAT_EXAMPLE(include/remat/checked.h: size_t bytes = remat::checked_mul)
    FAIL() << "no error; bytes = " << bytes;
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "zeros: byte size of shape [2305843009213693952]: 2305843009213693952 * 8 overflows");
  }
}
