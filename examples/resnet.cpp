// examples/resnet - train a CIFAR-sized pre-activation ResNet (remat/nn/resnet.h) on synthetic
// images, checkpointed by default (every block is a checkpoint region under every-layer), then
// check that every policy gives the same gradients, bit for bit; or, with --deep, show that the
// budget planner's saved memory grows as O(sqrt(N)) with the number of blocks N.
//
//   build/examples/resnet                                  # ResNet-20 (3 stages x 3 blocks, width 16)
//   build/examples/resnet --blocks 5 --width 32 --policy every-k:3 --steps 40
//   build/examples/resnet --deep                           # 16, 64, 256 blocks (depth 34 to 514)
//
// Training: --steps SGD steps (momentum 0.9) on batches of --batch images drawn in order from
// --images synthetic images (nn::make_synthetic_images: each class a fixed pattern of gratings,
// shifted and noised; nothing is downloaded). It prints the loss every few steps and the
// accuracy on held-out images in evaluation mode (running statistics). Then, unless
// --no-compare, --compare-steps SGD steps (default 3) from the same initial weights on the same
// batches under save-all, every-layer, every-k:K, selective:conv2d and a budget halfway between
// every-layer's and save-all's peaks: peak saved bytes, step time, the loss, and whether every
// step's gradients and the final running statistics equal save-all's bitwise. Exits 1 if any
// differs or if the training loss did not decrease.
//
// --deep: for N blocks in --deep-blocks (one stage, so every boundary has the same size; width 4,
// 8x8 images and batch 4 unless --width, --size, --batch say otherwise), the peak saved bytes of one step under save-all, every-layer and every-k:sqrt(N)
// (Chen et al.'s segments), and the smallest budget whose plan recomputes each block at most once
// (found on the profiled costs with equal stage times), with the peak measured under it. That
// budget grows as sqrt(N), the others as N.
#include <cerrno>
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

using Clock = std::chrono::steady_clock;

struct Options {
  int64_t stages = 3, blocks = 3, width = 16, batch = 32, size = 32, images = 512, steps = 30;
  double lr = 0.05;
  std::string policy = "every-layer";
  uint64_t seed = 1;
  int threads = 0;
  bool compare = true, deep = false;
  int64_t compare_steps = 3;
  bool width_given = false, size_given = false, batch_given = false;
  std::vector<int64_t> deep_blocks = {16, 64, 256};
};

[[noreturn]] void usage(const char* message) {
  std::fprintf(stderr,
               "%s\nusage: resnet [--stages 3] [--blocks 3] [--width 16] [--batch 32] [--size 32] [--images 512]\n"
               "              [--steps 30] [--lr 0.05] [--policy every-layer] [--seed 1] [--threads 0]\n"
               "              [--no-compare | --compare-steps 3] [--deep [--deep-blocks 16,64,256]]\n",
               message);
  std::exit(2);
}

int64_t parse_int(const std::string& s, const char* flag, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno != 0 || v < lo || v > hi)
    usage(detail::concat(flag, ": expected an integer in [", lo, ", ", hi, "], got '", s, "'").c_str());
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--stages") o.stages = parse_int(value(), "--stages", 1, 6);
    else if (a == "--blocks") o.blocks = parse_int(value(), "--blocks", 1, 4096);
    else if (a == "--width") o.width = parse_int(value(), "--width", 1, 1024), o.width_given = true;
    else if (a == "--batch") o.batch = parse_int(value(), "--batch", 2, 4096), o.batch_given = true;
    else if (a == "--size") o.size = parse_int(value(), "--size", 1, 512), o.size_given = true;
    else if (a == "--images") o.images = parse_int(value(), "--images", 2, 1 << 20);
    else if (a == "--steps") o.steps = parse_int(value(), "--steps", 1, 1 << 24);
    else if (a == "--seed") o.seed = static_cast<uint64_t>(parse_int(value(), "--seed", 0, INT64_MAX));
    else if (a == "--threads") o.threads = static_cast<int>(parse_int(value(), "--threads", 0, 1024));
    else if (a == "--lr") {
      const std::string v = value();
      char* end = nullptr;
      o.lr = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(o.lr > 0) || !std::isfinite(o.lr)) usage("--lr: expected a positive number");
    } else if (a == "--policy") o.policy = value();
    else if (a == "--no-compare") o.compare = false;
    else if (a == "--compare-steps") o.compare_steps = parse_int(value(), "--compare-steps", 1, 1000);
    else if (a == "--deep") o.deep = true;
    else if (a == "--deep-blocks") {
      o.deep_blocks.clear();
      std::string list = value();
      for (size_t start = 0; start <= list.size();) {
        const size_t comma = std::min(list.find(',', start), list.size());
        o.deep_blocks.push_back(parse_int(list.substr(start, comma - start), "--deep-blocks", 1, 4096));
        start = comma + 1;
      }
    } else usage(("unknown option " + a).c_str());
  }
  if (o.images < o.batch) usage("--images must be at least --batch");
  return o;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

