// Candidate: the gemm_bias row (a linear layer's product and bias) as one cuBLASLt call with
// CUBLASLT_EPILOGUE_BIAS, instead of the library's copy of the bias into C and a GEMM with beta 1
// (src/tensor/cuda/gemm.cpp). The harness checks it against the library's kernel with a tolerance
// (cuBLASLt's kernels sum in another order) and asks it to repeat its own bits.
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
#include <limits>
#include <map>
#include <mutex>
#include <tuple>

#include "candidates/cuda/candidates.h"

namespace remat::candidates::cuda {

using remat::cuda::check;
using remat::cuda::kCublasWorkspaceBytes;
using remat::cuda::note_launch;

namespace {

// A [batch, rows, cols] operand as cuBLAS sees it (as src/tensor/cuda/gemm.cpp's).
struct MatrixView {
  const void* base = nullptr;
  int64_t batch_stride = 0;
  int64_t ld = 0;
  bool trans = false;
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

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return CUDA_R_32F;
    case DType::f64: return CUDA_R_64F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: throw Error(detail::concat("gemm_bias on cuda: unsupported dtype ", dtype_name(dtype)));
  }
}
cublasComputeType_t compute_type(DType dtype, bool tf32) {
  if (dtype == DType::f64) return CUBLAS_COMPUTE_64F;
  return dtype == DType::f32 && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

// The largest of 16, 8, 4, 2, 1 bytes that divides the address.
int alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int align = 16;
  while (align > 1 && a % static_cast<uintptr_t>(align) != 0) align /= 2;
  return align;
}

}  // namespace


struct LtState {
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

// The process's cuBLASLt handle and plans (the harness runs one device at a time).
LtState& lt() {
  static LtState* state = [] {
    auto* s = new LtState();  // kept to exit: destroying handles at exit races the driver's teardown
    check(cublasLtCreate(&s->handle), "cublasLtCreate");
    return s;
  }();
  return *state;
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

void make_plan(cublasLtHandle_t handle, const LtProblem& p, LtState::Plan& plan) {
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
  const cublasComputeType_t compute = compute_type(c.dtype(), be.options().tf32);
  void* cp = static_cast<char*>(c.storage()->data()) + c.offset() * static_cast<int64_t>(dtype_size(c.dtype()));
  const void* bp = static_cast<const char*>(bias.storage()->data()) + bias.offset() * static_cast<int64_t>(dtype_size(bias.dtype()));
  const int alignment = std::min({alignment_of(v.a.base), alignment_of(v.b.base), alignment_of(cp), alignment_of(bp)});
  const LtState::Key key{static_cast<int>(c.dtype()), compute == CUBLAS_COMPUTE_32F_FAST_TF32, batch, m, n, k,
                         v.a.ld, v.b.ld, v.a.batch_stride, v.b.batch_stride, v.a.trans, v.b.trans, alignment,
                         static_cast<int>(CUBLASLT_EPILOGUE_BIAS)};
  LtState& state = lt();
  std::lock_guard lock(state.mutex);
  auto [it, fresh] = state.plans.try_emplace(key);
  LtState::Plan& plan = it->second;
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


bool gemm_bias_epilogue(CudaBackend& be, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                        const Tensor& bias, const Tensor& c) {
  if (a.dim() != 3 || b.dim() != 3 || c.dim() != 3 || !c.is_contiguous() || !bias.is_contiguous() || c.numel() == 0)
    return false;
  const int64_t k = trans_a ? a.shape()[1] : a.shape()[2];
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  const bool small = c.shape()[0] <= kMaxInt && c.shape()[1] <= kMaxInt && c.shape()[2] <= kMaxInt && k <= kMaxInt;
  if (k == 0 || !small) return false;
  remat::cuda::DeviceGuard guard(be.device());
  Operands v;
  v.k = k;
  view_of(be, a, trans_a, v.a_holder, v.a);
  view_of(be, b, trans_b, v.b_holder, v.b);
  return gemm_bias_lt(be, v, bias, c);
}

}  // namespace remat::candidates::cuda
