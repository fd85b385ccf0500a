// CPU backend: its instance, threads, data movement and random fills. (The registry of other
// devices' backends is src/tensor/registry.cpp.)
#include "tensor/cpu/cpu_backend.h"

#include "tensor/cpu/cpu_level.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

namespace remat {

Backend& cpu_backend() {
  static cpu::CpuBackend* instance = new cpu::CpuBackend();
  return *instance;
}

void set_num_threads(int threads) {
  REMAT_CHECK(threads >= 1, "set_num_threads: need at least one thread, got ", threads);
  cpu_backend().set_num_threads(threads);
}
int num_threads() { return cpu_backend().num_threads(); }

namespace detail {

namespace {
thread_local bool yielding = false;
}

bool yield_core(bool on) {
  const bool before = yielding;
  if (on == before) return before;
  yielding = on;
  const int full = num_threads();
  omp_set_num_threads(on ? std::max(1, full - 1) : full);
  return before;
}

bool no_spare_core() {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set)
                                                                  : static_cast<int>(std::thread::hardware_concurrency());
  return num_threads() > 1 && cores > 0 && cores <= num_threads();
}

}  // namespace detail

}  // namespace remat

namespace remat::cpu {


void set_gemm_threads(int threads);  // gemm.cpp

namespace {
// What set_num_threads asked for (the OpenMP setting of a yielding thread is one less).
std::atomic<int> configured_threads{0};
}  // namespace

CpuKernels::CpuKernels() { cpu_level(); }

void CpuKernels::set_num_threads(int threads) {
  configured_threads = threads;
  omp_set_num_threads(threads);
  set_gemm_threads(threads);
}
int CpuKernels::num_threads() const {
  const int n = configured_threads.load();
  if (n > 0) return n;
  static const int initial = omp_get_max_threads();  // first asked before any thread yields
  return initial;
}

FullThreads::FullThreads() {
  if (omp_in_parallel()) return;
  const int full = cpu_backend().num_threads();
  if (omp_get_max_threads() == full) return;
  restore_ = omp_get_max_threads();
  omp_set_num_threads(full);
}
FullThreads::~FullThreads() {
  if (restore_ > 0) omp_set_num_threads(restore_);
}

Tensor contiguous_input(const Tensor& t) {
  if (!t.defined() || t.is_contiguous()) return t;
  Tensor c = Tensor::empty(t.shape(), t.dtype(), memory::Tag::other, t.device());
  cpu_backend().copy(t, c);
  return c;
}

template <class Dst, class Src>
static void copy_typed(const Tensor& src, const Tensor& dst) {
  auto layout = make_layout<2>(dst.shape(), {broadcast_strides(dst, dst.shape()), broadcast_strides(src, dst.shape())},
                               {dst.offset(), src.offset()});
  Dst* d = static_cast<Dst*>(dst.storage()->data());
  const Src* s = static_cast<const Src*>(src.storage()->data());
  for_each_run<2>(layout, [&](int64_t n, std::array<int64_t, 2> off, std::array<int64_t, 2> st) {
    Dst* dp = d + off[0];
    const Src* sp = s + off[1];
    if (st[0] == 1 && st[1] == 1) {
      if constexpr (std::is_same_v<Dst, Src>) {
        std::memcpy(dp, sp, static_cast<size_t>(n) * sizeof(Dst));
      } else {
        for (int64_t i = 0; i < n; ++i) dp[i] = static_cast<Dst>(sp[i]);
      }
    } else {
      for (int64_t i = 0; i < n; ++i) dp[i * st[0]] = static_cast<Dst>(sp[i * st[1]]);
    }
  });
}

template <class Dst>
static void copy_from(const Tensor& src, const Tensor& dst) {
  switch (src.dtype()) {
    case DType::f32: return copy_typed<Dst, float>(src, dst);
    case DType::f64: return copy_typed<Dst, double>(src, dst);
    case DType::i64: return copy_typed<Dst, int64_t>(src, dst);
    case DType::bf16: return copy_typed<Dst, bfloat16>(src, dst);
    case DType::f16: return copy_typed<Dst, float16>(src, dst);
  }
}

// Host memory is the CPU's memory: the device verbs are plain copies of contiguous bytes.
void CpuKernels::copy_from_host(const void* host, const Tensor& dst) {
  REMAT_ASSERT(dst.is_contiguous(), "copy_from_host: the destination must be contiguous");
  if (dst.nbytes() > 0) std::memcpy(dst.raw_data(), host, dst.nbytes());
}
void CpuKernels::copy_to_host(const Tensor& src, void* host) {
  REMAT_ASSERT(src.is_contiguous(), "copy_to_host: the source must be contiguous");
  if (src.nbytes() > 0) std::memcpy(host, src.raw_data(), src.nbytes());
}

void CpuKernels::copy(const Tensor& src, const Tensor& dst) {
  if (dst.numel() == 0) return;
  switch (dst.dtype()) {
    case DType::f32: return copy_from<float>(src, dst);
    case DType::f64: return copy_from<double>(src, dst);
    case DType::i64: return copy_from<int64_t>(src, dst);
    case DType::bf16: return copy_from<bfloat16>(src, dst);
    case DType::f16: return copy_from<float16>(src, dst);
  }
}

template <class T>
static void fill_typed(const Tensor& dst, T value) {
  auto layout = make_layout<1>(dst.shape(), {broadcast_strides(dst, dst.shape())}, {dst.offset()});
  T* d = static_cast<T*>(dst.storage()->data());
  for_each_run<1>(layout, [&](int64_t n, std::array<int64_t, 1> off, std::array<int64_t, 1> st) {
    T* p = d + off[0];
    if (st[0] == 1)
      for (int64_t i = 0; i < n; ++i) p[i] = value;
    else
      for (int64_t i = 0; i < n; ++i) p[i * st[0]] = value;
  });
}

void CpuKernels::fill(const Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  switch (dst.dtype()) {
    case DType::f32: return fill_typed<float>(dst, static_cast<float>(value));
    case DType::f64: return fill_typed<double>(dst, value);
    case DType::i64: return fill_typed<int64_t>(dst, static_cast<int64_t>(value));
    case DType::bf16: return fill_typed<bfloat16>(dst, bfloat16(value));
    case DType::f16: return fill_typed<float16>(dst, float16(value));
  }
}

void CpuKernels::arange(const Tensor& dst, double start, double step) {
  REMAT_ASSERT(dst.is_contiguous());
  int64_t n = dst.numel();
  switch (dst.dtype()) {
    case DType::f32:
      for (int64_t i = 0; i < n; ++i) dst.data<float>()[i] = static_cast<float>(start + step * static_cast<double>(i));
      break;
    case DType::f64:
      for (int64_t i = 0; i < n; ++i) dst.data<double>()[i] = start + step * static_cast<double>(i);
      break;
    case DType::i64:
      for (int64_t i = 0; i < n; ++i) dst.data<int64_t>()[i] = static_cast<int64_t>(start + step * static_cast<double>(i));
      break;
    case DType::bf16:
    case DType::f16: REMAT_ASSERT(false, "arange: 16-bit floats are widened first (widen.cpp)");
  }
}

// Element i of a random tensor uses words (offset + i) (uniform) or (offset + 2i, offset + 2i + 1)
// (normal), so the values do not depend on how the loop is split across threads.
void CpuKernels::rand_uniform(const Tensor& dst, RngState state, double low, double high) {
  REMAT_ASSERT(dst.is_contiguous());
  int64_t n = dst.numel();
  dispatch_float(dst.dtype(), "rand", [&]<class scalar_t>() {
    scalar_t* d = dst.data<scalar_t>();
    const scalar_t lo = static_cast<scalar_t>(low), span = static_cast<scalar_t>(high - low);
#pragma omp parallel for schedule(static) if (n >= kParallelThreshold)
    for (int64_t i = 0; i < n; ++i) {
      uint32_t w = philox_word(state, static_cast<uint64_t>(i));
      scalar_t u = std::is_same_v<scalar_t, float> ? static_cast<scalar_t>(uniform_float(w))
                                                   : static_cast<scalar_t>(uniform_double(w));
      d[i] = lo + span * u;
    }
  });
}

void CpuKernels::rand_normal(const Tensor& dst, RngState state, double mean, double stddev) {
  REMAT_ASSERT(dst.is_contiguous());
  int64_t n = dst.numel();
  dispatch_float(dst.dtype(), "randn", [&]<class scalar_t>() {
    scalar_t* d = dst.data<scalar_t>();
#pragma omp parallel for schedule(static) if (n >= kParallelThreshold)
    for (int64_t i = 0; i < n; ++i) {
      uint32_t w0 = philox_word(state, 2 * static_cast<uint64_t>(i));
      uint32_t w1 = philox_word(state, 2 * static_cast<uint64_t>(i) + 1);
      double u1 = (static_cast<double>(w0) + 1.0) * (1.0 / 4294967297.0);  // (0, 1)
      double u2 = uniform_double(w1);
      double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
      d[i] = static_cast<scalar_t>(mean + stddev * z);
    }
  });
}

}  // namespace remat::cpu
