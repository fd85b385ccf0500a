// Vectorised transcendental functions: remat's hand-written ones (src/tensor/cpu/vmath.h) against
// SLEEF 3.5 (Debian libsleef-dev, AVX2 entry points) and the C library, for accuracy (error in
// ulp against a higher-precision reference over a sweep of inputs) and speed (ns per element,
// one thread, inputs in L1, best of several repetitions).
//
//   build/bench/bench_vmath [--step N]     (default step 97: every 97th float bit pattern)
//
// Accuracy: for float32, the reference is the float64 C library function of the float input,
// and the error of a result y is |y - ref| / ulp(ref), ulp(ref) = the float spacing at ref
// (subnormal spacing below the normal range). For float64 the reference is the long double
// (x87, 64-bit mantissa) function. Every float32 bit pattern in the sweep range is visited at
// the given step, both signs; the table gives the largest error, the mean, and the share of
// inputs more than 1 ulp off.
//
// Built only with SLEEF (bench/CMakeLists.txt) and compiled for AVX2 + FMA; exits with a
// message on a CPU without them.
#include <immintrin.h>
#include <sleef.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tensor/cpu/simd.h"
#include "tensor/cpu/vmath.h"

namespace {

using namespace remat::cpu;

constexpr double kInvSqrt2 = 0.70710678118654752440;

// ---- implementations over arrays (n a multiple of 8)

using F32 = std::function<void(const float*, float*, int64_t)>;
using F64 = std::function<void(const double*, double*, int64_t)>;

void remat_exp(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = vmath::exp_f(x[i]);
}
void remat_tanh(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = vmath::tanh_f(x[i]);
}
void remat_erf(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = vmath::erf_f(x[i]);
}
void remat_erf_vector(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) simd::store(y + i, simd::erf_f32(simd::load(x + i)));
}
void remat_gelu_vector(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    const simd::Vec<float> v = simd::load(x + i);
    simd::store(y + i, 0.5f * v * (1.0f + simd::erf_f32(v * static_cast<float>(kInvSqrt2))));
  }
}
void remat_gelu(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + vmath::erf_f(x[i] * static_cast<float>(kInvSqrt2)));
}

#define REMAT_SLEEF8(name, f)                                                              \
  void name(const float* x, float* y, int64_t n) {                                         \
    for (int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(y + i, f(_mm256_loadu_ps(x + i))); \
  }
#define REMAT_SLEEF4(name, f)                                                              \
  void name(const double* x, double* y, int64_t n) {                                       \
    for (int64_t i = 0; i < n; i += 4) _mm256_storeu_pd(y + i, f(_mm256_loadu_pd(x + i))); \
  }
REMAT_SLEEF8(sleef_expf_u10, Sleef_expf8_u10avx2)
REMAT_SLEEF8(sleef_tanhf_u10, Sleef_tanhf8_u10avx2)
REMAT_SLEEF8(sleef_tanhf_u35, Sleef_tanhf8_u35avx2)
REMAT_SLEEF8(sleef_erff_u10, Sleef_erff8_u10avx2)
REMAT_SLEEF4(sleef_exp_u10, Sleef_expd4_u10avx2)
REMAT_SLEEF4(sleef_tanh_u10, Sleef_tanhd4_u10avx2)
REMAT_SLEEF4(sleef_erf_u10, Sleef_erfd4_u10avx2)
void sleef_gelu(const float* x, float* y, int64_t n) {
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f), k = _mm256_set1_ps(static_cast<float>(kInvSqrt2));
  for (int64_t i = 0; i < n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    __m256 e = Sleef_erff8_u10avx2(_mm256_mul_ps(v, k));
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, e)));
  }
}

#define REMAT_LIBM(name, T, f)                              \
  void name(const T* x, T* y, int64_t n) {                  \
    for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);          \
  }
float gelu_libm_scalar(float x) { return 0.5f * x * (1.0f + ::erff(x * static_cast<float>(kInvSqrt2))); }
REMAT_LIBM(libm_expf, float, ::expf)
REMAT_LIBM(libm_tanhf, float, ::tanhf)
REMAT_LIBM(libm_erff, float, ::erff)
REMAT_LIBM(libm_gelu, float, gelu_libm_scalar)
REMAT_LIBM(libm_exp, double, ::exp)
REMAT_LIBM(libm_tanh, double, ::tanh)
REMAT_LIBM(libm_erf, double, ::erf)

// ---- accuracy

