// Checkpointing policies on a 16-block residual MLP, written twice: as a remat::Chain of layer
// functions, and as a user's own nn::Module class whose forward loops over its blocks (the way a
// user writes a model; every block call is a layer call, so a region by default). Peak
// saved-activation bytes (from the allocator) and median step time (forward + backward), every
// policy and both writings measured in the same run, round-robin, with ratios to save-all and of
// the user loop to the Chain.
//
//   build/bench/bench_checkpoint [--blocks 16] [--width 256] [--batch 256] [--steps 7]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "remat/nn.h"
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

// h + W2 gelu(W1 h + b1) + b2, with its weights as module parameters.
class Block : public nn::Module {
 public:
  Block(int width, int hidden, uint64_t seed) {
    w1 = register_parameter("w1", randn({width, hidden}, DType::f32, {seed + 1, 0}, 0.0, 1.0 / std::sqrt(width)));
    b1 = register_parameter("b1", zeros({hidden}));
    w2 = register_parameter("w2", randn({hidden, width}, DType::f32, {seed + 2, 0}, 0.0, 0.5 / std::sqrt(hidden)));
    b2 = register_parameter("b2", zeros({width}));
  }
  Tensor compute(const Tensor& h) const { return add(h, add(matmul(gelu(add(matmul(h, w1), b1), true), w2), b2)); }
  Tensor forward_impl(const Tensor& h) override { return compute(h); }
  Tensor w1, b1, w2, b2;
};

// The user's model: a loop over its blocks, no container.
class UserModel : public nn::Module {
 public:
  UserModel(int blocks, int width, int hidden) {
    for (int i = 0; i < blocks; ++i)
      layers.push_back(register_module("block" + std::to_string(i),
                                       std::make_shared<Block>(width, hidden, static_cast<uint64_t>(i) * 16)));
  }
  Tensor forward_impl(const Tensor& x) override {
    Tensor h = x;
    for (auto& layer : layers) h = layer->forward(h);
    return h;
  }
  std::vector<std::shared_ptr<Block>> layers;
};

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  const int hidden = 4 * o.width;
  UserModel model(o.blocks, o.width, hidden);
  Chain chain;  // the same blocks, as layer functions
  for (const auto& block : model.layers) {
    std::shared_ptr<Block> b = block;
    chain.add([b](const Tensor& h) { return b->compute(h); });
  }
  Tensor x = randn({o.batch, o.width}, DType::f32, {99, 0});

  const std::vector<std::string> policies = {"save-all", "every-layer", "every-k:4", "selective:matmul"};
  const char* writings[] = {"Chain", "user loop"};
  // [writing][policy]
  std::vector<std::vector<std::vector<double>>> times(2, std::vector<std::vector<double>>(policies.size()));
  std::vector<std::vector<size_t>> peaks(2, std::vector<size_t>(policies.size(), 0));
  std::vector<std::vector<uint64_t>> regions(2, std::vector<uint64_t>(policies.size(), 0));
  std::vector<double> recomputed_flops(policies.size(), 0), total_flops(policies.size(), 0);
  std::vector<std::string> digests[2];
  for (int round = 0; round <= o.steps; ++round) {  // round 0 is the warm-up
    for (size_t p = 0; p < policies.size(); ++p) {
      for (int w = 0; w < 2; ++w) {
        model.zero_grad();
        Policy policy = Policy::parse(policies[p]);
        memory::reset_peaks();
        reset_counters();
        size_t base = memory::live_bytes(memory::Tag::saved);
        auto t0 = std::chrono::steady_clock::now();
        backward([&] { return mean(w == 0 ? chain.forward(x) : model.forward(x)); }, GradOptions{policy});
        auto t1 = std::chrono::steady_clock::now();
        if (round == 0) continue;
        times[w][p].push_back(std::chrono::duration<double>(t1 - t0).count());
        peaks[w][p] = memory::peak_bytes(memory::Tag::saved) - base;
        regions[w][p] = counters().regions_created;
        if (w == 1) {
          recomputed_flops[p] = counters().ops.recomputed_flops;
          total_flops[p] = counters().ops.forward_flops;
        }
      }
    }
  }
  // the result is checked before the timings are trusted: both writings give the same gradients
  bool equal = true;
  for (size_t p = 0; p < policies.size(); ++p) {
    TensorList g[2];
    for (int w = 0; w < 2; ++w) {
      model.zero_grad();
      backward([&] { return mean(w == 0 ? chain.forward(x) : model.forward(x)); }, GradOptions{Policy::parse(policies[p])});
      for (auto& t : model.parameters()) g[w].push_back(t.grad().clone());
    }
    for (size_t i = 0; i < g[0].size(); ++i)
      equal = equal && std::memcmp(g[0][i].contiguous().raw_data(), g[1][i].contiguous().raw_data(), g[0][i].nbytes()) == 0;
  }
  std::printf("%d-block residual MLP: blocks=%d width=%d hidden=%d batch=%d, f32, %d threads, median of %d steps\n",
              o.blocks, o.blocks, o.width, hidden, o.batch, num_threads(), o.steps);
  std::printf("gradients of the two writings bitwise equal under every policy: %s\n", equal ? "yes" : "NO");
  std::printf("%-18s %-10s %8s %16s %12s %14s %12s %14s\n", "policy", "written as", "regions", "peak saved B",
              "vs save-all", "median step s", "vs save-all", "recompute %");
  for (size_t p = 0; p < policies.size(); ++p) {
    for (int w = 0; w < 2; ++w) {
      double t = median(times[w][p]);
      std::printf("%-18s %-10s %8llu %16zu %12.3f %14.4f %12.3f %13.1f%%\n", policies[p].c_str(), writings[w],
                  static_cast<unsigned long long>(regions[w][p]), peaks[w][p],
                  static_cast<double>(peaks[w][p]) / static_cast<double>(peaks[w][0]), t, t / median(times[w][0]),
                  100.0 * recomputed_flops[p] / std::max(1.0, total_flops[p] - recomputed_flops[p]));
    }
    std::printf("%-18s %-10s %8s %16.3f %12s %14.3f\n", "", "loop/Chain", "",
                static_cast<double>(peaks[1][p]) / static_cast<double>(std::max<size_t>(1, peaks[0][p])), "",
                median(times[1][p]) / median(times[0][p]));
  }
  return equal ? 0 : 1;
}
