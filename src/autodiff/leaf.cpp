// The Tensor functions that act on a leaf's gradient: requires_grad_, grad, zero_grad, set_grad.
// They are members of Tensor (remat/tensor.h) but belong to the autodiff layer: they read the tape
// (a leaf is a tensor without grad_fn) and own the gradient buffers it accumulates into.
#include "remat/autodiff.h"
#include "remat/backend.h"
#include "tensor/allocate.h"

namespace remat {

Tensor& Tensor::requires_grad_(bool value) {
  REMAT_CHECK(is_leaf(), "requires_grad_: only leaves can be marked; this tensor of shape ", shape_str(shape()),
              " was produced by ", impl().grad_fn->name(), " (use detach() first)");
  REMAT_CHECK(!value || is_floating(dtype()), "requires_grad_: ", dtype_name(dtype()), " tensors cannot require grad");
  impl().requires_grad = value;
  return *this;
}

Tensor Tensor::grad() const { return impl().grad ? Tensor(impl().grad) : Tensor(); }

void Tensor::zero_grad() { impl().grad.reset(); }

void Tensor::set_grad(const Tensor& grad) {
  if (!grad.defined()) {
    impl().grad.reset();
    return;
  }
  REMAT_CHECK(grad.shape() == shape(), "set_grad: gradient shape ", shape_str(grad.shape()),
              " differs from tensor shape ", shape_str(shape()));
  REMAT_CHECK(grad.dtype() == dtype(), "set_grad: gradient dtype ", dtype_name(grad.dtype()),
              " differs from tensor dtype ", dtype_name(dtype()), " (convert it with .to(", dtype_name(dtype()),
              ") first)");
  REMAT_CHECK(grad.device() == device(), "set_grad: gradient is on ", device_name(grad.device()),
              ", the tensor on ", device_name(device()));
  // A private contiguous copy: the caller's tensor (perhaps a view, perhaps expanded with stride
  // 0, perhaps used elsewhere) is never aliased, so a backward pass can accumulate in place.
  Tensor copy = detail::allocate_tensor("set_grad", shape(), dtype(), memory::Tag::gradient, device());
  backend(device()).copy(grad, copy);
  impl().grad = copy.impl_ptr();
}

}  // namespace remat