struct Errors {
  double max_ulp = 0, sum_ulp = 0, worst_x = 0;
  uint64_t count = 0, above_one = 0, non_finite_mismatch = 0;
  void add(double x, double err) {
    if (std::isnan(err)) {
      ++non_finite_mismatch;
      return;
    }
    if (err > max_ulp) max_ulp = err, worst_x = x;
    sum_ulp += err;
    above_one += err > 1.0;
    ++count;
  }
};

double ulp_f32(double ref) {
  float r = static_cast<float>(std::fabs(ref));
  if (!(r < std::numeric_limits<float>::max())) r = std::numeric_limits<float>::max();
  if (r < std::numeric_limits<float>::min()) return std::numeric_limits<float>::denorm_min();
  return static_cast<double>(std::nextafter(r, std::numeric_limits<float>::infinity()) - r);
}
double ulp_f64(long double ref) {
  double r = static_cast<double>(fabsl(ref));
  if (!(r < std::numeric_limits<double>::max())) r = std::numeric_limits<double>::max();
  if (r < std::numeric_limits<double>::min()) return std::numeric_limits<double>::denorm_min();
  return std::nextafter(r, std::numeric_limits<double>::infinity()) - r;
}

// Error of y against ref; results that agree exactly (including both infinite) count as 0 and
// a finite/non-finite disagreement as NaN (reported separately).
double error_ulp_f32(float y, double ref) {
  if (static_cast<double>(y) == ref) return 0.0;
  if (!std::isfinite(y) || !std::isfinite(ref)) {
    if (std::isinf(ref) && std::fabs(y) >= std::numeric_limits<float>::max()) return 0.0;  // saturates
    return std::nan("");
  }
  return std::fabs(static_cast<double>(y) - ref) / ulp_f32(ref);
}
double error_ulp_f64(double y, long double ref) {
  if (static_cast<long double>(y) == ref) return 0.0;
  if (!std::isfinite(y) || !std::isfinite(static_cast<double>(ref))) return std::nan("");
  return static_cast<double>(fabsl(static_cast<long double>(y) - ref)) / ulp_f64(ref);
}

// Every step-th float bit pattern with |x| <= limit, both signs.
std::vector<float> sweep_f32(float limit, uint32_t step) {
  std::vector<float> xs;
  uint32_t top;
  std::memcpy(&top, &limit, 4);
  for (uint64_t bits = 0; bits <= top; bits += step) {
    float x;
    uint32_t b = static_cast<uint32_t>(bits);
    std::memcpy(&x, &b, 4);
    xs.push_back(x);
    xs.push_back(-x);
  }
  while (xs.size() % 8) xs.push_back(0.0f);
  return xs;
}

struct Impl32 {
  const char* name;
  F32 run;
};
struct Impl64 {
  const char* name;
  F64 run;
};

double time_ns_per_element(const std::function<void(int64_t)>& call, int64_t n) {
  double best = 1e30;
  for (int rep = 0; rep < 7; ++rep) {
    const int inner = 200;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < inner; ++i) call(n);
    auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count() / (inner * static_cast<double>(n)));
  }
  return best;
}

void report_f32(const char* function, const std::vector<float>& xs, const std::function<double(double)>& reference,
                const std::vector<Impl32>& impls) {
  std::vector<double> ref(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) ref[i] = reference(static_cast<double>(xs[i]));
  std::vector<float> y(xs.size());
  // timing inputs: 4096 values spread over the sweep
  const int64_t n = 4096;
  std::vector<float> tx(n), ty(n);
  for (int64_t i = 0; i < n; ++i) tx[i] = xs[static_cast<size_t>(i) * (xs.size() / n)];
  for (const auto& impl : impls) {
    impl.run(xs.data(), y.data(), static_cast<int64_t>(xs.size()));
    Errors e;
    for (size_t i = 0; i < xs.size(); ++i) e.add(xs[i], error_ulp_f32(y[i], ref[i]));
    double ns = time_ns_per_element([&](int64_t m) { impl.run(tx.data(), ty.data(), m); }, n);
    std::printf("| %s | f32 | %s | %.2f | %.3f | %.4f%% | %.3g | %llu | %.3f |\n", function, impl.name, e.max_ulp,
                e.sum_ulp / std::max<uint64_t>(1, e.count), 100.0 * static_cast<double>(e.above_one) / std::max<uint64_t>(1, e.count),
                e.worst_x, static_cast<unsigned long long>(e.non_finite_mismatch), ns);
  }
}

