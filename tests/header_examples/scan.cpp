// The examples of include/remat/scan.h: an explicit heat-equation solver of 10000 steps under
// Revolve with 16 snapshots, and a loop that runs until its residual is small.
#include <gtest/gtest.h>

#include "remat/remat.h"
#include "remat/scan.h"

using namespace remat;

namespace {

// The 1-D Laplacian of u [n] with zero boundary values: u[i-1] - 2 u[i] + u[i+1].
Tensor laplacian(const Tensor& u) {
  const int64_t n = u.size(0);
  const Tensor zero = zeros({1}, u.dtype());
  Tensor left = concat({zero, u.slice(0, 0, n - 1)}, 0);
  Tensor right = concat({u.slice(0, 1, n), zero}, 0);
  return add(add(left, right), mul_scalar(u, -2.0));
}

}  // namespace

TEST(ScanH, Examples) {
  const double dt = 0.2;
  Tensor u0 = randn({16}, DType::f64, RngState{1, 0}).requires_grad_();
  auto loss = [](const Tensor& u) { return sum(mul(u, u)); };
REMAT_EXAMPLE(include/remat/scan.h: // 10000 steps of an explicit PDE solver)
  // only 16 states were kept, and the gradient is the unrolled loop's, bitwise
  const ScanStats stats = last_scan_stats();
  EXPECT_EQ(stats.steps, 10000);
  EXPECT_LE(stats.snapshot_peak_bytes, 16 * stats.state_bytes);
  Tensor stored = remat::grad({loss(remat::scan(step, u0, 10000, {.schedule = ScanSchedule::store_all}))}, {u0})[0];
  EXPECT_EQ(g.to_vector(), stored.to_vector());

  const double tol = 1e-3;
  auto residual = [](const Tensor& u) { return max(abs(u)).item(); };  // the solution decays to 0
REMAT_EXAMPLE(include/remat/scan.h: // a loop whose length is known only when it ends)
  EXPECT_LE(residual(u), tol);
  EXPECT_GT(residual(u0), tol);
  EXPECT_TRUE(remat::grad({loss(u)}, {u0})[0].defined());
}
