// GEMM throughput: remat::matmul against direct calls of the libraries it could use.
//
//   f32: remat::matmul | dnnl_sgemm (oneDNN) | cblas_sgemm (OpenBLAS) | bli_sgemm (BLIS, optional)
//   f64: remat::matmul | cblas_dgemm (OpenBLAS)
//
// Shapes: C[M, N] = A[M, K] @ B[K, N], row-major, squares 256..2048 and the GPT-block shapes
// (M, N, K) = (8192, 384, 128), (8192, 128, 128), (8192, 512, 128), (8192, 128, 512).
// Every benchmark checks its result against a double-precision reference before timing and
// aborts if it is wrong. Counter GFLOPs = 2*M*N*K per iteration over wall time. Each library
// uses all hardware threads (the remat default).
//
//   build/bench/bench_gemm --benchmark_filter=f32     (see bench/run_bench.sh for the table)
#include <benchmark/benchmark.h>
#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>

#include <cblas.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "remat/autodiff.h"
#include "remat/backend.h"
#include "remat/ops.h"
#include "remat/tensor.h"

extern "C" void openblas_set_num_threads(int);
#ifdef REMAT_BENCH_WITH_BLIS
void blis_sgemm_rowmajor(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c);
void blis_set_threads(int threads);
#endif

namespace {

struct Shape3 {
  int64_t m, n, k;
};

template <class T>
struct Problem {
  Shape3 s;
  remat::Tensor a, b;  // remat tensors; the direct calls read the same storage
  const T* pa() const { return a.template data<T>(); }
  const T* pb() const { return b.template data<T>(); }
};

template <class T>
Problem<T> make_problem(Shape3 s) {
  constexpr remat::DType dt = std::is_same_v<T, float> ? remat::DType::f32 : remat::DType::f64;
  remat::manual_seed(1234);
  return Problem<T>{s, remat::randn({s.m, s.k}, dt), remat::randn({s.k, s.n}, dt)};
}

// Checks C = A @ B two ways, in double precision: Freivalds' test C v == A (B v) for a random v
// (covers every element), and 64 random entries against their dot products. Aborts if wrong.
template <class T>
void check_or_die(const char* who, const Problem<T>& p, const T* c) {
  const int64_t m = p.s.m, n = p.s.n, k = p.s.k;
  const T *a = p.pa(), *b = p.pb();
  const double eps = std::is_same_v<T, float> ? 0x1p-24 : 0x1p-53;
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> v(n), bv(k, 0.0), abs_bv(k, 0.0);
  for (auto& x : v) x = u(rng);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < n; ++j) {
      bv[i] += double(b[i * n + j]) * v[j];
      abs_bv[i] += std::fabs(double(b[i * n + j]) * v[j]);
    }
  for (int64_t i = 0; i < m; ++i) {
    double cv = 0, abv = 0, scale = 0;
    for (int64_t j = 0; j < n; ++j) cv += double(c[i * n + j]) * v[j];
    for (int64_t l = 0; l < k; ++l) {
      abv += double(a[i * k + l]) * bv[l];
      scale += std::fabs(double(a[i * k + l])) * abs_bv[l];
    }
    if (!(std::fabs(cv - abv) <= 4.0 * double(k + n) * eps * scale + 1e-30)) {
      std::fprintf(stderr, "%s [%lld x %lld x %lld]: wrong result in row %lld (C v = %.9g, A B v = %.9g)\n", who,
                   (long long)m, (long long)n, (long long)k, (long long)i, cv, abv);
      std::abort();
    }
  }
  std::uniform_int_distribution<int64_t> ri(0, m - 1), rj(0, n - 1);
  for (int t = 0; t < 64; ++t) {
    int64_t i = ri(rng), j = rj(rng);
    double want = 0, scale = 0;
    for (int64_t l = 0; l < k; ++l) {
      want += double(a[i * k + l]) * double(b[l * n + j]);
      scale += std::fabs(double(a[i * k + l]) * double(b[l * n + j]));
    }
    if (!(std::fabs(double(c[i * n + j]) - want) <= 4.0 * double(k) * eps * scale + 1e-30)) {
      std::fprintf(stderr, "%s [%lld x %lld x %lld]: C[%lld, %lld] = %.9g, want %.9g\n", who, (long long)m,
                   (long long)n, (long long)k, (long long)i, (long long)j, double(c[i * n + j]), want);
      std::abort();
    }
  }
}

void set_counters(benchmark::State& state, Shape3 s) {
  state.counters["GFLOPs"] = benchmark::Counter(2.0 * double(s.m) * double(s.n) * double(s.k) * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k));
}

template <class T>
void BM_remat(benchmark::State& state, Shape3 s) {
  remat::NoGradGuard no_grad;
  auto p = make_problem<T>(s);
  {
    remat::Tensor c = remat::matmul(p.a, p.b).contiguous();
    check_or_die<T>("remat::matmul", p, c.template data<T>());
  }
  for (auto _ : state) {
    remat::Tensor c = remat::matmul(p.a, p.b);
    benchmark::DoNotOptimize(c.raw_data());
  }
  set_counters(state, s);
}

