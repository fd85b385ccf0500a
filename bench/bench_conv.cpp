// The convolution library choice: remat's im2col + GEMM against oneDNN's convolution primitives
// (on the NCHW tensors as they are, and in oneDNN's preferred blocked layouts with reorders in
// and out), float32, forward / backward data / backward weights, on the shapes of the CIFAR
// ResNets of examples/resnet (and a few others), plus the float64 path (im2col + OpenBLAS dgemm).
// Every algorithm's results are checked against im2col's before anything is timed. Each time is
// the best of --reps repetitions of at least --min-time seconds; the algorithms of one shape are
// measured in the same round, interleaved, so that a disturbance hits all of them.
//
//   build/bench/bench_conv [--batch 64] [--reps 5] [--min-time 0.2] [--threads 2] [--quick]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "remat/remat.h"

using namespace remat;

namespace {

using Clock = std::chrono::steady_clock;

struct Shape2d {
  std::string name;
  int64_t c, h, w, o, k, stride, pad, groups;
};

struct Options {
  int64_t batch = 64;
  int reps = 5;
  double min_time = 0.2;
  int threads = 2;
  bool quick = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--batch") o.batch = std::stoll(next());
    else if (a == "--reps") o.reps = std::stoi(next());
    else if (a == "--min-time") o.min_time = std::stod(next());
    else if (a == "--threads") o.threads = std::stoi(next());
    else if (a == "--quick") o.quick = true;
    else {
      std::fprintf(stderr, "usage: bench_conv [--batch N] [--reps R] [--min-time S] [--threads T] [--quick]\n");
      std::exit(2);
    }
  }
  return o;
}

// Best seconds per call of fn over reps repetitions of at least min_time.
template <class F>
double best_time(F&& fn, const Options& o) {
  fn();  // warm-up (builds oneDNN primitives)
  double best = 1e30;
  for (int r = 0; r < o.reps; ++r) {
    int calls = 0;
    const auto t0 = Clock::now();
    double elapsed = 0;
    do {
      fn();
      ++calls;
      elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    } while (elapsed < o.min_time);
    best = std::min(best, elapsed / calls);
  }
  return best;
}

double max_relative_difference(const Tensor& a, const Tensor& b) {
  auto va = a.to_vector(), vb = b.to_vector();
  double scale = 1e-30, diff = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    scale = std::max(scale, std::abs(vb[i]));
    diff = std::max(diff, std::abs(va[i] - vb[i]));
  }
  return diff / scale;
}

struct Problem {
  Tensor x, w, gy;
  Conv2dGeometry g;
  Shape y_shape;
};

Problem make_problem(const Shape2d& s, int64_t batch, DType dtype) {
  Problem p;
  p.x = randn({batch, s.c, s.h, s.w}, dtype, RngState{1, 0});
  p.w = randn({s.o, s.c / s.groups, s.k, s.k}, dtype, RngState{2, 0}, 0.0, 0.1);
  p.g = {s.stride, s.stride, s.pad, s.pad, 1, 1, s.groups};
  const int64_t oh = (s.h + 2 * s.pad - s.k) / s.stride + 1, ow = (s.w + 2 * s.pad - s.k) / s.stride + 1;
  p.y_shape = {batch, s.o, oh, ow};
  p.gy = randn(p.y_shape, dtype, RngState{3, 0});
  return p;
}

struct Results {
  Tensor y, gx, gw;
};

