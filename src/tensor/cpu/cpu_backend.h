// Internal: the CPU backend. Kernels are split by family into the .cpp files beside this one.
#pragma once

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "remat/backend.h"
#include "tensor/kernel_common.h"

namespace remat::cpu {

// The kernels in f32, f64 and i64: every kernel of remat/backend.h, one family per .cpp file beside
// this one. copy, fill and digest also take bf16 and f16 (a conversion, a constant, the bytes).
class CpuKernels : public Backend {
 public:
  CpuKernels();  // chooses the kernels' level (cpu_level.h): a remat::Error for a level the CPU lacks
  DeviceType device_type() const override { return DeviceType::cpu; }
  memory::Allocator& allocator() override { return memory::cpu(); }
  void set_num_threads(int threads) override;
  int num_threads() const override;
  void copy_from_host(const void* host, const Tensor& dst) override;
  void copy_to_host(const Tensor& src, void* host) override;
  bool holds(DType) const override { return true; }

  REMAT_OVERRIDE_KERNELS()
};

// The CPU backend: the kernels above, and bf16 and f16 computed in float32 (widen.cpp, Note
// [16-bit floats on the CPU]). Not final: the test-only emulated device (tests/emulated_backend.h)
// reuses these kernels on its own memory.
class CpuBackend : public CpuKernels {
 public:
  REMAT_OPTIONAL_KERNELS(REMAT_KERNEL_OVERRIDE)
};

// Row-major C = alpha op(A) op(B) + beta C on raw pointers through the GEMM library of the dtype
// (gemm.cpp): float -> oneDNN dnnl_sgemm, double -> OpenBLAS cblas_dgemm.
template <class T>
void gemm_rowmajor(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                   const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// c[b] = alpha op(a[b]) op(b[b]) + beta c[b] of bf16 a and b into float32 c (contiguous), through
// oneDNN's bf16 matmul (gemm_bf16.cpp, Note [bf16 products]); la and lb as kernel::matrix_layout.
void gemm_bf16(const Tensor& a, const kernel::MatrixLayout& la, const Tensor& b, const kernel::MatrixLayout& lb,
               const Tensor& c, int64_t k, double alpha, double beta);

// Below this many elements a kernel runs on one thread (thread start-up costs more).
inline constexpr int64_t kParallelThreshold = 1 << 15;

// ---- strided iteration over an output shape with broadcast inputs
// Operand 0 is the output (contiguous); others are inputs broadcast to the output's shape.
// Adjacent axes that are contiguous for every operand are merged, so the common case is one
// long inner loop with unit (or zero) strides that the compiler vectorises.
template <size_t N>
struct StridedLayout {
  std::vector<int64_t> shape;                    // collapsed shape
  std::array<std::vector<int64_t>, N> strides;   // per operand, in elements
  std::array<int64_t, N> offsets{};              // per operand base offset
};

// Strides of `t` broadcast to `shape` (0 on broadcast axes), aligned right.
using kernel::broadcast_strides;

template <size_t N>
StridedLayout<N> make_layout(const Shape& shape, const std::array<std::vector<int64_t>, N>& strides,
                             const std::array<int64_t, N>& offsets) {
  StridedLayout<N> layout;
  layout.offsets = offsets;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;  // size-1 axes never move
    bool merge = !layout.shape.empty();
    if (merge)
      for (size_t k = 0; k < N; ++k)
        if (layout.strides[k].back() != strides[k][i] * shape[i]) merge = false;
    if (merge) {
      layout.shape.back() *= shape[i];
      for (size_t k = 0; k < N; ++k) layout.strides[k].back() = strides[k][i];
    } else {
      layout.shape.push_back(shape[i]);
      for (size_t k = 0; k < N; ++k) layout.strides[k].push_back(strides[k][i]);
    }
  }
  if (layout.shape.empty()) {
    layout.shape.push_back(1);
    for (size_t k = 0; k < N; ++k) layout.strides[k].push_back(0);
  }
  return layout;
}

// Calls inner(count, offsets, inner_strides) for each run of the innermost axis, in parallel
// over the outer index when the total is large.
template <size_t N, class Inner>
void for_each_run(const StridedLayout<N>& layout, Inner&& inner) {
  const int64_t rank = static_cast<int64_t>(layout.shape.size());
  const int64_t inner_count = layout.shape.back();
  int64_t outer_count = 1;
  for (int64_t i = 0; i + 1 < rank; ++i) outer_count *= layout.shape[i];
  std::array<int64_t, N> inner_strides;
  for (size_t k = 0; k < N; ++k) inner_strides[k] = layout.strides[k].back();
  auto run_outer = [&](int64_t o) {
    std::array<int64_t, N> off = layout.offsets;
    int64_t rem = o;
    for (int64_t i = rank - 2; i >= 0; --i) {
      int64_t idx = rem % layout.shape[i];
      rem /= layout.shape[i];
      for (size_t k = 0; k < N; ++k) off[k] += idx * layout.strides[k][i];
    }
    inner(inner_count, off, inner_strides);
  };
  if (outer_count == 1) {
    // one long run: split it across threads
    const int64_t total = inner_count;
    if (total >= kParallelThreshold) {
#pragma omp parallel
      {
        int threads = omp_get_num_threads();
        int id = omp_get_thread_num();
        int64_t chunk = (total + threads - 1) / threads;
        chunk = (chunk + 15) / 16 * 16;
        int64_t begin = std::min<int64_t>(total, chunk * id), end = std::min<int64_t>(total, begin + chunk);
        if (end > begin) {
          std::array<int64_t, N> off = layout.offsets;
          for (size_t k = 0; k < N; ++k) off[k] += begin * inner_strides[k];
          inner(end - begin, off, inner_strides);
        }
      }
    } else {
      inner(total, layout.offsets, inner_strides);
    }
    return;
  }
  if (outer_count * inner_count >= kParallelThreshold) {
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < outer_count; ++o) run_outer(o);
  } else {
    for (int64_t o = 0; o < outer_count; ++o) run_outer(o);
  }
}