void BM_dnnl_sgemm(benchmark::State& state, Shape3 s) {
  auto p = make_problem<float>(s);
  std::vector<float> c(size_t(s.m * s.n));
  auto run = [&] {
    if (dnnl_sgemm('N', 'N', s.m, s.n, s.k, 1.0f, p.pa(), s.k, p.pb(), s.n, 0.0f, c.data(), s.n) != dnnl_success) {
      std::fprintf(stderr, "dnnl_sgemm failed\n");
      std::abort();
    }
  };
  run();
  check_or_die<float>("dnnl_sgemm", p, c.data());
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(c.data());
  }
  set_counters(state, s);
}

void BM_openblas_sgemm(benchmark::State& state, Shape3 s) {
  auto p = make_problem<float>(s);
  std::vector<float> c(size_t(s.m * s.n));
  auto run = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(s.m), int(s.n), int(s.k), 1.0f, p.pa(), int(s.k),
                p.pb(), int(s.n), 0.0f, c.data(), int(s.n));
  };
  run();
  check_or_die<float>("cblas_sgemm (OpenBLAS)", p, c.data());
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(c.data());
  }
  set_counters(state, s);
}

void BM_openblas_dgemm(benchmark::State& state, Shape3 s) {
  auto p = make_problem<double>(s);
  std::vector<double> c(size_t(s.m * s.n));
  auto run = [&] {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(s.m), int(s.n), int(s.k), 1.0, p.pa(), int(s.k),
                p.pb(), int(s.n), 0.0, c.data(), int(s.n));
  };
  run();
  check_or_die<double>("cblas_dgemm (OpenBLAS)", p, c.data());
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(c.data());
  }
  set_counters(state, s);
}

#ifdef REMAT_BENCH_WITH_BLIS
void BM_blis_sgemm(benchmark::State& state, Shape3 s) {
  auto p = make_problem<float>(s);
  std::vector<float> c(size_t(s.m * s.n));
  blis_sgemm_rowmajor(s.m, s.n, s.k, p.pa(), p.pb(), c.data());
  check_or_die<float>("bli_sgemm (BLIS)", p, c.data());
  for (auto _ : state) {
    blis_sgemm_rowmajor(s.m, s.n, s.k, p.pa(), p.pb(), c.data());
    benchmark::DoNotOptimize(c.data());
  }
  set_counters(state, s);
}
#endif

// OpenBLAS and BLIS both export cblas_*; the link order must make OpenBLAS's win, or the
// "OpenBLAS" column (and remat's own f64 path) would silently measure another library.
void check_cblas_provider() {
  for (void* fn : {reinterpret_cast<void*>(&cblas_sgemm), reinterpret_cast<void*>(&cblas_dgemm)}) {
    Dl_info info{};
    if (dladdr(fn, &info) == 0 || info.dli_fname == nullptr || std::string(info.dli_fname).find("openblas") == std::string::npos) {
      std::fprintf(stderr, "bench_gemm: cblas_* resolve to %s, not OpenBLAS\n",
                   info.dli_fname ? info.dli_fname : "(unknown)");
      std::abort();
    }
  }
}

std::string name(const char* impl, const char* dtype, Shape3 s) {
  return std::string(dtype) + "/" + impl + "/" + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
         std::to_string(s.k);
}

}  // namespace

int main(int argc, char** argv) {
  check_cblas_provider();
  const int threads = remat::num_threads();  // remat's default: all hardware threads
  openblas_set_num_threads(threads);
#ifdef REMAT_BENCH_WITH_BLIS
  blis_set_threads(threads);
#endif
  benchmark::AddCustomContext("threads", std::to_string(threads));

  const std::vector<Shape3> f32_shapes = {{256, 256, 256},   {512, 512, 512},   {1024, 1024, 1024},
                                          {2048, 2048, 2048}, {8192, 384, 128}, {8192, 128, 128},
                                          {8192, 512, 128},  {8192, 128, 512}};
  for (Shape3 s : f32_shapes) {
    benchmark::RegisterBenchmark(name("remat", "f32", s).c_str(), BM_remat<float>, s)->UseRealTime();
    benchmark::RegisterBenchmark(name("onednn", "f32", s).c_str(), BM_dnnl_sgemm, s)->UseRealTime();
    benchmark::RegisterBenchmark(name("openblas", "f32", s).c_str(), BM_openblas_sgemm, s)->UseRealTime();
#ifdef REMAT_BENCH_WITH_BLIS
    benchmark::RegisterBenchmark(name("blis", "f32", s).c_str(), BM_blis_sgemm, s)->UseRealTime();
#endif
  }
  for (Shape3 s : std::vector<Shape3>{{512, 512, 512}, {1024, 1024, 1024}}) {
    benchmark::RegisterBenchmark(name("remat", "f64", s).c_str(), BM_remat<double>, s)->UseRealTime();
    benchmark::RegisterBenchmark(name("openblas", "f64", s).c_str(), BM_openblas_dgemm, s)->UseRealTime();
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
