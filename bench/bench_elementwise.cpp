// Memory-bound kernels over x [4096, 1024] f32, in GB/s of bytes read + written (input and
// output; the [1024] layer_norm weight/bias and the per-row statistics are not counted), next to
// memcpy of the same bytes (one thread, and split across all threads with OpenMP).
//
//   relu, tanh     y = op(x)
//   softmax        y = softmax(x, -1)
//   layer_norm     y = layer_norm(x, weight, bias)
//
// remat ops allocate their output every call, as in real use. Ops that are not implemented yet
// are reported as errors ("not implemented") rather than failing the run.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstring>
#include <functional>
#include <vector>

#include "remat/autodiff.h"
#include "remat/backend.h"
#include "remat/error.h"
#include "remat/ops.h"
#include "remat/tensor.h"

namespace {

constexpr int64_t kRows = 4096, kCols = 1024;
constexpr double kBytes = 2.0 * kRows * kCols * sizeof(float);  // read x + write y

void set_counters(benchmark::State& state) {
  state.counters["GBps"] = benchmark::Counter(kBytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void run_op(benchmark::State& state, const std::function<remat::Tensor(const remat::Tensor&)>& op) {
  remat::NoGradGuard no_grad;
  remat::manual_seed(7);
  remat::Tensor x = remat::randn({kRows, kCols});
  try {
    remat::Tensor y = op(x);  // warm-up; also surfaces "not implemented"
    if (y.shape() != x.shape()) {
      state.SkipWithError("wrong output shape");
      return;
    }
  } catch (const remat::Error& e) {
    state.SkipWithError(e.what());
    return;
  }
  for (auto _ : state) {
    remat::Tensor y = op(x);
    benchmark::DoNotOptimize(y.raw_data());
  }
  set_counters(state);
}

void BM_relu(benchmark::State& state) { run_op(state, [](const remat::Tensor& x) { return remat::relu(x); }); }
void BM_tanh(benchmark::State& state) { run_op(state, [](const remat::Tensor& x) { return remat::tanh(x); }); }
void BM_softmax(benchmark::State& state) {
  run_op(state, [](const remat::Tensor& x) { return remat::softmax(x, -1); });
}
void BM_layer_norm(benchmark::State& state) {
  remat::Tensor weight = remat::ones({kCols}), bias = remat::zeros({kCols});
  run_op(state, [&](const remat::Tensor& x) { return remat::layer_norm(x, weight, bias, 1e-5); });
}

void BM_memcpy(benchmark::State& state) {
  const size_t n = size_t(kRows * kCols);
  std::vector<float> src(n, 1.0f), dst(n, 0.0f);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), n * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_counters(state);
}

void BM_memcpy_threads(benchmark::State& state) {
  const size_t n = size_t(kRows * kCols);
  std::vector<float> src(n, 1.0f), dst(n, 0.0f);
  const int threads = remat::num_threads();
  for (auto _ : state) {
#pragma omp parallel num_threads(threads)
    {
      const size_t t = size_t(omp_get_thread_num()), nt = size_t(omp_get_num_threads());
      const size_t begin = n * t / nt, end = n * (t + 1) / nt;
      std::memcpy(dst.data() + begin, src.data() + begin, (end - begin) * sizeof(float));
    }
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_counters(state);
}

}  // namespace

BENCHMARK(BM_memcpy)->Name("memcpy")->UseRealTime();
BENCHMARK(BM_memcpy_threads)->Name("memcpy_threads")->UseRealTime();
BENCHMARK(BM_relu)->Name("relu")->UseRealTime();
BENCHMARK(BM_tanh)->Name("tanh")->UseRealTime();
BENCHMARK(BM_softmax)->Name("softmax")->UseRealTime();
BENCHMARK(BM_layer_norm)->Name("layer_norm")->UseRealTime();

BENCHMARK_MAIN();