nn::ResNetConfig config_of(const Options& o) {
  return {.stages = o.stages, .blocks_per_stage = o.blocks, .width = o.width, .seed = o.seed};
}

// One training step's peak saved bytes (above what was saved before it) and wall time.
struct StepStats {
  double loss = 0, seconds = 0;
  size_t peak_saved = 0;
};
StepStats step_once(nn::ResNet& model, const Tensor& x, const Tensor& y) {
  StepStats s;
  memory::reset_peaks();
  const size_t base = memory::live_bytes(memory::Tag::saved);
  const auto t0 = Clock::now();
  model.zero_grad();
  Tensor loss = model.loss(x, y);
  loss.backward();
  s.seconds = seconds_since(t0);
  s.loss = loss.item();
  s.peak_saved = memory::peak_bytes(memory::Tag::saved) - base;
  return s;
}

double accuracy(nn::ResNet& model, const Tensor& x, const Tensor& y) {
  NoGradGuard no_grad;
  model.eval();
  Tensor predicted = argmax(model.forward(x), 1);
  model.train();
  auto p = predicted.to_vector(), t = y.to_vector();
  int correct = 0;
  for (size_t i = 0; i < p.size(); ++i) correct += p[i] == t[i];
  return static_cast<double>(correct) / static_cast<double>(p.size());
}

int train(const Options& o) {
  const Policy policy = Policy::parse(o.policy);
  auto model = std::make_shared<nn::ResNet>(config_of(o));
  const int64_t held_out = std::max<int64_t>(o.batch, o.images / 8);
  auto data = nn::make_synthetic_images({.count = o.images + held_out, .size = o.size, .seed = o.seed + 100});
  Tensor train_x = data.images.slice(0, 0, o.images), train_y = data.labels.slice(0, 0, o.images);
  Tensor test_x = data.images.slice(0, o.images, o.images + held_out);
  Tensor test_y = data.labels.slice(0, o.images, o.images + held_out);
  std::printf("resnet: %s, %lld parameters, %lld training + %lld held-out images %lldx%lld, batch %lld, policy %s, "
              "%d threads\n",
              model->type_name().c_str(), static_cast<long long>(model->num_parameters()),
              static_cast<long long>(o.images), static_cast<long long>(held_out), static_cast<long long>(o.size),
              static_cast<long long>(o.size), static_cast<long long>(o.batch), policy.to_string().c_str(),
              num_threads());
  nn::SGD opt(model->parameters(), {.lr = o.lr, .momentum = 0.9});
  ScopedPolicy scoped(policy);
  const int64_t batches = o.images / o.batch;
  std::vector<double> losses;
  size_t peak_saved = 0;
  double seconds = 0;
  const int64_t report_every = std::max<int64_t>(1, o.steps / 10);
  for (int64_t step = 0; step < o.steps; ++step) {
    const int64_t b = step % batches;
    Tensor x = train_x.slice(0, b * o.batch, (b + 1) * o.batch), y = train_y.slice(0, b * o.batch, (b + 1) * o.batch);
    StepStats s = step_once(*model, x, y);
    opt.step();
    losses.push_back(s.loss);
    peak_saved = std::max(peak_saved, s.peak_saved);
    seconds += s.seconds;
    if (step % report_every == 0 || step + 1 == o.steps)
      std::printf("  step %4lld  loss %.4f  (%.3f s, peak saved %s)\n", static_cast<long long>(step + 1), s.loss,
                  s.seconds, memory::format_bytes(static_cast<double>(s.peak_saved)).c_str());
  }
  // the loss of the first and last `window` steps (each window covers the same batches)
  const size_t window = std::min<size_t>(losses.size() / 2, static_cast<size_t>(batches));
  double first = 0, last = 0;
  for (size_t i = 0; i < std::max<size_t>(window, 1); ++i) {
    first += losses[i];
    last += losses[losses.size() - 1 - i];
  }
  const bool decreased = window == 0 ? losses.back() < losses.front() : last < first;
  std::printf("resnet: mean loss of the first / last %zu steps %.4f -> %.4f (%s); held-out accuracy %.1f%% "
              "(chance %.1f%%); %.2f s per step; peak saved %s\n",
              std::max<size_t>(window, 1), first / std::max<size_t>(window, 1), last / std::max<size_t>(window, 1),
              decreased ? "decreased" : "DID NOT DECREASE", 100.0 * accuracy(*model, test_x, test_y),
              100.0 / static_cast<double>(model->config().classes),
              seconds / static_cast<double>(o.steps), memory::format_bytes(static_cast<double>(peak_saved)).c_str());
  return decreased ? 0 : 1;
}

