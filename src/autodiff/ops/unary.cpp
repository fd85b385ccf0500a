// Unary elementwise ops: forward through the backend's unary kernel, backward through its fused
// derivative kernel. What each backward needs is declared in its spec.
#include "autodiff/kernels.h"
#include "autodiff/op.h"

namespace remat {

using autodiff::BackwardContext;
using autodiff::OpSpec;

namespace {

void check_float(const Tensor& x, const char* op) {
  REMAT_CHECK(x.defined(), op, ": input is undefined");
  REMAT_CHECK(is_floating(x.dtype()), op, ": expects a floating tensor (f32, f64, bf16, f16), got ", dtype_name(x.dtype()), " of shape ",
              shape_str(x.shape()));
}

// Defines one unary op. `save` says whether the derivative reads x (inputs) or y (outputs).
Tensor unary_op(const OpSpec& spec, UnaryOp op, const Tensor& x, double scalar = 0.0) {
  check_float(x, spec.name.c_str());
  return autodiff::apply1(
      spec, {x}, [op, scalar](const TensorList& in) { return TensorList{kernels::unary(op, in[0], scalar)}; },
      [op, scalar, save = spec.save](BackwardContext& ctx) {
        Tensor x_saved = (save & autodiff::save_inputs) ? ctx.input(0) : Tensor();
        Tensor y_saved = (save & autodiff::save_outputs) ? ctx.output(0) : Tensor();
        ctx.set_input_grad(0, kernels::unary_backward(op, x_saved, y_saved, ctx.grad_output(0), scalar));
      });
}

const OpSpec kNeg{autodiff::OpKind::neg, autodiff::save_nothing};
const OpSpec kExp{autodiff::OpKind::exp, autodiff::save_outputs};
const OpSpec kLog{autodiff::OpKind::log, autodiff::save_inputs};
const OpSpec kSqrt{autodiff::OpKind::sqrt, autodiff::save_outputs};
const OpSpec kAbs{autodiff::OpKind::abs, autodiff::save_inputs};
const OpSpec kTanh{autodiff::OpKind::tanh, autodiff::save_outputs};
const OpSpec kSigmoid{autodiff::OpKind::sigmoid, autodiff::save_outputs};
const OpSpec kRelu{autodiff::OpKind::relu, autodiff::save_inputs};
const OpSpec kGelu{autodiff::OpKind::gelu, autodiff::save_inputs};
const OpSpec kGeluTanh{autodiff::OpKind::gelu_tanh, autodiff::save_inputs};
const OpSpec kSilu{autodiff::OpKind::silu, autodiff::save_inputs};
const OpSpec kPow{autodiff::OpKind::pow, autodiff::save_inputs};
const OpSpec kSquare{autodiff::OpKind::square, autodiff::save_inputs};
const OpSpec kAddScalar{autodiff::OpKind::add_scalar, autodiff::save_nothing};
const OpSpec kMulScalar{autodiff::OpKind::mul_scalar, autodiff::save_nothing};

}  // namespace

Tensor neg(const Tensor& x) { return unary_op(kNeg, UnaryOp::neg, x); }
Tensor exp(const Tensor& x) { return unary_op(kExp, UnaryOp::exp, x); }
Tensor log(const Tensor& x) { return unary_op(kLog, UnaryOp::log, x); }
Tensor sqrt(const Tensor& x) { return unary_op(kSqrt, UnaryOp::sqrt, x); }
Tensor abs(const Tensor& x) { return unary_op(kAbs, UnaryOp::abs, x); }
Tensor tanh(const Tensor& x) { return unary_op(kTanh, UnaryOp::tanh, x); }
Tensor sigmoid(const Tensor& x) { return unary_op(kSigmoid, UnaryOp::sigmoid, x); }
Tensor relu(const Tensor& x) { return unary_op(kRelu, UnaryOp::relu, x); }
Tensor gelu(const Tensor& x, bool tanh_approximation) {
  return tanh_approximation ? unary_op(kGeluTanh, UnaryOp::gelu_tanh, x) : unary_op(kGelu, UnaryOp::gelu, x);
}
Tensor silu(const Tensor& x) { return unary_op(kSilu, UnaryOp::silu, x); }
Tensor pow(const Tensor& x, double exponent) { return unary_op(kPow, UnaryOp::pow_scalar, x, exponent); }
Tensor square(const Tensor& x) { return unary_op(kSquare, UnaryOp::square, x); }
Tensor add_scalar(const Tensor& x, double value) { return unary_op(kAddScalar, UnaryOp::add_scalar, x, value); }
Tensor mul_scalar(const Tensor& x, double value) { return unary_op(kMulScalar, UnaryOp::mul_scalar, x, value); }

Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& a, double b) { return add_scalar(a, b); }
Tensor operator-(const Tensor& a, double b) { return add_scalar(a, -b); }
Tensor operator*(const Tensor& a, double b) { return mul_scalar(a, b); }
Tensor operator/(const Tensor& a, double b) {
  REMAT_CHECK(b != 0.0, "div: division of a tensor of shape ", shape_str(a.shape()), " by the scalar 0");
  return mul_scalar(a, 1.0 / b);
}

Tensor Tensor::tanh() const { return remat::tanh(*this); }
Tensor Tensor::exp() const { return remat::exp(*this); }
Tensor Tensor::log() const { return remat::log(*this); }

}  // namespace remat
