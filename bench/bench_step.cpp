// bench_step: training steps of a GPT at given shapes, with step time, model-FLOPs utilisation and
// memory, for the targets of docs/performance.md and for profiling.
//
//   build/bench/bench_step [--layers 4] [--width 128] [--heads 4] [--seq 64] [--batch 12]
//                          [--vocab 65] [--policy save-all] [--steps 10] [--warmup 2]
//                          [--threads 2] [--optimizer sgd|adamw] [--fuse-optimizer] [--json]
//                          [--no-peak] [--attention fused|explicit] [--no-recompute-check]
//
// Defaults are nanoGPT's CPU configuration (shakespeare_char: 4 layers, 4 heads, width 128,
// context 64, batch 12, vocabulary 65). A step is: drop the gradients, forward, loss, backward,
// optimizer update (SGD lr 1e-4 without momentum, as in bench/peers, or AdamW). The steps run in
// measured_step(), a function of its own, so that a profiler can select them:
//   valgrind --tool=callgrind --toggle-collect='*measured_step*' build/bench/bench_step --steps 3
//
// Model FLOPs per step (as nanoGPT's estimate_mfu, PaLM appendix B):
//   tokens * (6 * N + 12 * L * T * C)
// with N the parameters that multiply (all but the token and position embeddings: the blocks,
// ln_f and lm_head), L layers, T the context, C the width (12 L T C = 12 L H Q T for H heads of
// size Q). Recomputation is not model work: checkpointing lowers MFU. The sgemm peak is measured
// in the same run: the best of 5 remat::matmul calls at 1024 x 1024 x 1024 f32 on the same
// threads; MFU = model FLOPs per step / median step time / that peak.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "remat/nn.h"
#include "remat/remat.h"

using namespace remat;

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  nn::GPTConfig config{.vocab = 65, .layers = 4, .width = 128, .heads = 4, .seq = 64, .dropout = 0.0,
                       .dtype = DType::f32, .seed = 1};
  int64_t batch = 12;
  std::string policy = "save-all", optimizer = "sgd";
  int steps = 10, warmup = 2, threads = 2;
  bool fuse_optimizer = false, json = false, measure_peak = true;
  bool recompute_check = true;  // --no-recompute-check: remat::set_recomputation_check(false)
};

std::vector<int64_t> tokens(size_t n, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> v(n);
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& t : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<int64_t>((x >> 33) % static_cast<uint64_t>(vocab));
  }
  return v;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

double sgemm_peak_flops() {
  NoGradGuard no_grad;
  Tensor a = randn({1024, 1024}, DType::f32, RngState{1, 0}), b = randn({1024, 1024}, DType::f32, RngState{2, 0});
  double best = 1e30;
  for (int i = 0; i < 6; ++i) {
    auto t0 = Clock::now();
    Tensor c = matmul(a, b);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (i > 0) best = std::min(best, s);
  }
  return 2.0 * 1024 * 1024 * 1024 / best;
}

struct Step {
  nn::GPT& model;
  const Tensor& ids;
  const Tensor& targets;
  nn::Optimizer& optimizer;
  const Policy& policy;
  bool fuse;
};

// One training step (kept out of line: profilers select the steps by this name).
__attribute__((noinline)) double measured_step(Step& s) {
  s.optimizer.zero_grad();
  ScopedPolicy scope(s.policy);
  Tensor loss = s.model.loss(s.ids, s.targets);
  if (s.fuse) {
    nn::FusedOptimizerStep inside(s.optimizer);  // each parameter updated when its gradient is final
    loss.backward();
  } else {
    loss.backward();
    s.optimizer.step();
  }
  return loss.item();
}

