// The example of include/remat/gradcheck.h: a custom op's gradient against central differences.
#include <gtest/gtest.h>

#include <cstdio>

#include "remat/remat.h"

using namespace remat;

namespace {

// my_op: x -> x^3 as a custom op with its hand-written backward
const CustomOp my_op{"cube",
                     [](const TensorList& in, SaveContext& ctx) {
                       ctx.save(in[0]);
                       return TensorList{mul(mul(in[0], in[0]), in[0])};
                     },
                     [](const TensorList& grads, const SavedValues& saved) {
                       return TensorList{mul(mul_scalar(mul(saved[0], saved[0]), 3.0), grads[0])};
                     }};

}  // namespace

TEST(GradcheckH, Example) {
REMAT_EXAMPLE(include/remat/gradcheck.h: using namespace remat;)
  EXPECT_TRUE(r.ok) << r.report;
}