// --compare-steps SGD steps of a fresh model under each policy, on the same batches, against
// save-all, bit for bit: every step's gradients and the running statistics at the end.
int compare_policies(const Options& o) {
  const int steps = static_cast<int>(o.compare_steps);
  auto data = nn::make_synthetic_images({.count = o.batch * steps, .size = o.size, .seed = o.seed + 200});
  struct Run {
    std::string policy;
    StepStats last;                   // the last step
    double first_loss = 0;
    std::vector<TensorList> grads;    // per step
    TensorList running;
  };
  auto run = [&](const Policy& policy) {
    nn::ResNet model(config_of(o));
    nn::SGD opt(model.parameters(), {.lr = o.lr, .momentum = 0.9});
    ScopedPolicy scoped(policy);
    Run r{policy.to_string(), {}, 0, {}, {}};
    for (int s = 0; s < steps; ++s) {
      r.last = step_once(model, data.images.slice(0, s * o.batch, (s + 1) * o.batch),
                         data.labels.slice(0, s * o.batch, (s + 1) * o.batch));
      if (s == 0) r.first_loss = r.last.loss;
      TensorList grads;
      for (const auto& p : model.parameters()) grads.push_back(p.grad().clone());
      r.grads.push_back(std::move(grads));
      opt.step();
    }
    for (const auto& bn : model.batch_norms()) {
      r.running.push_back(bn->running_mean.clone());
      r.running.push_back(bn->running_var.clone());
    }
    return r;
  };
  std::vector<Run> runs;
  runs.push_back(run(Policy::save_all()));
  runs.push_back(run(Policy::every_layer()));
  const int64_t blocks = o.stages * o.blocks + 2;
  runs.push_back(run(Policy::every_k(std::max(2, static_cast<int>(std::lround(std::sqrt(static_cast<double>(blocks))))))));
  runs.push_back(run(Policy::selective({"conv2d"})));
  const size_t sa = runs[0].last.peak_saved, el = runs[1].last.peak_saved;
  runs.push_back(run(Policy::budget(el + (sa - std::min(sa, el)) / 2)));
  std::printf("\nresnet: %d SGD steps from the same weights on the same batches of %lld under each policy (the budget\n"
              "profiles on its first %d steps and runs its plan after); peak saved bytes and time of the last step\n\n",
              steps, static_cast<long long>(o.batch), BudgetPlanner::kProfilingSteps);
  std::printf("| policy | peak saved bytes | vs save-all | step s | vs save-all | loss first -> last | every step's "
              "gradients, running stats |\n");
  std::printf("|---|---:|---:|---:|---:|---|---|\n");
  bool all_equal = true;
  for (const auto& r : runs) {
    bool equal = r.grads.size() == runs[0].grads.size() && r.running.size() == runs[0].running.size();
    for (size_t s = 0; equal && s < r.grads.size(); ++s)
      for (size_t i = 0; equal && i < r.grads[s].size(); ++i) equal = bitwise_equal(r.grads[s][i], runs[0].grads[s][i]);
    for (size_t i = 0; equal && i < r.running.size(); ++i) equal = bitwise_equal(r.running[i], runs[0].running[i]);
    all_equal = all_equal && equal;
    std::printf("| %s | %zu | %.3f | %.3f | %.2f | %.4f -> %.4f | %s |\n", r.policy.c_str(), r.last.peak_saved,
                static_cast<double>(r.last.peak_saved) / static_cast<double>(sa), r.last.seconds,
                r.last.seconds / runs[0].last.seconds, r.first_loss, r.last.loss,
                equal ? "bitwise equal" : "DIFFERENT");
  }
  std::printf("\n");
  return all_equal ? 0 : 1;
}