// Accumulator type of reductions: f32 sums accumulate in f64.
template <class T>
using Acc = std::conditional_t<std::is_same_v<T, float>, double, T>;

// Runs body(r) for r in [0, rows), in parallel when rows * cols is large.
template <class Body>
void for_rows(int64_t rows, int64_t cols, Body&& body) {
  if (rows > 1 && rows * cols >= kParallelThreshold) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) body(r);
  } else {
    for (int64_t r = 0; r < rows; ++r) body(r);
  }
}

// gelu.cpp: exact GELU and its backward over contiguous float32 (hand-vectorised)
void gelu_f32_contiguous(const float* x, float* y, int64_t n);
void gelu_backward_f32_contiguous(const float* x, const float* gy, float* gx, int64_t n);

// Runs body(r0, r1) over consecutive ranges of rows covering [0, rows): one range per thread
// when rows * cols is large, else one range.
template <class Body>
void for_row_ranges(int64_t rows, int64_t cols, Body&& body) {
  if (rows > 1 && rows * cols >= kParallelThreshold) {
#pragma omp parallel
    {
      const int64_t threads = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t r0 = rows * id / threads, r1 = rows * (id + 1) / threads;
      if (r1 > r0) body(r0, r1);
    }
  } else if (rows > 0) {
    body(0, rows);
  }
}

// For kernels whose results depend on the thread count (GEMM, oneDNN convolutions): runs them
// on num_threads() even on a thread that yields a core (detail::yield_core), so that results do
// not change. Does nothing inside a parallel region.
class FullThreads {
 public:
  FullThreads();
  ~FullThreads();
  FullThreads(const FullThreads&) = delete;
  FullThreads& operator=(const FullThreads&) = delete;

 private:
  int restore_ = 0;
};

// A contiguous tensor with the values of t (t itself when it already is contiguous). Kernels
// are called with contiguous inputs; this only guards against a caller that forgets.
Tensor contiguous_input(const Tensor& t);

// dtype dispatch: calls f.template operator()<T>() with T = float or double (tensor/kernel_common.h).
//   dispatch_float(x.dtype(), "exp", [&]<class scalar_t>() { ... });
using kernel::dispatch_float;

}  // namespace remat::cpu
