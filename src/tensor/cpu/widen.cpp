// bf16 and f16 on the CPU: each kernel computes in float32 (cpu_backend.h, CpuBackend).
//
// Note [16-bit floats on the CPU]. The CPU's kernels are written for f32 and f64. A kernel called
// with bf16 or f16 operands widens each of them, exactly, into a float32 tensor, runs its float32
// kernel on those, and rounds the operands it wrote back into their 16-bit tensors, once (to
// nearest, ties to even). Which operands are written is what the kernel list says (inout in
// REMAT_OPTIONAL_KERNELS); an operand written in place or accumulated into (gemm's c with beta,
// a gradient added to) is widened with its contents, so an accumulation rounds once at its end.
// Operands of other dtypes (f32 statistics beside a bf16 input, i64 ids) pass as they are. So a
// bf16 result on the CPU is the float32 result of the op on the same values, rounded once: the
// reference other backends' 16-bit kernels are checked against (with tolerances: they sum in other
// orders), and what the emulated device computes bit for bit. copy and fill convert and fill
// 16-bit tensors themselves, and digest reads their bytes: those three are not widened. The cost
// is a float32 copy of each 16-bit operand per call (counted as `other` memory while the call
// runs); the CPU is the reference here, not the fast path. One exception: on a CPU with bf16
// units, gemm's and gemm_bias's bf16 inputs are multiplied as they are, with float32 accumulation
// into the widened result (Note [bf16 products]).
#include "cpu_backend.h"
#include "remat/cpu_features.h"
#include "tensor/widen.h"

namespace remat::cpu {

namespace {
// digest reads the bytes as they are; sum_squares and scale_each run the widening kernels on each
// of their tensors themselves.
bool native_16bit(Kernel kernel) {
  return kernel == Kernel::digest || kernel == Kernel::sum_squares || kernel == Kernel::scale_each;
}
// gemm's and gemm_bias's bf16 inputs stay bf16 where the CPU multiplies bf16 (Note [bf16 products]
// in gemm_bf16.cpp); their result is widened as any.
bool keeps_bf16_inputs(Kernel kernel) {
  return (kernel == Kernel::gemm || kernel == Kernel::gemm_bias) && cpu_features().bf16_products;
}
}  // namespace

// Each optional kernel of the list, widened (tensor/widen.h).
#define REMAT_WIDEN_KERNEL(name, dtype_of, parameters, arguments)                                            \
  void CpuBackend::name parameters {                                                                           \
    detail::Widened widened(*this, !native_16bit(Kernel::name), keeps_bf16_inputs(Kernel::name));              \
    auto in = [&](const Tensor& t) -> const Tensor& { return widened.in(t); };                                \
    auto inout = [&](const Tensor& t) -> const Tensor& { return widened.inout(t); };                          \
    (void)in;                                                                                                 \
    CpuKernels::name arguments;                                                                               \
    widened.finish();                                                                                         \
  }
REMAT_OPTIONAL_KERNELS(REMAT_WIDEN_KERNEL)
#undef REMAT_WIDEN_KERNEL

}  // namespace remat::cpu