// ---- --deep

size_t one_recomputation_limit(schedule::ChainCosts costs, int slots) {
  const int stages = costs.num_stages();
  for (int i = 0; i < stages; ++i) {
    costs.forward_time[static_cast<size_t>(i)] = 1.0;
    costs.backward_time[static_cast<size_t>(i)] = 2.0;
  }
  schedule::ChainPlanOptions options;
  options.slots = slots;
  const schedule::ChainPlanner planner(costs, options);
  auto fits = [&](size_t m) {
    return schedule::simulate(costs, planner.plan(m).plan).recomputed_forwards <= stages;
  };
  size_t lo = planner.smallest_limit(), hi = schedule::plan_save_all(costs).predicted_peak_bytes;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (fits(mid)) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

int deep(const Options& o) {
  // small images and channels by default: the point is the growth with depth
  const int64_t width = o.width_given ? o.width : 4, size = o.size_given ? o.size : 8;
  const int64_t batch = o.batch_given ? o.batch : 4;
  auto data = nn::make_synthetic_images({.count = batch, .size = size, .seed = o.seed + 300});
  std::printf("resnet --deep: one stage of width %lld, images %lldx%lld, batch %lld; peak saved bytes of one step\n\n",
              static_cast<long long>(width), static_cast<long long>(size), static_cast<long long>(size),
              static_cast<long long>(batch));
  std::printf("| blocks N | depth | save-all | every-layer | every-k:sqrt(N) | one-recomputation budget B | peak under "
              "budget:B | B / sqrt(N) | every-layer / N | recomputed / first forward |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int64_t n : o.deep_blocks) {
    nn::ResNet model({.stages = 1, .blocks_per_stage = n, .width = width, .seed = o.seed});
    auto peak_under = [&](const Policy& p) {
      ScopedPolicy scoped(p);
      return step_once(model, data.images, data.labels).peak_saved;
    };
    const size_t sa = peak_under(Policy::save_all()), el = peak_under(Policy::every_layer());
    const int k = std::max(1, static_cast<int>(std::lround(std::sqrt(static_cast<double>(n)))));
    const size_t ek = peak_under(Policy::every_k(k));
    size_t budget = 0, measured = 0;
    double recomputed = 0;
    {
      // profile under a budget between every-layer's and save-all's peaks (a plan with regions)
      ScopedPolicy generous(Policy::budget(el + (sa - std::min(sa, el)) / 2));
      for (int i = 0; i <= BudgetPlanner::kProfilingSteps; ++i) step_once(model, data.images, data.labels);
      auto report = model.planner()->report();
      if (!report) {
        std::fprintf(stderr, "resnet --deep: no plan was made\n");
        return 1;
      }
      budget = one_recomputation_limit(report->costs, 100) + report->outside_bytes;
    }
    {
      ScopedPolicy tight(Policy::budget(budget));
      step_once(model, data.images, data.labels);  // plans for this budget
      reset_counters();
      measured = step_once(model, data.images, data.labels).peak_saved;
      const auto c = counters();
      const double first = c.ops.forward_flops - c.ops.recomputed_flops;
      recomputed = first > 0 ? c.ops.recomputed_flops / first : 0;
    }
    std::printf("| %lld | %lld | %zu | %zu | %zu | %zu | %zu | %.0f | %.0f | %.2f |\n", static_cast<long long>(n),
                static_cast<long long>(2 * n + 2), sa, el, ek, budget, measured,
                static_cast<double>(budget) / std::sqrt(static_cast<double>(n)),
                static_cast<double>(el) / static_cast<double>(n), recomputed);
    std::fflush(stdout);
    if (measured > budget) {
      std::fprintf(stderr, "resnet --deep: the measured peak %zu exceeds the budget %zu\n", measured, budget);
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  try {
    if (o.threads > 0) set_num_threads(o.threads);
    if (o.deep) return deep(o);
    int status = train(o);
    if (o.compare) status |= compare_policies(o);
    return status;
  } catch (const Error& e) {
    std::fprintf(stderr, "resnet: %s\n", e.what());
    return 2;
  }
}
