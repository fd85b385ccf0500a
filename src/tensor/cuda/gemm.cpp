// CUDA matrix products through cuBLAS (cublasGemmStridedBatchedEx): one call per product, the
// batch as cuBLAS's strided batch (a batch stride of 0 broadcasts an operand). cuBLAS is column-
// major: the row-major C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T,
// which reads the same memory. An operand whose strides are not a matrix with one unit stride
// (row- or column-major with a leading dimension) is first copied to a contiguous one.
// float32 is computed in float32 (CUBLAS_COMPUTE_32F) unless set_allow_tf32(true) permits TF32
// tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32); float64 in float64.
#include <algorithm>
#include <limits>

#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/cuda_internal.h"

namespace remat::cuda {

namespace {

// A [batch, rows, cols] operand as cuBLAS sees it: its base pointer and layout
// (tensor/kernel_common.h; cuBLAS takes int leading dimensions).
struct MatrixView {
  const void* base = nullptr;
  int64_t batch_stride = 0;
  int64_t ld = 0;
  bool trans = false;  // whether the row-major view is transposed relative to the logical operand
};

bool matrix_view(const Tensor& t, bool logical_trans, MatrixView& view) {
  kernel::MatrixLayout l;
  if (!kernel::matrix_layout(t, logical_trans, std::numeric_limits<int>::max(), l)) return false;
  view.base = static_cast<const char*>(t.storage()->data()) + t.offset() * static_cast<int64_t>(dtype_size(t.dtype()));
  view.batch_stride = l.batch_stride, view.ld = l.ld, view.trans = l.trans;
  return true;
}

}  // namespace

void CudaBackend::gemm(const Tensor& a_in, bool trans_a, const Tensor& b_in, bool trans_b, const Tensor& c,
                       double alpha, double beta) {
  REMAT_ASSERT(a_in.dim() == 3 && b_in.dim() == 3 && c.dim() == 3, "gemm expects rank-3 operands");
  REMAT_ASSERT(c.is_contiguous());
  const int64_t batch = c.shape()[0], m = c.shape()[1], n = c.shape()[2];
  const int64_t k = trans_a ? a_in.shape()[1] : a_in.shape()[2];
  if (batch == 0 || m == 0 || n == 0) return;
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  REMAT_CHECK(m <= kMaxInt && n <= kMaxInt && k <= kMaxInt && batch <= kMaxInt, "matmul on cuda: product of [", m, ", ",
              k, "] and [", k, ", ", n, "] (batch ", batch, ") has a dimension above 2^31 - 1");
  DeviceGuard guard(device_);
  if (k == 0) {  // C = beta * C (0 when beta is 0, whatever C held)
    if (beta == 0.0) return fill(c, 0.0);
    Tensor scaled = scratch(c.shape(), c.dtype());
    unary(UnaryOp::mul_scalar, c, scaled, beta);
    return copy(scaled, c);
  }
  Tensor a = a_in, b = b_in;
  MatrixView va, vb;
  if (!matrix_view(a, trans_a, va)) {
    a = scratch(a_in.shape(), a_in.dtype());
    copy(a_in, a);
    matrix_view(a, trans_a, va);
  }
  if (!matrix_view(b, trans_b, vb)) {
    b = scratch(b_in.shape(), b_in.dtype());
    copy(b_in, b);
    matrix_view(b, trans_b, vb);
  }
  const cublasOperation_t op_a = va.trans ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = vb.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  void* cp = static_cast<char*>(c.storage()->data()) + c.offset() * static_cast<int64_t>(dtype_size(c.dtype()));
  if (c.dtype() == DType::f32) {
    const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
    const cublasComputeType_t compute = allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    check(cublasGemmStridedBatchedEx(cublas_, op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                                     &al, vb.base, CUDA_R_32F, static_cast<int>(vb.ld), vb.batch_stride, va.base,
                                     CUDA_R_32F, static_cast<int>(va.ld), va.batch_stride, &be, cp, CUDA_R_32F,
                                     static_cast<int>(n), m * n, static_cast<int>(batch), compute, CUBLAS_GEMM_DEFAULT),
          "cublasGemmStridedBatchedEx (f32)");
    note_launch("gemm (cuBLAS)");
  } else {
    REMAT_CHECK(c.dtype() == DType::f64, "matmul on cuda: unsupported dtype ", dtype_name(c.dtype()));
    const double al = alpha, be = beta;
    check(cublasGemmStridedBatchedEx(cublas_, op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                                     &al, vb.base, CUDA_R_64F, static_cast<int>(vb.ld), vb.batch_stride, va.base,
                                     CUDA_R_64F, static_cast<int>(va.ld), va.batch_stride, &be, cp, CUDA_R_64F,
                                     static_cast<int>(n), m * n, static_cast<int>(batch), CUBLAS_COMPUTE_64F,
                                     CUBLAS_GEMM_DEFAULT),
          "cublasGemmStridedBatchedEx (f64)");
    note_launch("gemm (cuBLAS)");
  }
}

}  // namespace remat::cuda
