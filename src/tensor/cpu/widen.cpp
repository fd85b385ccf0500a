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
// runs); the CPU is the reference here, not the fast path.
#include <array>

#include "cpu_backend.h"
#include "tensor/allocate.h"

namespace remat::cpu {

namespace {

// The float32 stand-ins of one kernel call's 16-bit operands. A tensor passed twice (in place)
// has one stand-in; references stay valid until the call ends.
class Widened {
 public:
  Widened(CpuKernels& kernels, bool widen) : kernels_(kernels), widen_(widen) {}
  const Tensor& in(const Tensor& t) { return stage(t, false); }
  const Tensor& inout(const Tensor& t) { return stage(t, true); }
  // Rounds the written stand-ins back into their tensors.
  void finish() {
    for (size_t i = 0; i < count_; ++i)
      if (entries_[i].written) kernels_.copy(entries_[i].wide, entries_[i].narrow);
  }

 private:
  struct Entry {
    Tensor narrow, wide;
    bool written = false;
  };
  const Tensor& stage(const Tensor& t, bool written) {
    if (!widen_ || !t.defined() || !is_16bit_float(t.dtype())) return t;
    for (size_t i = 0; i < count_; ++i)
      if (entries_[i].narrow.same(t)) {
        entries_[i].written = entries_[i].written || written;
        return entries_[i].wide;
      }
    REMAT_ASSERT(count_ < entries_.size(), "a kernel with more than ", entries_.size(), " tensor operands");
    Entry& e = entries_[count_++];
    e.narrow = t;
    e.wide = detail::allocate_tensor("float32 stand-in of a 16-bit operand", t.shape(), DType::f32, memory::Tag::other,
                                     t.device());
    kernels_.copy(t, e.wide);
    e.written = written;
    return e.wide;
  }

  CpuKernels& kernels_;
  bool widen_;
  std::array<Entry, 12> entries_;
  size_t count_ = 0;
};

}  // namespace

// Each optional kernel of the list, widened (digest reads the bytes as they are; sum_squares and
// scale_each run the widening kernels on each of their tensors themselves).
#define REMAT_WIDEN_KERNEL(name, dtype_of, parameters, arguments)                               \
  void CpuBackend::name parameters {                                                             \
    Widened widened(*this, Kernel::name != Kernel::digest && Kernel::name != Kernel::sum_squares && \
                               Kernel::name != Kernel::scale_each);                               \
    auto in = [&](const Tensor& t) -> const Tensor& { return widened.in(t); };                   \
    auto inout = [&](const Tensor& t) -> const Tensor& { return widened.inout(t); };             \
    (void)in;                                                                                    \
    CpuKernels::name arguments;                                                                  \
    widened.finish();                                                                            \
  }
REMAT_OPTIONAL_KERNELS(REMAT_WIDEN_KERNEL)
#undef REMAT_WIDEN_KERNEL

}  // namespace remat::cpu
