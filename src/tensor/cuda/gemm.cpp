// CUDA matrix products through cuBLAS (cublasGemmStridedBatchedEx): one call per product, the
// batch as cuBLAS's strided batch (a batch stride of 0 broadcasts an operand). cuBLAS is column-
// major: the row-major C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T,
// which reads the same memory. An operand whose strides are not a matrix with one unit stride
// (row- or column-major with a leading dimension) is first copied to a contiguous one.
// float32 is computed in float32 (CUBLAS_COMPUTE_32F) unless set_allow_tf32(true) permits TF32
// tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32); float64 in float64; bf16 and f16 operands (with
// REMAT_CUDA_FAST=bf16, cuda/widen.cpp) on tensor cores with float32 accumulation and float32
// alpha and beta (CUBLAS_COMPUTE_32F), C read and written in 16 bits and rounded once.
// A linear layer's product (gemm_bias) is the bias copied into C and a GEMM with beta 1, or, with
// REMAT_CUDA_FAST=gemm_epilogue, one cuBLASLt call adding the bias in its epilogue (Note [the bias
// epilogue]).
//
// Note [the bias epilogue]. cuBLASLt's CUBLASLT_EPILOGUE_BIAS adds a vector to every column of the
// column-major D, which is every row of our row-major C: the copy of the bias into C and the read
// of C by the GEMM go. The algorithm is chosen once per (dtype, compute type, shapes, transposes,
// leading dimensions, batch strides, operand alignment) by cuBLASLt's heuristic and kept for the
// process; the same key always runs the same algorithm, so a recomputed layer runs the kernel its
// first run ran (its operands have the same layout and alignment: storage from the allocator at
// its fixed alignment, the same offsets) and gradients stay bitwise under every policy. A key
// without an algorithm is remembered as such and always takes the copy-and-GEMM path. cuBLAS
// results are reproducible run to run on one device and one stream, which is how the backend
// calls it. The GELU epilogues are not used: remat's GELU is the exact one unless asked for the
// tanh approximation, cuBLASLt's is the approximation, and, whatever its formula, a GELU
// recomputed alone from a kept pre-activation would run the elementwise kernel, whose bits the
// epilogue's need not be.
#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>

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

// `view` of t (or of a contiguous copy of it, kept in `holder`) as cuBLAS reads it.
void view_of(CudaBackend& be, const Tensor& t, bool trans, Tensor& holder, MatrixView& view) {
  holder = t;
  if (matrix_view(t, trans, view)) return;
  holder = be.scratch(t.shape(), t.dtype());
  be.copy(t, holder);
  matrix_view(holder, trans, view);
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
cublasComputeType_t compute_type(DType dtype) {
  if (dtype == DType::f64) return CUBLAS_COMPUTE_64F;
  return dtype == DType::f32 && allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

// The largest of 16, 8, 4, 2, 1 bytes that divides the address.
int alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int align = 16;
  while (align > 1 && a % static_cast<uintptr_t>(align) != 0) align /= 2;
  return align;
}

}  // namespace

// ---- cuBLASLt: descriptors and the algorithm of each problem, made once

struct CudaBackend::LtState {
  using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int,
                         int, int>;  // dtype, tf32, batch, m, n, k, lda, ldb, stride a, stride b, ta, tb, alignment, epilogue
  struct Plan {
    bool ok = false;  // an algorithm was found; otherwise the key takes the unfused path
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  cublasLtHandle_t handle = nullptr;
  std::mutex mutex;
  std::map<Key, Plan> plans;
  ~LtState() {
    for (auto& [key, p] : plans) {
      if (p.desc) (void)cublasLtMatmulDescDestroy(p.desc);
      for (cublasLtMatrixLayout_t l : {p.a, p.b, p.d})
        if (l) (void)cublasLtMatrixLayoutDestroy(l);
    }
    if (handle) (void)cublasLtDestroy(handle);
  }
};

CudaBackend::LtState& CudaBackend::lt() {
  if (!lt_) {
    auto state = std::make_shared<LtState>();
    check(cublasLtCreate(&state->handle), "cublasLtCreate");
    lt_ = std::move(state);
  }
  return *lt_;
}

namespace {

// A matrix layout of `rows` x `cols` (column-major, leading dimension ld) repeated `batch` times.
cublasLtMatrixLayout_t lt_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                 int64_t batch_stride) {
  cublasLtMatrixLayout_t l = nullptr;
  check(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
        "cublasLtMatrixLayoutCreate");
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    check(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
          "cublasLtMatrixLayoutSetAttribute (batch count)");
    check(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride,
                                           sizeof batch_stride),
          "cublasLtMatrixLayoutSetAttribute (batch stride)");
  }
  return l;
}

// The problem of C^T = op(B)^T op(A)^T (column-major) with the bias epilogue, and its algorithm.
struct LtProblem {
  cudaDataType_t type;
  cublasComputeType_t compute;
  int64_t batch, m, n, k;
  MatrixView va, vb;
  int alignment;
};

