// Install test: builds against an installed remat (find_package + remat::remat), computes
// gradients through both GEMM paths (f64 -> OpenBLAS, f32 -> oneDNN) and checks them against
// hand-computed values. Exit status 0 on success.
#include <cmath>
#include <cstdio>
#include <vector>

#include "remat/autodiff.h"
#include "remat/memory.h"
#include "remat/ops.h"
#include "remat/tensor.h"

namespace {

int failures = 0;

void check_close(const char* what, double got, double want, double tol) {
  if (!(std::fabs(got - want) <= tol * (1.0 + std::fabs(want)))) {
    std::printf("FAIL %s: got %.9g, want %.9g\n", what, got, want);
    ++failures;
  }
}

// loss = sum(tanh(x @ w)) for x [2, 3], w [3, 2]; dloss/dw = x^T (1 - tanh(x @ w)^2).
void check_gradient(remat::DType dtype, double tol) {
  const std::vector<double> xv{1, 2, 3, 4, 5, 6};
  const std::vector<double> wv{0.1, -0.2, 0.3, 0.4, -0.5, 0.6};
  remat::Tensor x = remat::from_vector(xv, {2, 3}, dtype);
  remat::Tensor w = remat::from_vector(wv, {3, 2}, dtype).requires_grad_();
  remat::Tensor loss = remat::sum(remat::tanh(remat::matmul(x, w)));
  loss.backward();

  double h[2][2], want_loss = 0;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      double z = 0;
      for (int k = 0; k < 3; ++k) z += xv[i * 3 + k] * wv[k * 2 + j];
      h[i][j] = std::tanh(z);
      want_loss += h[i][j];
    }
  check_close("loss", loss.item(), want_loss, tol);

  remat::Tensor g = w.grad();
  if (!g.defined() || g.shape() != remat::Shape{3, 2}) {
    std::printf("FAIL %s: w.grad() missing or misshapen\n", remat::dtype_name(dtype));
    ++failures;
    return;
  }
  const std::vector<double> got = g.to_vector();
  for (int k = 0; k < 3; ++k)
    for (int j = 0; j < 2; ++j) {
      double want = 0;
      for (int i = 0; i < 2; ++i) want += xv[i * 3 + k] * (1 - h[i][j] * h[i][j]);
      check_close("dloss/dw", got[k * 2 + j], want, tol);
    }
  std::printf("%s: loss %.6f, dloss/dw[0,0] %.6f\n", remat::dtype_name(dtype), loss.item(), got[0]);
}

}  // namespace

int main() {
  check_gradient(remat::DType::f64, 1e-12);
  check_gradient(remat::DType::f32, 1e-5);
  std::printf("allocator peak: %s\n", remat::memory::format_bytes(remat::memory::stats().peak_total).c_str());
  if (failures) {
    std::printf("consumer: %d check(s) failed\n", failures);
    return 1;
  }
  std::printf("consumer: OK\n");
  return 0;
}