Results run_all(const Problem& p) {
  Backend& be = cpu_backend();
  Results r{Tensor::empty(p.y_shape, p.x.dtype()), Tensor::empty(p.x.shape(), p.x.dtype()),
            Tensor::empty(p.w.shape(), p.x.dtype())};
  be.conv2d(p.x, p.w, Tensor(), p.g, r.y);
  be.conv2d_backward_input(p.gy, p.w, p.g, r.gx);
  be.conv2d_backward_weight(p.x, p.gy, p.g, r.gw, Tensor());
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  set_num_threads(o.threads);
  const std::vector<Shape2d> all_shapes = {
      {"stem 3->16, 32x32", 3, 32, 32, 16, 3, 1, 1, 1},
      {"stage1 16->16, 32x32", 16, 32, 32, 16, 3, 1, 1, 1},
      {"stage2 down 16->32 s2", 16, 32, 32, 32, 3, 2, 1, 1},
      {"stage2 32->32, 16x16", 32, 16, 16, 32, 3, 1, 1, 1},
      {"shortcut 1x1 16->32 s2", 16, 32, 32, 32, 1, 2, 0, 1},
      {"stage3 64->64, 8x8", 64, 8, 8, 64, 3, 1, 1, 1},
      {"wide 64->64, 32x32", 64, 32, 32, 64, 3, 1, 1, 1},
      {"r18 128->128, 16x16", 128, 16, 16, 128, 3, 1, 1, 1},
      {"depthwise 64, 16x16", 64, 16, 16, 64, 3, 1, 1, 64},
  };
  std::vector<Shape2d> shapes = all_shapes;
  if (o.quick) shapes = {all_shapes[1], all_shapes[3], all_shapes[4], all_shapes[5]};
  const std::vector<ConvAlgorithm> algorithms = {ConvAlgorithm::im2col_gemm, ConvAlgorithm::onednn_plain,
                                                 ConvAlgorithm::onednn_blocked};

  std::printf("bench_conv: batch %lld, %d threads, best of %d x >= %.2f s; milliseconds per call (GFLOP/s)\n",
              static_cast<long long>(o.batch), num_threads(), o.reps, o.min_time);
  std::printf("\n| shape | pass | im2col + GEMM | oneDNN plain | oneDNN blocked | f64 im2col + dgemm | best f32 |\n");
  std::printf("|---|---|---:|---:|---:|---:|---|\n");
  std::vector<double> totals(algorithms.size(), 0.0);
  bool ok = true;
  for (const auto& s : shapes) {
    Problem p = make_problem(s, o.batch, DType::f32);
    Problem p64 = make_problem(s, o.batch, DType::f64);
    const double flops = 2.0 * static_cast<double>(p.y_shape[0] * p.y_shape[1] * p.y_shape[2] * p.y_shape[3]) *
                         static_cast<double>(s.c / s.groups * s.k * s.k);
    // check: every algorithm against im2col, and f32 im2col against f64
    set_conv_algorithm(ConvAlgorithm::im2col_gemm);
    Results ref = run_all(p);
    Results ref64 = run_all(p64);
    for (auto [name, a, b] : {std::tuple{"y", ref.y, ref64.y}, {"gx", ref.gx, ref64.gx}, {"gw", ref.gw, ref64.gw}}) {
      const double d = max_relative_difference(a, b.to(DType::f32));
      if (d > 1e-4) {
        std::printf("CHECK FAILED: %s %s f32 im2col vs f64: %.3g\n", s.name.c_str(), name, d);
        ok = false;
      }
    }
    for (auto a : algorithms) {
      set_conv_algorithm(a);
      Results r = run_all(p);
      for (auto [name, got, want] : {std::tuple{"y", r.y, ref.y}, {"gx", r.gx, ref.gx}, {"gw", r.gw, ref.gw}}) {
        const double d = max_relative_difference(got, want);
        if (d > 1e-4) {
          std::printf("CHECK FAILED: %s %s %s vs im2col: %.3g\n", s.name.c_str(), conv_algorithm_name(a), name, d);
          ok = false;
        }
      }
    }
    Backend& be = cpu_backend();
    const char* passes[3] = {"forward", "backward data", "backward weights"};
    for (int pass = 0; pass < 3; ++pass) {
      auto call = [&](const Problem& q, Results& r) {
        if (pass == 0) be.conv2d(q.x, q.w, Tensor(), q.g, r.y);
        else if (pass == 1) be.conv2d_backward_input(q.gy, q.w, q.g, r.gx);
        else be.conv2d_backward_weight(q.x, q.gy, q.g, r.gw, Tensor());
      };
      std::vector<double> t(algorithms.size(), 1e30);
      Results out = ref;
      // interleaved rounds: one repetition of each algorithm per round
      Options one = o;
      one.reps = 1;
      for (int round = 0; round < o.reps; ++round)
        for (size_t i = 0; i < algorithms.size(); ++i) {
          set_conv_algorithm(algorithms[i]);
          t[i] = std::min(t[i], best_time([&] { call(p, out); }, one));
        }
      set_conv_algorithm(ConvAlgorithm::im2col_gemm);
      Results out64 = ref64;
      const double t64 = best_time([&] { call(p64, out64); }, one);
      size_t best = static_cast<size_t>(std::min_element(t.begin(), t.end()) - t.begin());
      std::printf("| %s | %s |", s.name.c_str(), passes[pass]);
      for (size_t i = 0; i < t.size(); ++i) {
        totals[i] += t[i];
        std::printf(" %s%.3f (%.0f)%s |", i == best ? "**" : "", 1e3 * t[i], flops / t[i] * 1e-9, i == best ? "**" : "");
      }
      std::printf(" %.3f (%.0f) | %s |\n", 1e3 * t64, flops / t64 * 1e-9, conv_algorithm_name(algorithms[best]));
    }
  }
  std::printf("| **all shapes and passes** | total ms |");
  for (double t : totals) std::printf(" %.2f |", 1e3 * t);
  std::printf(" | |\n");
  set_conv_algorithm(ConvAlgorithm::automatic);
  std::printf("\nautomatic (float32) = the algorithm conv2d uses by default; checks %s\n", ok ? "passed" : "FAILED");
  return ok ? 0 : 1;
}
