// The CIFAR ResNet of examples/resnet under every policy at two depths: peak saved-activation
// bytes (the allocator's saved account) and median step time (forward, loss, backward, SGD),
// all configurations measured in the same run, round-robin, with ratios to save-all. Each
// (depth, policy) has its own model from the same seed; the budget sits halfway between
// every-layer's and save-all's peaks (its first steps profile and plan; they are warm-up).
// Before timing, every policy's first-step gradients are checked bitwise against save-all's.
// The PyTorch side of the same comparison is bench/peers (models resnet, resnet-110).
//
//   build/bench/bench_resnet [--depths 20,110] [--width 16] [--batch 32] [--steps 5] [--threads 2]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "remat/nn.h"
#include "remat/remat.h"

using namespace remat;

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<int64_t> depths = {20, 110};
  int64_t width = 16, batch = 32;
  int steps = 5, threads = 2;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--depths") {
      o.depths.clear();
      for (size_t s = 0; s <= v.size();) {
        const size_t c = std::min(v.find(',', s), v.size());
        o.depths.push_back(std::stoll(v.substr(s, c - s)));
        s = c + 1;
      }
    } else if (k == "--width") o.width = std::stoll(v);
    else if (k == "--batch") o.batch = std::stoll(v);
    else if (k == "--steps") o.steps = std::stoi(v);
    else if (k == "--threads") o.threads = std::stoi(v);
    else {
      std::fprintf(stderr, "usage: bench_resnet [--depths 20,110] [--width 16] [--batch 32] [--steps 5] [--threads 2]\n");
      std::exit(2);
    }
  }
  for (int64_t d : o.depths)
    if (d < 8 || (d - 2) % 6 != 0) {
      std::fprintf(stderr, "bench_resnet: depth %lld is not 6n + 2 (n >= 1)\n", static_cast<long long>(d));
      std::exit(2);
    }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.shape() == cb.shape() && std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

struct Config {
  int64_t depth;
  Policy policy;
  std::shared_ptr<nn::ResNet> model;
  std::unique_ptr<nn::SGD> opt;
  std::vector<double> times;
  size_t peak_saved = 0;
  double recomputed = 0;  // recomputed / first-run forward FLOPs
  bool grads_equal = true;
};

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  set_num_threads(o.threads);
  auto data = nn::make_synthetic_images({.count = o.batch, .seed = 5});
  std::vector<Config> configs;
  for (int64_t depth : o.depths) {
    const nn::ResNetConfig rc{.blocks_per_stage = (depth - 2) / 6, .width = o.width, .seed = 1};
    // save-all and every-layer first: the budget is placed between their peaks
    auto make = [&](Policy p) {
      Config c{depth, p, std::make_shared<nn::ResNet>(rc), nullptr, {}, 0, 0, true};
      c.opt = std::make_unique<nn::SGD>(c.model->parameters(), nn::SGDOptions{.lr = 1e-4});
      return c;
    };
    const int64_t blocks = 3 * rc.blocks_per_stage + 2;
    const int k = std::max(2, static_cast<int>(std::lround(std::sqrt(static_cast<double>(blocks)))));
    for (Policy p : {Policy::save_all(), Policy::every_layer(), Policy::every_k(k), Policy::selective({"conv2d"})})
      configs.push_back(make(p));
    configs.push_back(make(Policy::budget(1)));  // the real budget is placed in the first round
  }
  auto step = [&](Config& c, bool measure, bool update = true) {
    ScopedPolicy scoped(c.policy);
    memory::reset_peaks();
    reset_counters();
    const size_t base = memory::live_bytes(memory::Tag::saved);
    const auto t0 = Clock::now();
    c.opt->zero_grad();
    Tensor loss = c.model->loss(data.images, data.labels);
    loss.backward();
    if (update) c.opt->step();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!measure) return;
    c.times.push_back(seconds);
    c.peak_saved = memory::peak_bytes(memory::Tag::saved) - base;
    const auto ops = counters().ops;
    c.recomputed = ops.recomputed_flops / std::max(1.0, ops.forward_flops - ops.recomputed_flops);
  };
  // round 0: first steps; check gradients against save-all of the same depth; place the budgets
  TensorList reference;
  for (size_t i = 0; i < configs.size(); ++i) {
    Config& c = configs[i];
    if (c.policy.keep.kind == Policy::Kind::budget) {
      const Config& sa = configs[i - 4];
      const Config& el = configs[i - 3];
      c.policy = Policy::budget(el.peak_saved + (sa.peak_saved - std::min(sa.peak_saved, el.peak_saved)) / 2);
      for (int w = 0; w < BudgetPlanner::kProfilingSteps; ++w) step(c, false, false);  // profile, no update
    }
    ScopedPolicy scoped(c.policy);
    memory::reset_peaks();
    const size_t base = memory::live_bytes(memory::Tag::saved);
    c.opt->zero_grad();
    c.model->loss(data.images, data.labels).backward();
    c.peak_saved = memory::peak_bytes(memory::Tag::saved) - base;
    TensorList grads;
    for (const auto& p : c.model->parameters()) grads.push_back(p.grad());
    if (i % 5 == 0) reference = grads;  // save-all of this depth comes first
    for (size_t p = 0; p < grads.size(); ++p) c.grads_equal = c.grads_equal && bitwise_equal(grads[p], reference[p]);
  }
  for (int round = 0; round <= o.steps; ++round)  // round 0: warm-up
    for (auto& c : configs) step(c, round > 0);

  std::printf("bench_resnet: pre-activation CIFAR ResNet, width %lld, batch %lld, 32x32 images, f32, %d threads, "
              "median of %d steps (round-robin)\n\n",
              static_cast<long long>(o.width), static_cast<long long>(o.batch), num_threads(), o.steps);
  std::printf("| depth | policy | peak saved bytes | vs save-all | median step s | vs save-all | recomputed FLOPs | "
              "gradients vs save-all |\n|---:|---|---:|---:|---:|---:|---:|---|\n");
  bool ok = true;
  for (size_t i = 0; i < configs.size(); ++i) {
    const Config& c = configs[i];
    const Config& sa = configs[i - (i % 5)];
    ok = ok && c.grads_equal;
    std::printf("| %lld | %s | %zu | %.3f | %.4f | %.3f | %.0f%% | %s |\n", static_cast<long long>(c.depth),
                c.policy.to_string().c_str(), c.peak_saved,
                static_cast<double>(c.peak_saved) / static_cast<double>(sa.peak_saved), median(c.times),
                median(c.times) / median(sa.times), 100.0 * c.recomputed,
                &c == &sa ? "(reference)" : c.grads_equal ? "bitwise equal" : "DIFFERENT");
  }
  return ok ? 0 : 1;
}
