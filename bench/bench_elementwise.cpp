// Memory-bound kernels over x [4096, 1024] f32, in GB/s of bytes read + written (inputs and
// output of the size of x; the [1024] weight/bias, per-row statistics and targets are not
// counted), next to memcpy of 2 x 16 MiB (one thread, and split across all threads with OpenMP).
//
//   relu, tanh, gelu, gelu_tanh   y = op(x)                              (read x, write y)
//   softmax, log_softmax          y = op(x, -1)                          (read x, write y)
//   layer_norm, rms_norm          y = op(x, weight[, bias])              (read x, write y)
//   cross_entropy                 per-row loss and the log-sum-exp per row its backward keeps
//                                 (read x; counted as read x, write [N, C], the traffic of the
//                                 log-softmax it kept before, so figures compare with earlier runs)
//   *_backward                    the backend's backward kernel, as the op's backward formula
//                                 calls it (softmax: read y, gy, write gx; layer_norm: read x,
//                                 gy, write gx; cross_entropy: read x, write glogits; ...)
//   adamw_step                    one AdamW update of x's size, in place (read the parameter,
//                                 its gradient and both moments, write the parameter and the
//                                 moments: 7 x 16 MiB a step)
//
// remat ops allocate their output every call, as in real use; the backward kernels get a freshly
// allocated output per call too. Ops that are not implemented yet are reported as errors rather
// than failing the run.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cmath>
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

