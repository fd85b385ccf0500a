// CUDA matrix products through cuBLAS (cublasGemmStridedBatchedEx): one call per product, the
// batch as cuBLAS's strided batch (a batch stride of 0 broadcasts an operand). cuBLAS is column-
// major: the row-major C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T,
// which reads the same memory. An operand whose strides are not a matrix with one unit stride
// (row- or column-major with a leading dimension) is first copied to a contiguous one.
// float32 is computed in float32 (CUBLAS_COMPUTE_32F) unless the backend option tf32 permits TF32
// tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32); float64 in float64; bf16 and f16 operands (with the
// option sixteen_bit, cuda/widen.cpp) on tensor cores with float32 accumulation and float32 alpha
// and beta (CUBLAS_COMPUTE_32F), C read and written in 16 bits and rounded once.
// A linear layer's product (gemm_bias) is the bias copied into C and a GEMM with beta 1 (the
// cuBLASLt bias epilogue is a candidate: candidates/cuda/gemm_epilogue.cpp).
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

// cuBLAS's name of a floating dtype, and the compute type of its products.
cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return CUDA_R_32F;
    case DType::f64: return CUDA_R_64F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: throw Error(detail::concat("matmul on cuda: unsupported dtype ", dtype_name(dtype)));
  }
}
cublasComputeType_t compute_type(DType dtype, bool tf32) {
  if (dtype == DType::f64) return CUBLAS_COMPUTE_64F;
  return dtype == DType::f32 && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

}  // namespace

void CudaBackend::gemm_bias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias,
                            const Tensor& c) {
  REMAT_ASSERT(a.dim() == 3 && b.dim() == 3 && c.dim() == 3, "gemm expects rank-3 operands");
  REMAT_ASSERT(c.is_contiguous() && bias.dim() == 1 && bias.size(0) == c.shape()[2]);
  if (c.numel() == 0) return;
  DeviceGuard guard(device_);
  copy(bias, c);
  gemm(a, trans_a, b, trans_b, c, 1.0, 1.0);
}

void CudaBackend::gemm(const Tensor& a_in, bool trans_a, const Tensor& b_in, bool trans_b, const Tensor& c,
                       double alpha, double beta) {
  REMAT_ASSERT(a_in.dim() == 3 && b_in.dim() == 3 && c.dim() == 3, "gemm expects rank-3 operands");
  REMAT_ASSERT(c.is_contiguous());
  const int64_t batch = c.shape()[0], m = c.shape()[1], n = c.shape()[2];
  const int64_t k = trans_a ? a_in.shape()[1] : a_in.shape()[2];
  if (batch == 0 || m == 0 || n == 0) return;
  REMAT_CHECK(a_in.dtype() == c.dtype() && b_in.dtype() == c.dtype(), "matmul on cuda: operands ",
              dtype_name(a_in.dtype()), " and ", dtype_name(b_in.dtype()), " into ", dtype_name(c.dtype()));
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
  const cudaDataType_t type = cuda_type(c.dtype());
  const bool f64 = c.dtype() == DType::f64;
  const float al_f = static_cast<float>(alpha), be_f = static_cast<float>(beta);
  const void* al = f64 ? static_cast<const void*>(&alpha) : &al_f;
  const void* be = f64 ? static_cast<const void*>(&beta) : &be_f;
  check(cublasGemmStridedBatchedEx(cublas_, op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), al,
                                   vb.base, type, static_cast<int>(vb.ld), vb.batch_stride, va.base, type,
                                   static_cast<int>(va.ld), va.batch_stride, be, cp, type, static_cast<int>(n), m * n,
                                   static_cast<int>(batch), compute_type(c.dtype(), options_.tf32), CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx");
  note_launch("gemm (cuBLAS)");
}

}  // namespace remat::cuda
