// Checkpointing policies on a 16-block residual MLP chain: peak saved-activation bytes (from the
// allocator) and median step time (forward + backward), each policy measured in the same run,
// round-robin, with ratios to save-all.
//
//   build/bench/bench_checkpoint [--blocks 16] [--width 256] [--batch 256] [--steps 7]
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

struct Options {
  int blocks = 16, width = 256, batch = 256, steps = 7;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    int v = std::atoi(argv[i + 1]);
    if (k == "--blocks") o.blocks = v;
    else if (k == "--width") o.width = v;
    else if (k == "--batch") o.batch = v;
    else if (k == "--steps") o.steps = v;
  }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  const int hidden = 4 * o.width;
  std::vector<Tensor> params;
  Chain chain;
  for (int i = 0; i < o.blocks; ++i) {
    uint64_t s = static_cast<uint64_t>(i) * 16;
    Tensor w1 = randn({o.width, hidden}, DType::f32, {s + 1, 0}, 0.0, 1.0 / std::sqrt(o.width)).requires_grad_();
    Tensor b1 = zeros({hidden}).requires_grad_();
    Tensor w2 = randn({hidden, o.width}, DType::f32, {s + 2, 0}, 0.0, 0.5 / std::sqrt(hidden)).requires_grad_();
    Tensor b2 = zeros({o.width}).requires_grad_();
    params.insert(params.end(), {w1, b1, w2, b2});
    chain.add([=](const Tensor& h) { return add(h, add(matmul(gelu(add(matmul(h, w1), b1), true), w2), b2)); });
  }
  Tensor x = randn({o.batch, o.width}, DType::f32, {99, 0});

  const std::vector<std::string> policies = {"save-all", "every-layer", "every-k:4", "selective:matmul"};
  std::vector<std::vector<double>> times(policies.size());
  std::vector<size_t> peaks(policies.size(), 0);
  std::vector<double> recomputed_flops(policies.size(), 0), total_flops(policies.size(), 0);
  for (int round = 0; round <= o.steps; ++round) {  // round 0 is the warm-up
    for (size_t p = 0; p < policies.size(); ++p) {
      for (auto& t : params) t.zero_grad();
      Policy policy = Policy::parse(policies[p]);
      memory::reset_peaks();
      reset_counters();
      size_t base = memory::live_bytes(memory::Tag::saved);
      auto t0 = std::chrono::steady_clock::now();
      backward([&] { return mean(chain.forward(x)); }, GradOptions{policy});
      auto t1 = std::chrono::steady_clock::now();
      if (round == 0) continue;
      times[p].push_back(std::chrono::duration<double>(t1 - t0).count());
      peaks[p] = memory::peak_bytes(memory::Tag::saved) - base;
      recomputed_flops[p] = counters().ops.recomputed_flops;
      total_flops[p] = counters().ops.forward_flops;
    }
  }
  std::printf("16-block residual MLP chain: blocks=%d width=%d hidden=%d batch=%d, f32, %d threads, median of %d steps\n",
              o.blocks, o.width, hidden, o.batch, num_threads(), o.steps);
  std::printf("%-18s %16s %12s %14s %12s %14s\n", "policy", "peak saved B", "vs save-all", "median step s",
              "vs save-all", "recompute %");
  double base_time = median(times[0]);
  for (size_t p = 0; p < policies.size(); ++p) {
    double t = median(times[p]);
    std::printf("%-18s %16zu %12.3f %14.4f %12.3f %13.1f%%\n", policies[p].c_str(), peaks[p],
                static_cast<double>(peaks[p]) / static_cast<double>(peaks[0]), t, t / base_time,
                100.0 * recomputed_flops[p] / std::max(1.0, total_flops[p] - recomputed_flops[p]));
  }
  return 0;
}
