// CPU matrix products. Library choice, by measurement on the target machines (2-core Zen4, see
// bench/bench_gemm.cpp and docs/performance.md, "Kernel choices"): float32 goes to oneDNN's dnnl_sgemm (about 93% of peak
// on every shape, runtime ISA dispatch, no environment variables needed); float64 goes to
// OpenBLAS's cblas_dgemm (oneDNN has no dgemm; OpenBLAS picks a correct AVX-512 kernel here);
// bf16 operands left unwidened go to oneDNN's bf16 matmul (gemm_bf16.cpp).
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include <cblas.h>

#include <limits>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/signal_guard.h"

extern "C" void openblas_set_num_threads(int);

namespace remat::cpu {

void set_gemm_threads(int threads) { openblas_set_num_threads(threads); }

namespace {

// A matrix operand as BLAS sees it: its base pointer and layout (tensor/kernel_common.h).
struct MatrixView {
  const void* base = nullptr;
  kernel::MatrixLayout layout;
};

// Returns false when the strides are not BLAS-compatible (then the caller copies the operand).
// CBLAS takes int dimensions: a leading dimension beyond INT_MAX is copied to a compact one.
bool blas_view(const Tensor& t, bool logical_trans, MatrixView& view) {
  view.base = t.raw_data();
  return kernel::matrix_layout(t, logical_trans, std::numeric_limits<int>::max(), view.layout);
}

template <class T>
void gemm_one(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
              int64_t ldb, T beta, T* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    FullThreads full;  // oneDNN may split k over threads: its results depend on their number
    SignalsHeldBack held;  // its kernels may run with rsp in the heap (Note [signals and oneDNN's kernels])
    dnnl_status_t status = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    REMAT_ASSERT(status == dnnl_success, "dnnl_sgemm failed with status ", static_cast<int>(status));
  } else {
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
                static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
                beta, c, static_cast<int>(ldc));
  }
}

// A contiguous copy of t, and a float32 copy of a 16-bit t.
Tensor compact(Backend& backend, const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), t.dtype());
  backend.copy(t, out);
  return out;
}
Tensor widened(Backend& backend, const Tensor& t) {
  if (!is_16bit_float(t.dtype())) return t;
  Tensor out = Tensor::empty(t.shape(), DType::f32);
  backend.copy(t, out);
  return out;
}

}  // namespace

template <class T>
void gemm_rowmajor(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
                   int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  gemm_one<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
template void gemm_rowmajor<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                                   int64_t, float, float*, int64_t);
template void gemm_rowmajor<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                                    const double*, int64_t, double, double*, int64_t);

void CpuKernels::gemm(const Tensor& a_in, bool trans_a, const Tensor& b_in, bool trans_b, const Tensor& c,
                      double alpha, double beta) {
  REMAT_ASSERT(a_in.dim() == 3 && b_in.dim() == 3 && c.dim() == 3, "gemm expects rank-3 operands");
  REMAT_ASSERT(c.is_contiguous());
  const int64_t batch = c.shape()[0], m = c.shape()[1], n = c.shape()[2];
  const int64_t k = trans_a ? a_in.shape()[1] : a_in.shape()[2];
  if (batch == 0 || m == 0 || n == 0) return;
  // OpenBLAS's CBLAS takes int sizes (oneDNN's sgemm takes int64): refuse what would truncate
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  REMAT_CHECK(c.dtype() != DType::f64 || (m <= kMaxInt && n <= kMaxInt && k <= kMaxInt), "matmul: f64 product of [", m,
              ", ", k, "] and [", k, ", ", n, "] has a dimension above 2^31 - 1, which the f64 BLAS cannot take");
  // bf16 inputs come here unwidened where the CPU multiplies bf16 (Note [bf16 products]); a pair
  // of one bf16 and one float32 operand is multiplied in float32
  const bool same = a_in.dtype() == b_in.dtype();
  Tensor a = same ? a_in : widened(*this, a_in), b = same ? b_in : widened(*this, b_in);
  MatrixView va, vb;
  if (!blas_view(a, trans_a, va)) {
    a = compact(*this, a);
    blas_view(a, trans_a, va);
  }
  if (!blas_view(b, trans_b, vb)) {
    b = compact(*this, b);
    blas_view(b, trans_b, vb);
  }
  if (a.dtype() == DType::bf16 && k > 0) return gemm_bf16(a, va.layout, b, vb.layout, c, k, alpha, beta);
  dispatch_float(c.dtype(), "matmul", [&]<class scalar_t>() {
    using T = scalar_t;
    const T* ap = static_cast<const T*>(va.base);
    const T* bp = static_cast<const T*>(vb.base);
    T* cp = c.data<T>();
    const T al = static_cast<T>(alpha), be = static_cast<T>(beta);
    if (k == 0) {
      // C = beta * C
      for (int64_t i = 0; i < batch * m * n; ++i) cp[i] = beta == 0 ? T(0) : be * cp[i];
      return;
    }
    auto one = [&](int64_t i) {
      gemm_one<T>(va.layout.trans, vb.layout.trans, m, n, k, al, ap + i * va.layout.batch_stride, va.layout.ld,
                  bp + i * vb.layout.batch_stride, vb.layout.ld, be, cp + i * m * n, n);
    };
    // Many small products: one per thread (each runs single-threaded inside the parallel region).
    // Large products: one at a time, the library parallelises inside.
    const double per_product = static_cast<double>(m) * n * k;
    bool small = per_product < 256.0 * 256 * 256;
    // below ~64k multiply-adds in total a parallel region costs more than it saves
    bool worth_threads = per_product * static_cast<double>(batch) >= 65536.0;
    if (std::is_same_v<T, float> && batch > 1 && small && worth_threads) {
#pragma omp parallel for schedule(dynamic)
      for (int64_t i = 0; i < batch; ++i) one(i);
    } else {
      for (int64_t i = 0; i < batch; ++i) one(i);
    }
  });
}

// The bias goes into c first and the product is added to it: the bits the op had before the kernel.
void CpuKernels::gemm_bias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias,
                           const Tensor& c) {
  if (c.numel() == 0) return;
  copy(bias, c);
  gemm(a, trans_a, b, trans_b, c, 1.0, 1.0);
}

}  // namespace remat::cpu