void usage() {
  std::fprintf(stderr,
               "usage: bench_step [--layers N] [--width C] [--heads H] [--seq T] [--batch B] [--vocab V] "
               "[--policy P] [--steps N] [--warmup N] [--threads N] [--optimizer sgd|adamw] [--fuse-optimizer] "
               "[--json] [--no-peak] [--attention fused|explicit] [--no-recompute-check]\n");
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        usage();
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--layers") o.config.layers = std::stoll(value());
    else if (a == "--width") o.config.width = std::stoll(value());
    else if (a == "--heads") o.config.heads = std::stoll(value());
    else if (a == "--seq") o.config.seq = std::stoll(value());
    else if (a == "--batch") o.batch = std::stoll(value());
    else if (a == "--vocab") o.config.vocab = std::stoll(value());
    else if (a == "--policy") o.policy = value();
    else if (a == "--steps") o.steps = std::stoi(value());
    else if (a == "--warmup") o.warmup = std::stoi(value());
    else if (a == "--threads") o.threads = std::stoi(value());
    else if (a == "--optimizer") o.optimizer = value();
    else if (a == "--fuse-optimizer") o.fuse_optimizer = true;
    else if (a == "--json") o.json = true;
    else if (a == "--no-peak") o.measure_peak = false;
    else if (a == "--no-recompute-check") o.recompute_check = false;
    else if (a == "--attention") {
      const std::string v = value();
      REMAT_CHECK(v == "fused" || v == "explicit", "bench_step: --attention fused|explicit, got ", v);
      o.config.fused_attention = v == "fused";
    }
    else {
      usage();
      return 2;
    }
  }
  try {
    set_num_threads(o.threads);
    set_recomputation_check(o.recompute_check);
    const Policy policy = Policy::parse(o.policy);
    nn::GPT model(o.config);
    const size_t n = static_cast<size_t>(o.batch * o.config.seq);
    Tensor ids = from_indices(tokens(n, o.config.vocab, 101), {o.batch, o.config.seq});
    Tensor targets = from_indices(tokens(n, o.config.vocab, 202), {o.batch, o.config.seq});
    std::unique_ptr<nn::Optimizer> optimizer;
    if (o.optimizer == "sgd") optimizer = std::make_unique<nn::SGD>(model.parameters(), nn::SGDOptions{.lr = 1e-4});
    else if (o.optimizer == "adamw")
      optimizer = std::make_unique<nn::AdamW>(model.parameters(), nn::AdamWOptions{.lr = 1e-4});
    else
      REMAT_CHECK(false, "bench_step: unknown --optimizer ", o.optimizer, " (sgd, adamw)");
    Step step{model, ids, targets, *optimizer, policy, o.fuse_optimizer};

    double multiplying_params = 0;
    for (const auto& [name, p] : model.named_parameters())
      if (name.rfind("wte.", 0) != 0 && name.rfind("wpe.", 0) != 0) multiplying_params += static_cast<double>(p.numel());
    const double tokens_per_step = static_cast<double>(n);
    const double model_flops = tokens_per_step * (6.0 * multiplying_params + 12.0 * o.config.layers * o.config.seq *
                                                                                 o.config.width);

    std::vector<double> times;
    double first_loss = 0, last_loss = 0;
    memory::Stats before{};
    for (int s = 0; s < o.warmup + o.steps; ++s) {
      if (s == o.warmup) {
        memory::reset_peaks();
        before = memory::stats();
      }
      auto t0 = Clock::now();
      last_loss = measured_step(step);
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      if (s == 0) first_loss = last_loss;
      if (s >= o.warmup) times.push_back(seconds);
    }
    const memory::Stats after = memory::stats();
    const double step_s = median(times);
    const double peak = o.measure_peak ? sgemm_peak_flops() : 0.0;
    const double mfu = peak > 0 ? model_flops / step_s / peak : 0.0;
    const size_t peak_total = after.peak_total - std::min(after.peak_total, before.live_total);
    const size_t peak_saved = after.peak(memory::Tag::saved);
    if (o.json) {
      std::printf("{\"layers\": %lld, \"width\": %lld, \"heads\": %lld, \"seq\": %lld, \"batch\": %lld, "
                  "\"vocab\": %lld, \"policy\": \"%s\", \"optimizer\": \"%s\", \"fuse_optimizer\": %s, "
                  "\"attention\": \"%s\", \"threads\": %d, \"steps\": %d, \"step_seconds_median\": %.6g, \"model_flops_per_step\": %.6g, "
                  "\"sgemm_peak_flops\": %.6g, \"mfu\": %.4f, \"peak_total_bytes\": %zu, \"peak_saved_bytes\": %zu, "
                  "\"first_loss\": %.6f, \"last_loss\": %.6f}\n",
                  static_cast<long long>(o.config.layers), static_cast<long long>(o.config.width),
                  static_cast<long long>(o.config.heads), static_cast<long long>(o.config.seq),
                  static_cast<long long>(o.batch), static_cast<long long>(o.config.vocab), policy.to_string().c_str(),
                  o.optimizer.c_str(), o.fuse_optimizer ? "true" : "false", o.config.fused_attention ? "fused" : "explicit",
                  o.threads, o.steps, step_s, model_flops,
                  peak, mfu, peak_total, peak_saved, first_loss, last_loss);
    } else {
      std::printf("GPT %lldL x %lld wide, %lld heads, T %lld, batch %lld, vocab %lld, %s, %s%s, %d threads\n",
                  static_cast<long long>(o.config.layers), static_cast<long long>(o.config.width),
                  static_cast<long long>(o.config.heads), static_cast<long long>(o.config.seq),
                  static_cast<long long>(o.batch), static_cast<long long>(o.config.vocab), policy.to_string().c_str(),
                  o.optimizer.c_str(), o.fuse_optimizer ? " (fused into the backward)" : "", o.threads);
      std::printf("  median step %.2f ms over %d steps; model %.3f GFLOP/step; sgemm peak %.1f GFLOP/s; MFU %.3f\n",
                  step_s * 1e3, o.steps, model_flops * 1e-9, peak * 1e-9, mfu);
      std::printf("  peak bytes above the start of the measured steps: total %s, saved %s; loss %.4f -> %.4f\n",
                  memory::format_bytes(static_cast<double>(peak_total)).c_str(),
                  memory::format_bytes(static_cast<double>(peak_saved)).c_str(), first_loss, last_loss);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