void report_f64(const char* function, const std::vector<float>& xs32, const std::function<long double(long double)>& reference,
                const std::vector<Impl64>& impls) {
  // float64 inputs: the float sweep widened, plus a low-order perturbation so mantissas are full
  std::vector<double> xs(xs32.size());
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<double>(xs32[i]) * (1.0 + 0x1.23456789abcdp-30);
  std::vector<long double> ref(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) ref[i] = reference(static_cast<long double>(xs[i]));
  std::vector<double> y(xs.size());
  const int64_t n = 4096;
  std::vector<double> tx(n), ty(n);
  for (int64_t i = 0; i < n; ++i) tx[i] = xs[static_cast<size_t>(i) * (xs.size() / n)];
  for (const auto& impl : impls) {
    impl.run(xs.data(), y.data(), static_cast<int64_t>(xs.size()));
    Errors e;
    for (size_t i = 0; i < xs.size(); ++i) e.add(xs[i], error_ulp_f64(y[i], ref[i]));
    double ns = time_ns_per_element([&](int64_t m) { impl.run(tx.data(), ty.data(), m); }, n);
    std::printf("| %s | f64 | %s | %.2f | %.3f | %.4f%% | %.3g | %llu | %.3f |\n", function, impl.name, e.max_ulp,
                e.sum_ulp / std::max<uint64_t>(1, e.count), 100.0 * static_cast<double>(e.above_one) / std::max<uint64_t>(1, e.count),
                e.worst_x, static_cast<unsigned long long>(e.non_finite_mismatch), ns);
  }
}

}  // namespace

int main(int argc, char** argv) {
  uint32_t step = 97;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--step") step = static_cast<uint32_t>(std::max(1, std::atoi(argv[i + 1])));
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    std::printf("bench_vmath: this CPU has no AVX2 + FMA; nothing measured\n");
    return 0;
  }
  std::printf("Transcendental functions: error in ulp over every %u-th float bit pattern in the range (both signs), "
              "time in ns per element (one thread, L1-resident, best of 7)\n\n", step);
  std::printf("| function | dtype | implementation | max ulp | mean ulp | > 1 ulp | worst x | non-finite mismatches | ns / element |\n");
  std::printf("|---|---|---|---:|---:|---:|---:|---:|---:|\n");

  auto exp_range = sweep_f32(87.0f, step);
  report_f32("exp [-87, 87]", exp_range, [](double x) { return std::exp(x); },
             {{"remat vmath::exp_f", remat_exp}, {"SLEEF expf8_u10", sleef_expf_u10}, {"glibc expf", libm_expf}});
  auto tanh_range = sweep_f32(10.0f, step);
  report_f32("tanh [-10, 10]", tanh_range, [](double x) { return std::tanh(x); },
             {{"remat vmath::tanh_f", remat_tanh},
              {"SLEEF tanhf8_u10", sleef_tanhf_u10},
              {"SLEEF tanhf8_u35", sleef_tanhf_u35},
              {"glibc tanhf", libm_tanhf}});
  auto erf_range = sweep_f32(5.0f, step);
  report_f32("erf [-5, 5]", erf_range, [](double x) { return std::erf(x); },
             {{"remat vmath::erf_f", remat_erf}, {"remat simd::erf_f32 (kernels)", remat_erf_vector}, {"SLEEF erff8_u10", sleef_erff_u10}, {"glibc erff", libm_erff}});
  auto gelu_range = sweep_f32(10.0f, step);
  report_f32("gelu (erf) [-10, 10]", gelu_range, [](double x) { return 0.5 * x * (1.0 + std::erf(x * kInvSqrt2)); },
             {{"remat (vmath::erf_f)", remat_gelu}, {"remat gelu kernel (simd::erf_f32)", remat_gelu_vector}, {"SLEEF erff8_u10", sleef_gelu}, {"glibc erff", libm_gelu}});

  auto exp64_range = sweep_f32(700.0f, step * 8);
  report_f64("exp [-700, 700]", exp64_range, [](long double x) { return expl(x); },
             {{"glibc exp (remat today)", libm_exp}, {"SLEEF expd4_u10", sleef_exp_u10}});
  report_f64("tanh [-10, 10]", sweep_f32(10.0f, step * 8), [](long double x) { return tanhl(x); },
             {{"glibc tanh (remat today)", libm_tanh}, {"SLEEF tanhd4_u10", sleef_tanh_u10}});
  report_f64("erf [-5, 5]", sweep_f32(5.0f, step * 8), [](long double x) { return erfl(x); },
             {{"glibc erf (remat today)", libm_erf}, {"SLEEF erfd4_u10", sleef_erf_u10}});
  return 0;
}