void make_plan(cublasLtHandle_t handle, const LtProblem& p, CudaBackend::LtState::Plan& plan) {
  const cudaDataType_t scale = p.type == CUDA_R_64F ? CUDA_R_64F : CUDA_R_32F;  // float32 for 16-bit operands
  check(cublasLtMatmulDescCreate(&plan.desc, p.compute, scale), "cublasLtMatmulDescCreate");
  const cublasOperation_t op_a = p.vb.trans ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = p.va.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a), "TRANSA");
  check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b), "TRANSB");
  check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
        "EPILOGUE");
  check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &p.type, sizeof p.type),
        "BIAS_DATA_TYPE");
  // cuBLASLt's A is our B: n x k (k x n stored when transposed); its B is our A: k x m (m x k)
  plan.a = p.vb.trans ? lt_layout(p.type, p.k, p.n, p.vb.ld, p.batch, p.vb.batch_stride)
                      : lt_layout(p.type, p.n, p.k, p.vb.ld, p.batch, p.vb.batch_stride);
  plan.b = p.va.trans ? lt_layout(p.type, p.m, p.k, p.va.ld, p.batch, p.va.batch_stride)
                      : lt_layout(p.type, p.k, p.m, p.va.ld, p.batch, p.va.batch_stride);
  plan.d = lt_layout(p.type, p.n, p.m, p.n, p.batch, p.m * p.n);
  cublasLtMatmulPreference_t pref = nullptr;
  check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t workspace = kCublasWorkspaceBytes;
  const uint32_t align = static_cast<uint32_t>(p.alignment);
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                             sizeof workspace),
        "MAX_WORKSPACE_BYTES");
  for (auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                         CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    check(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &align, sizeof align), "MIN_ALIGNMENT");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle, plan.desc, plan.a, plan.b, plan.d, plan.d, pref, 1, &result, &found);
  (void)cublasLtMatmulPreferenceDestroy(pref);
  plan.ok = status == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (plan.ok) plan.algo = result.algo;
}

}  // namespace

namespace {

// The operands of a product as cuBLAS reads them; the holders keep copies made for it.
struct Operands {
  Tensor a_holder, b_holder;
  MatrixView a, b;
  int64_t k = 0;
};

// Whether the product went through cuBLASLt with the bias epilogue (else the caller does it).
bool gemm_bias_lt(CudaBackend& be, const Operands& v, const Tensor& bias, const Tensor& c) {
  const int64_t batch = c.shape()[0], m = c.shape()[1], n = c.shape()[2];
  const int64_t k = v.k;
  const bool f32 = c.dtype() != DType::f64;  // float32 alpha and beta (f32, bf16, f16)
  const cudaDataType_t type = cuda_type(c.dtype());
  const cublasComputeType_t compute = compute_type(c.dtype());
  void* cp = static_cast<char*>(c.storage()->data()) + c.offset() * static_cast<int64_t>(dtype_size(c.dtype()));
  const void* bp = static_cast<const char*>(bias.storage()->data()) + bias.offset() * static_cast<int64_t>(dtype_size(bias.dtype()));
  const int alignment = std::min({alignment_of(v.a.base), alignment_of(v.b.base), alignment_of(cp), alignment_of(bp)});
  const CudaBackend::LtState::Key key{static_cast<int>(c.dtype()), compute == CUBLAS_COMPUTE_32F_FAST_TF32, batch, m, n, k,
                         v.a.ld, v.b.ld, v.a.batch_stride, v.b.batch_stride, v.a.trans, v.b.trans, alignment,
                         static_cast<int>(CUBLASLT_EPILOGUE_BIAS)};
  CudaBackend::LtState& state = be.lt();
  std::lock_guard lock(state.mutex);
  auto [it, fresh] = state.plans.try_emplace(key);
  CudaBackend::LtState::Plan& plan = it->second;
  if (fresh) {
    try {
      make_plan(state.handle, {type, compute, batch, m, n, k, v.a, v.b, alignment}, plan);
    } catch (const Error&) {
      plan.ok = false;  // a problem cuBLASLt refuses to describe takes the unfused path, every time
    }
  }
  if (!plan.ok) return false;
  check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp), "BIAS_POINTER");
  const float one_f = 1.0f, zero_f = 0.0f;
  const double one_d = 1.0, zero_d = 0.0;
  const void* alpha = f32 ? static_cast<const void*>(&one_f) : &one_d;
  const void* beta = f32 ? static_cast<const void*>(&zero_f) : &zero_d;
  check(cublasLtMatmul(state.handle, plan.desc, alpha, v.b.base, plan.a, v.a.base, plan.b, beta, cp, plan.d, cp, plan.d,
                       &plan.algo, be.cublas_workspace(), kCublasWorkspaceBytes, be.stream()),
        "cublasLtMatmul (bias epilogue)");
  note_launch("gemm + bias (cuBLASLt)");
  return true;
}

}  // namespace

void CudaBackend::gemm_bias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias,
                            const Tensor& c) {
  REMAT_ASSERT(a.dim() == 3 && b.dim() == 3 && c.dim() == 3, "gemm expects rank-3 operands");
  REMAT_ASSERT(c.is_contiguous() && bias.dim() == 1 && bias.size(0) == c.shape()[2]);
  if (c.numel() == 0) return;
  DeviceGuard guard(device_);
  const int64_t k = trans_a ? a.shape()[1] : a.shape()[2];
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  const bool small = c.shape()[0] <= kMaxInt && c.shape()[1] <= kMaxInt && c.shape()[2] <= kMaxInt && k <= kMaxInt;
  if (fast(Fast::gemm_epilogue) && k > 0 && small && bias.is_contiguous()) {
    Operands v;
    v.k = k;
    view_of(*this, a, trans_a, v.a_holder, v.a);
    view_of(*this, b, trans_b, v.b_holder, v.b);
    if (gemm_bias_lt(*this, v, bias, c)) return;
    copy(bias, c);
    return gemm(v.a_holder, trans_a, v.b_holder, trans_b, c, 1.0, 1.0);
  }
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
                                   static_cast<int>(batch), compute_type(c.dtype()), CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx");
  note_launch("gemm (cuBLAS)");
}

}  // namespace remat::cuda
