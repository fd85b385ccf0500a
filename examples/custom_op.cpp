// custom_op: wrapping a hand-written kernel as a differentiable remat op.
//
// The op is a fused silu, y = x * sigmoid(x), written as plain loops over contiguous_data<double>()
// in both the forward and the backward. The forward saves x; the backward reads it twice (to
// recompute sigmoid, then for the x factor). The program checks the op against the built-in
// remat::silu and with remat::gradcheck (float64 central differences, remat/gradcheck.h), prints
// what it found, and exits non-zero on a mismatch (ctest runs it as example_custom_op).
//
// Checks that protect a hand-written kernel:
//   - data<T>() throws remat::Error when T does not match the tensor's dtype, and
//     contiguous_data<T>() also when the tensor is strided (call .contiguous() first);
//   - a backward that returns a gradient of the wrong shape or dtype is an error naming the op,
//     the input and the expected shape and dtype;
//   - gradcheck(f, inputs) reports the worst element (input, index, analytic and numeric values).
#include <cmath>
#include <cstdio>

#include "remat/gradcheck.h"
#include "remat/ops.h"

using namespace remat;

// y[i] = x[i] * sigmoid(x[i])
static void silu_forward(const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0 + std::exp(-x[i]));
}

// gx[i] = gy[i] * s * (1 + x (1 - s)), s = sigmoid(x[i])
static void silu_backward(const Tensor& saved_x, const double* gy, double* gx, int64_t n) {
  const double* x = saved_x.contiguous_data<double>();
  for (int64_t i = 0; i < n; ++i) gx[i] = 1.0 / (1.0 + std::exp(-x[i]));  // first read of x
  for (int64_t i = 0; i < n; ++i) gx[i] = gy[i] * gx[i] * (1.0 + x[i] * (1.0 - gx[i]));  // second
}

static const CustomOp fused_silu{
    "fused_silu",
    // forward: runs untaped; anything passed to ctx.save() is kept for the backward
    [](const TensorList& in, SaveContext& ctx) {
      REMAT_CHECK(in[0].dtype() == DType::f64, "fused_silu: this example kernel takes f64, got ",
                  dtype_name(in[0].dtype()));
      Tensor x = in[0].contiguous();
      Tensor y = Tensor::empty(x.shape(), DType::f64);
      silu_forward(x.contiguous_data<double>(), y.contiguous_data<double>(), x.numel());
      ctx.save(x);
      return TensorList{y};
    },
    // backward: one gradient per input, from the output gradients and the saved values
    [](const TensorList& grads, const SavedValues& saved) {
      Tensor gy = grads[0].contiguous();
      Tensor gx = Tensor::empty(saved[0].shape(), DType::f64);
      silu_backward(saved[0], gy.contiguous_data<double>(), gx.contiguous_data<double>(), gx.numel());
      return TensorList{gx};
    }};

int main() {
  Tensor x = randn({4, 6}, DType::f64, RngState{7, 0}, 0.0, 2.0).requires_grad_();
  Tensor r = randn({4, 6}, DType::f64, RngState{8, 0});  // loss = sum(y * r)

  // the custom op and its gradient
  Tensor y = fused_silu({x})[0];
  sum(mul(y, r)).backward();
  std::vector<double> custom_grad = x.grad().to_vector();

  // the built-in silu on the same input
  Tensor x2 = x.detach().requires_grad_();
  Tensor y2 = silu(x2);
  sum(mul(y2, r)).backward();

  double forward_error = 0, builtin_error = 0;
  auto yv = y.to_vector(), y2v = y2.to_vector(), g2 = x2.grad().to_vector();
  for (size_t i = 0; i < yv.size(); ++i) {
    forward_error = std::fmax(forward_error, std::fabs(yv[i] - y2v[i]));
    builtin_error = std::fmax(builtin_error, std::fabs(custom_grad[i] - g2[i]));
  }

  // the op's gradient against float64 central differences, element by element
  GradcheckResult check = gradcheck([](const TensorList& in) { return fused_silu({in[0]})[0]; }, {x.detach()});

  std::printf("fused_silu on %s:\n", shape_str(x.shape()).c_str());
  std::printf("  forward   vs remat::silu:          max |diff| = %.3g\n", forward_error);
  std::printf("  gradient  vs remat::silu:          max |diff| = %.3g\n", builtin_error);
  std::printf("  %s\n", check.report.c_str());
  bool ok = forward_error < 1e-12 && builtin_error < 1e-12 && check.ok;
  std::printf("%s\n", ok ? "OK" : "MISMATCH");
  return ok ? 0 : 1;
}