void set_counters(benchmark::State& state, double bytes = kBytes) {
  state.counters["GBps"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
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

void BM_log_softmax(benchmark::State& state) {
  run_op(state, [](const remat::Tensor& x) { return remat::log_softmax(x, -1); });
}
void BM_rms_norm(benchmark::State& state) {
  remat::Tensor weight = remat::ones({kCols});
  run_op(state, [&](const remat::Tensor& x) { return remat::rms_norm(x, weight, 1e-6); });
}
void BM_gelu(benchmark::State& state) { run_op(state, [](const remat::Tensor& x) { return remat::gelu(x); }); }
void BM_gelu_tanh(benchmark::State& state) {
  run_op(state, [](const remat::Tensor& x) { return remat::gelu(x, true); });
}

// ---- kernels called through the backend, output allocated per call

remat::Tensor targets_for_rows() {
  std::vector<int64_t> t(kRows);
  for (int64_t r = 0; r < kRows; ++r) t[r] = (r * 37) % kCols;
  return remat::from_indices(t, {kRows});
}

// Times body() (which allocates and fills its output) and reports `bytes` per call.
void run_kernel(benchmark::State& state, double bytes, const std::function<remat::Tensor()>& body) {
  remat::NoGradGuard no_grad;
  try {
    body();
  } catch (const remat::Error& e) {
    state.SkipWithError(e.what());
    return;
  }
  for (auto _ : state) {
    remat::Tensor out = body();
    benchmark::DoNotOptimize(out.raw_data());
  }
  set_counters(state, bytes);
}

remat::Tensor empty_like_x() { return remat::Tensor::empty({kRows, kCols}); }

void BM_cross_entropy(benchmark::State& state) {
  remat::manual_seed(7);
  remat::Tensor x = remat::randn({kRows, kCols}), targets = targets_for_rows();
  remat::Tensor losses = remat::Tensor::empty({kRows}), scale = remat::Tensor::empty({});
  run_kernel(state, kBytes, [&] {
    remat::Tensor lse = remat::Tensor::empty({kRows});
    remat::cpu_backend().cross_entropy(x, targets, 0.0, -100, losses, lse, scale);
    return lse;
  });
}

void BM_softmax_backward(benchmark::State& state, bool log) {
  remat::manual_seed(8);
  remat::Tensor x = remat::randn({kRows, kCols});
  remat::Tensor y = log ? remat::log_softmax(x, -1) : remat::softmax(x, -1), gy = remat::randn({kRows, kCols});
  run_kernel(state, 1.5 * kBytes, [&] {
    remat::Tensor gx = empty_like_x();
    remat::cpu_backend().softmax_backward(y, gy, gx, log);
    return gx;
  });
}

void BM_layer_norm_backward(benchmark::State& state) {
  remat::manual_seed(9);
  remat::Tensor x = remat::randn({kRows, kCols}), gy = remat::randn({kRows, kCols});
  remat::Tensor weight = remat::ones({kCols}), bias = remat::zeros({kCols});
  remat::Tensor mean = remat::Tensor::empty({kRows}), rstd = remat::Tensor::empty({kRows});
  remat::cpu_backend().layer_norm(x, weight, bias, 1e-5, empty_like_x(), mean, rstd);
  remat::Tensor gw = remat::Tensor::empty({kCols}), gb = remat::Tensor::empty({kCols});
  run_kernel(state, 1.5 * kBytes, [&] {
    remat::Tensor gx = empty_like_x();
    remat::cpu_backend().layer_norm_backward(x, weight, mean, rstd, gy, gx, gw, gb);
    return gx;
  });
}

void BM_rms_norm_backward(benchmark::State& state) {
  remat::manual_seed(10);
  remat::Tensor x = remat::randn({kRows, kCols}), gy = remat::randn({kRows, kCols});
  remat::Tensor weight = remat::ones({kCols}), rstd = remat::Tensor::empty({kRows});
  remat::cpu_backend().rms_norm(x, weight, 1e-6, empty_like_x(), rstd);
  remat::Tensor gw = remat::Tensor::empty({kCols});
  run_kernel(state, 1.5 * kBytes, [&] {
    remat::Tensor gx = empty_like_x();
    remat::cpu_backend().rms_norm_backward(x, weight, rstd, gy, gx, gw);
    return gx;
  });
}

void BM_cross_entropy_backward(benchmark::State& state) {
  remat::manual_seed(11);
  remat::Tensor x = remat::randn({kRows, kCols}), targets = targets_for_rows();
  remat::Tensor lse = remat::Tensor::empty({kRows}), gloss = remat::full({kRows}, 1.0 / kRows);
  remat::Tensor losses = remat::Tensor::empty({kRows}), scale = remat::Tensor::empty({});
  remat::cpu_backend().cross_entropy(x, targets, 0.0, -100, losses, lse, scale);
  run_kernel(state, kBytes, [&] {
    remat::Tensor g = empty_like_x();
    remat::cpu_backend().cross_entropy_backward(x, lse, targets, gloss, 0.0, -100, g);
    return g;
  });
}

void BM_unary_backward(benchmark::State& state, remat::UnaryOp op) {
  remat::manual_seed(12);
  remat::Tensor x = remat::randn({kRows, kCols}), gy = remat::randn({kRows, kCols});
  remat::Tensor y = empty_like_x();
  remat::cpu_backend().unary(op, x, y, 0.0);
  run_kernel(state, 1.5 * kBytes, [&] {
    remat::Tensor gx = empty_like_x();
    remat::cpu_backend().unary_backward(op, x, y, gy, gx, 0.0);
    return gx;
  });
}

void BM_adamw_step(benchmark::State& state) {
  remat::NoGradGuard no_grad;
  remat::manual_seed(7);
  remat::Tensor p = remat::randn({kRows, kCols}), g = remat::randn({kRows, kCols});
  remat::Tensor m = remat::zeros({kRows, kCols}), v = remat::zeros({kRows, kCols});
  remat::AdamWStep s;
  s.weight_decay = 0.1;
  int64_t t = 0;
  for (auto _ : state) {
    ++t;
    s.bias_correction1 = 1.0 - std::pow(s.beta1, static_cast<double>(t));
    s.bias_correction2 = 1.0 - std::pow(s.beta2, static_cast<double>(t));
    remat::cpu_backend().adamw_step(p, g, m, v, s);
    benchmark::DoNotOptimize(p.raw_data());
  }
  set_counters(state, 3.5 * kBytes);  // 4 arrays read, 3 written
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
BENCHMARK(BM_log_softmax)->Name("log_softmax")->UseRealTime();
BENCHMARK(BM_rms_norm)->Name("rms_norm")->UseRealTime();
BENCHMARK(BM_cross_entropy)->Name("cross_entropy")->UseRealTime();
BENCHMARK(BM_gelu)->Name("gelu")->UseRealTime();
BENCHMARK(BM_gelu_tanh)->Name("gelu_tanh")->UseRealTime();
BENCHMARK(BM_adamw_step)->Name("adamw_step")->UseRealTime();
BENCHMARK_CAPTURE(BM_softmax_backward, softmax, false)->Name("softmax_backward")->UseRealTime();
BENCHMARK_CAPTURE(BM_softmax_backward, log_softmax, true)->Name("log_softmax_backward")->UseRealTime();
BENCHMARK(BM_layer_norm_backward)->Name("layer_norm_backward")->UseRealTime();
BENCHMARK(BM_rms_norm_backward)->Name("rms_norm_backward")->UseRealTime();
BENCHMARK(BM_cross_entropy_backward)->Name("cross_entropy_backward")->UseRealTime();
BENCHMARK_CAPTURE(BM_unary_backward, gelu, remat::UnaryOp::gelu)->Name("gelu_backward")->UseRealTime();
BENCHMARK_CAPTURE(BM_unary_backward, gelu_tanh, remat::UnaryOp::gelu_tanh)->Name("gelu_tanh_backward")->UseRealTime();
BENCHMARK_CAPTURE(BM_unary_backward, tanh, remat::UnaryOp::tanh)->Name("tanh_backward")->UseRealTime();

BENCHMARK_MAIN();
