// bf16 and f16 on CUDA, with the backend option sixteen_bit (cuda_internal.h, CudaDevice).
//
// Note [16-bit floats on the GPU]. Without the option, the device holds no 16-bit tensor
// (CudaBackend::holds): allocating one is a remat::Error saying why (why_not_held: the kernels
// have not passed a device check). With it, every kernel runs on bf16 and f16 tensors, in float32
// arithmetic, rounding each result once:
//   - natively, on the 16-bit data: copy (conversions, rounded to nearest even, copy.cu), fill and
//     arange, the matrix products (gemm.cpp: cuBLAS with 16-bit operands and float32
//     accumulation, CUBLAS_COMPUTE_32F), the elementwise kernels (unary ops and their
//     derivatives, binary ops, where: elementwise.cu, each element widened to float, computed,
//     rounded once), the row kernels of softmax, layer norm and RMS norm and the attention kernels,
//     forward and backward (rows.cu, attention.cu: the float32 kernels' expressions and sums, in
//     their order, on elements widened as they are loaded or staged, each output rounded once, the
//     statistics and the log-sum-exp float32; so their results are the stand-in path's), the
//     gradient norm's sum of squares and clipping's scaling (through unary, reduce, copy and
//     binary), and the kernels written for a storage type S that widen each element as they load
//     it and round each output once, with the float32 kernels' expressions, accumulators (float64
//     where the float32 kernel adds in float64) and summation order, so that their results are the
//     stand-in path's bits: cross-entropy, forward and backward (indexing.cu: the losses, the
//     log-sum-exp and the mean's weight float32, the scratch log-softmax 16-bit; Note [cross
//     entropy from checked kernels] there), the reductions (reduce.cu: sum and mean through float64
//     and float32, max and argmax exact), embedding and its backward (float sums of a table row's
//     gradient rows in position order), pooling (pool.cu, all but max pooling's backward) and
//     batch norm (batch_norm.cu: float32 statistics and parameter-gradient sums);
//   - every other kernel on float32 stand-ins made on the device: each 16-bit operand is widened
//     exactly into a float32 scratch tensor by the copy kernel, the float32 kernel runs, and the
//     operands it writes are rounded back once (tensor/widen.h, the CPU's mechanism): random
//     numbers and dropout, the residual add fused into layer norm (which the op does not call on
//     16-bit values: Note [the residual add fused into layer norm] in src/autodiff/ops/norm.cpp),
//     the convolutions (cuDNN), max pooling's backward (it adds into its output, so a 16-bit output
//     would be rounded at every addition)
//     and the optimizer steps (whose parameters are float32 master weights in mixed precision).
//     Such a kernel computes what the CPU reference computes, the float32 result on the 16-bit
//     values rounded once, with the float32 kernel's summation order; it costs a float32 copy of
//     each operand per call, which a kernel reading and writing 16 bits itself does not.
// Determinism is the float32 kernels' and cuBLAS's (Note: determinism on the GPU, in
// cuda_backend.cpp): a recomputation runs the same conversions and kernels on the same bits, so
// every policy gives save-all's gradients on the same device. The results are not the CPU's bits
// (other summation orders, cuBLAS's tiling), only close: the op test's 16-bit tolerances.
#include "tensor/cuda/cuda_internal.h"
#include "tensor/widen.h"

namespace remat::cuda {

bool native_16bit(Kernel kernel) {
  switch (kernel) {
    case Kernel::arange:
    case Kernel::gemm:
    case Kernel::gemm_bias:
    case Kernel::scale_each:   // each gradient through unary and copy, which take 16 bits themselves
    case Kernel::sum_squares:  // each gradient through unary, reduce, copy and binary; or read as is
    case Kernel::unary:
    case Kernel::unary_backward:
    case Kernel::binary:
    case Kernel::where:
    case Kernel::softmax:
    case Kernel::softmax_backward:
    case Kernel::layer_norm:
    case Kernel::layer_norm_backward:
    case Kernel::rms_norm:
    case Kernel::rms_norm_backward:
    case Kernel::attention:
    case Kernel::attention_backward:
    case Kernel::cross_entropy:
    case Kernel::cross_entropy_backward:
    case Kernel::reduce:
    case Kernel::embedding:
    case Kernel::embedding_backward:
    case Kernel::max_pool2d:
    case Kernel::avg_pool2d:
    case Kernel::avg_pool2d_backward:
    case Kernel::adaptive_avg_pool2d:
    case Kernel::adaptive_avg_pool2d_backward:
    case Kernel::batch_norm_statistics:
    case Kernel::batch_norm_apply:
    case Kernel::batch_norm_backward: return true;
    default: return false;
  }
}

#define REMAT_WIDEN_KERNEL(name, dtype_of, parameters, arguments) \
  REMAT_WIDENED_KERNEL(CudaDevice, CudaBackend, native_16bit, name, parameters, arguments)
REMAT_OPTIONAL_KERNELS(REMAT_WIDEN_KERNEL)
#undef REMAT_WIDEN_KERNEL

}  // namespace remat::cuda
