// Budget sweep: from the every-layer minimum to save-all, on a 64-layer tanh MLP (width 512,
// batch 128) and on the default GPT of `remat train`. For each budget: the plan, its predicted
// and measured peak saved bytes and step time; and uniform segments (every-k:K) for comparison
// at matching peaks. All measured in one run.
//
//   build/bench/bench_budget [--model mlp|gpt|both] [--points 6] [--steps 5]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "remat/nn.h"
#include "remat/remat.h"

using namespace remat;

namespace {

struct Measure {
  size_t peak_saved = 0;
  double seconds = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A model: a step function (forward + backward under the scoped policy) and its chain's planner.
struct Model {
  std::string name;
  int stages;
  std::function<void()> step;
  std::function<std::shared_ptr<BudgetPlanner>()> planner;
  std::function<void(std::shared_ptr<BudgetPlanner>)> reset_planner;
};

Measure measure(const Model& m, const Policy& policy, int steps, int warmup) {
  std::vector<double> times;
  size_t peak = 0;
  for (int i = 0; i < warmup + steps; ++i) {
    ScopedPolicy scoped(policy);
    memory::reset_peaks();
    size_t base = memory::live_bytes(memory::Tag::saved);
    auto t0 = std::chrono::steady_clock::now();
    m.step();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i < warmup) continue;
    times.push_back(s);
    peak = std::max(peak, memory::peak_bytes(memory::Tag::saved) - base);
  }
  return {peak, median(times)};
}

void sweep(const Model& m, int points, int steps) {
  std::printf("\n== %s (%d stages, %d threads) ==\n", m.name.c_str(), m.stages, num_threads());
  Measure all = measure(m, Policy::save_all(), steps, 1);
  Measure layer = measure(m, Policy::every_layer(), steps, 1);
  // uniform segments: every-k:K for K = 1 (every-layer) .. stages
  std::vector<std::pair<int, Measure>> uniform;
  for (int k = 1; k <= m.stages; k = k < 4 ? k + 1 : k * 2) uniform.push_back({k, measure(m, Policy::every_k(k), steps, 1)});
  uniform.push_back({m.stages, measure(m, Policy::every_k(m.stages), steps, 1)});
  std::printf("%-12s %14s %10s\n", "reference", "peak saved B", "step s");
  std::printf("%-12s %14zu %10.4f\n", "save-all", all.peak_saved, all.seconds);
  std::printf("%-12s %14zu %10.4f\n", "every-layer", layer.peak_saved, layer.seconds);
  for (auto& [k, u] : uniform) std::printf("every-k:%-4d %14zu %10.4f\n", k, u.peak_saved, u.seconds);
  std::printf("\n%-14s %14s %14s %11s %11s %9s %22s %9s\n", "budget B", "pred. peak", "meas. peak", "pred. s",
              "meas. s", "meas/pred", "best uniform <= peak", "budget/u");
  for (int p = 0; p < points; ++p) {
    double f = points == 1 ? 1.0 : static_cast<double>(p) / (points - 1);
    size_t budget = layer.peak_saved + static_cast<size_t>(f * static_cast<double>(all.peak_saved - layer.peak_saved));
    m.reset_planner(std::make_shared<BudgetPlanner>());
    Policy policy = Policy::budget(budget);
    Measure got;
    try {
      got = measure(m, policy, steps, BudgetPlanner::kProfilingSteps + 1);
    } catch (const Error& e) {
      std::printf("%-14zu infeasible: %s\n", budget, e.what());
      continue;
    }
    auto report = m.planner()->report();
    double predicted = report ? report->predicted_seconds : 0;
    // the fastest uniform configuration whose measured peak is at most the budget plan's
    const std::pair<int, Measure>* best = nullptr;
    for (auto& u : uniform)
      if (u.second.peak_saved <= got.peak_saved && (!best || u.second.seconds < best->second.seconds)) best = &u;
    char best_text[64] = "none fits";
    if (best) std::snprintf(best_text, sizeof best_text, "every-k:%d %.4f s", best->first, best->second.seconds);
    std::printf("%-14zu %14zu %14zu %11.4f %11.4f %9.3f %22s %9.3f\n", budget,
                report ? report->predicted_peak_bytes : 0, got.peak_saved, predicted, got.seconds,
                predicted > 0 ? got.seconds / predicted : 0.0, best_text, best ? got.seconds / best->second.seconds : 0.0);
    if (report) std::printf("    plan %s\n", report->tree.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string which = "both";
  int points = 6, steps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) which = argv[i + 1];
    else if (!std::strcmp(argv[i], "--points")) points = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
  }
  if (which == "mlp" || which == "both") {
    const int layers = 64, width = 512, batch = 128;
    auto chain = std::make_shared<Chain>();
    std::vector<Tensor> params;
    for (int i = 0; i < layers; ++i) {
      Tensor w = randn({width, width}, DType::f32, {static_cast<uint64_t>(i) + 1, 0}, 0.0, 1.0 / std::sqrt(width)).requires_grad_();
      Tensor b = zeros({width}).requires_grad_();
      params.push_back(w);
      params.push_back(b);
      chain->add([w, b](const Tensor& h) { return tanh(add(matmul(h, w), b)); });
    }
    Tensor x = randn({batch, width}, DType::f32, {999, 0});
    Model m{"64-layer tanh MLP, width 512, batch 128", layers,
            [=] {
              for (auto p : params) p.zero_grad();
              mean(chain->forward(x)).backward();
            },
            [=] { return chain->planner(); }, [=](std::shared_ptr<BudgetPlanner> p) { chain->set_planner(p); }};
    sweep(m, points, steps);
  }
  if (which == "gpt" || which == "both") {
    nn::GPTConfig config{.vocab = 114, .layers = 4, .width = 128, .heads = 4, .seq = 64, .dropout = 0.0};
    auto model = std::make_shared<nn::GPT>(config);
    std::vector<int64_t> ids(32 * 65);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(philox_word({5, 0}, i) % 114);
    Tensor all = from_indices(ids, {32, 65});
    Tensor inputs = all.slice(1, 0, 64).contiguous(), targets = all.slice(1, 1, 65).contiguous();
    Model m{"default GPT of remat train (4 layers, width 128, seq 64, batch 32)", 4,
            [=] {
              model->zero_grad();
              model->loss(inputs, targets).backward();
            },
            [=] { return model->planner(); },
            [=](std::shared_ptr<BudgetPlanner>) { /* Sequential keeps one planner; a new budget re-plans */ }};
    sweep(m, points, steps);
  }
  return 0;
}
