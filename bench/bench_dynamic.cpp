// dynamic:BYTES and offload:DIR against save-all, every-layer and the rotor budget plan, side by
// side in one run, on three programs:
//   mlp   a 64-layer tanh MLP (width 512, batch 128) as a Chain of layers
//   gpt   the default GPT of `remat train` (4 layers, width 128, seq 64, batch 32)
//   heat  the nonlinear 1-D heat solver of examples/heat_inverse written as plain ops (no layer
//         structure, no scan): a large state (--cells, default 2^18) and --heat-steps explicit
//         steps; every-layer and budget plans do not apply
// For every program: save-all's peak of saved bytes P and step time T, then dynamic at budgets
// 1.0, 0.5, 0.25, 0.1 x P and at the smallest feasible budget (as reported by the run at P), and
// (mlp, gpt) every-layer, budget:B and dynamic at every-layer's peak; for gpt and heat also
// offload (threshold 64 KiB) with 10% of P in memory. Step time is the median of --steps steps
// after one warm-up; gradients are checked bitwise against save-all before anything is timed.
// Each row after save-all's takes its steps in turn with save-all steps (save-all, row, save-all,
// row, ...; the "layers' pk" row with every-layer's too), and its "vs T" is over the median of
// those save-all steps, so that a drift of the machine's speed between rows does not enter the
// ratios.
//
//   build/bench/bench_dynamic [--model mlp|gpt|heat|all] [--steps 3] [--offload-dir /tmp]
//                             [--only offload|dynamic]   (save-all and that row family only)
//                             [--fractions 1,0.5,0.25,0.1,min]   (the dynamic budgets; min: the smallest)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "remat/nn.h"
#include "remat/remat.h"

using namespace remat;

namespace {

struct Program {
  std::string name;
  std::function<Tensor()> loss;           // forward of one step
  std::function<TensorList()> params;     // what the gradients are taken of
  bool layers = false;                    // every-layer and budget plans apply
  std::function<std::shared_ptr<BudgetPlanner>()> fresh_planner;
};

struct Measure {
  bool ok = false;
  std::string error;
  size_t peak_saved = 0;
  double seconds = 0;
  DynamicCounters dynamic;
  bool equal = false;
};

bool same(const TensorList& a, const TensorList& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    Tensor x = a[i].contiguous(), y = b[i].contiguous();
    if (x.shape() != y.shape() || std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) != 0) return false;
  }
  return true;
}

TensorList run_grads(const Program& p, const Policy& policy) {
  manual_seed(5);
  return remat::grad([&](const TensorList&) { return p.loss(); }, p.params(), GradOptions{policy});
}

// Steps of the policies in turn (a, b, c, a, b, c, ...): each policy's Measure, with its median
// step time. Taking them in turn keeps a drift of this machine's speed out of their ratios.
std::vector<Measure> measure_in_turn(const Program& p, const std::vector<Policy>& policies, const TensorList& reference,
                                     int steps, int warmup) {
  std::vector<Measure> ms(policies.size());
  std::vector<std::vector<double>> times(policies.size());
  for (int i = 0; i < warmup + steps; ++i) {
    for (size_t k = 0; k < policies.size(); ++k) {
      Measure& m = ms[k];
      if (!m.error.empty()) continue;
      try {
        memory::reset_peaks();
        reset_counters();
        const size_t base = memory::live_bytes(memory::Tag::saved);
        const auto t0 = std::chrono::steady_clock::now();
        TensorList g = run_grads(p, policies[k]);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (i == 0) m.equal = same(g, reference);
        if (i < warmup) continue;
        times[k].push_back(s);
        m.peak_saved = std::max(m.peak_saved, memory::peak_bytes(memory::Tag::saved) - base);
        m.dynamic = counters().dynamic;
      } catch (const Error& e) {
        m.error = e.what();
      }
    }
  }
  for (size_t k = 0; k < policies.size(); ++k) {
    if (!ms[k].error.empty()) continue;
    std::sort(times[k].begin(), times[k].end());
    ms[k].seconds = times[k][times[k].size() / 2];
    ms[k].ok = true;
  }
  return ms;
}

Measure measure(const Program& p, const Policy& policy, const TensorList& reference, int steps, int warmup) {
  return measure_in_turn(p, {policy}, reference, steps, warmup)[0];
}

void row(const char* label, const Policy& policy, const Measure& m, const Measure& base) {
  if (!m.ok) {
    std::printf("%-10s %-24s failed: %.100s\n", label, policy.to_string().substr(0, 24).c_str(), m.error.c_str());
    return;
  }
  std::printf("%-10s %-24s %14zu %8.3f %10.4f %8.3f %9llu %9llu %8.1f %8.2f %s\n", label, policy.to_string().substr(0, 24).c_str(),
              m.peak_saved, static_cast<double>(m.peak_saved) / static_cast<double>(std::max<size_t>(1, base.peak_saved)),
              m.seconds, m.seconds / base.seconds, static_cast<unsigned long long>(m.dynamic.evictions),
              static_cast<unsigned long long>(m.dynamic.rematerializations), m.dynamic.remat_seconds * 1e3,
              m.dynamic.stall_seconds * 1e3,
              m.equal ? "yes" : "NO");
}

std::string only_rows;  // --only: "" (every row), "offload" or "dynamic"
std::vector<double> fractions{1.0, 0.5, 0.25, 0.1};  // --fractions: the dynamic budgets, as fractions of P
bool smallest_row = true;                            // --fractions without "min": no row at the smallest budget

void sweep(const Program& p, int steps, const std::string& offload_dir) {
  std::printf("\n== %s (%d threads) ==\n", p.name.c_str(), num_threads());
  std::printf("%-10s %-24s %14s %8s %10s %8s %9s %9s %8s %8s %s\n", "", "policy", "peak saved B", "vs P", "step s", "vs T",
              "evictions", "remats", "remat ms", "stall ms", "bitwise");
  const TensorList reference = run_grads(p, Policy::save_all());
  const Measure all = measure(p, Policy::save_all(), reference, steps, 1);
  row("save-all", Policy::save_all(), all, all);
  // Every other row takes its steps in turn with save-all's, and "vs T" is over those.
  auto paired = [&](const char* label, const Policy& policy, int warmup) {
    const std::vector<Measure> pair = measure_in_turn(p, {Policy::save_all(), policy}, reference, steps, warmup);
    row(label, policy, pair[1], pair[0].ok ? pair[0] : all);
    return pair[1];
  };
  Measure layer;
  if (p.layers && only_rows.empty()) {
    layer = paired("layers", Policy::every_layer(), 1);
    p.fresh_planner();
    paired("rotor", Policy::budget(layer.peak_saved), BudgetPlanner::kProfilingSteps + 1);
  }
  if (only_rows != "offload") {
    // the smallest feasible budget, as a run at save-all's peak reports it
    reset_counters();
    run_grads(p, Policy::dynamic(all.peak_saved));
    const size_t smallest = counters().dynamic.smallest_feasible_bytes;
    std::vector<std::pair<std::string, size_t>> budgets;
    for (double f : fractions)
      budgets.push_back({"P x " + std::to_string(f).substr(0, 4), static_cast<size_t>(f * static_cast<double>(all.peak_saved))});
    if (smallest_row) budgets.push_back({"smallest", smallest});
    for (const auto& [label, bytes] : budgets) {
      if (bytes < smallest) {
        std::printf("%-10s %-24s below the smallest feasible budget (%zu)\n", label.c_str(),
                    Policy::dynamic(std::max<size_t>(bytes, 1)).to_string().c_str(), smallest);
        continue;
      }
      paired(label.c_str(), Policy::dynamic(bytes), 1);
    }
    if (p.layers && only_rows.empty() && layer.ok && layer.peak_saved >= smallest) {
      // at every-layer's peak, in turn with save-all and every-layer
      const Policy policy = Policy::dynamic(layer.peak_saved);
      const std::vector<Measure> trio =
          measure_in_turn(p, {Policy::save_all(), Policy::every_layer(), policy}, reference, steps, 1);
      row("layers' pk", policy, trio[2], trio[0].ok ? trio[0] : all);
      if (trio[1].ok && trio[2].ok)
        std::printf("%-10s %-24s every-layer's step in the same turns %.4f s: dynamic / every-layer = %.3f\n", "", "",
                    trio[1].seconds, trio[2].seconds / trio[1].seconds);
    }
  }
  if (!offload_dir.empty() && only_rows != "dynamic")
    paired("offload", Policy::offload(offload_dir, size_t{64} << 10, all.peak_saved / 10), 1);
}

struct Options {
  std::string model = "all";
  int steps = 3;
  std::string offload_dir = "/tmp";
  int64_t cells = 1 << 18, heat_steps = 200;
};

}  // namespace

int main(int argc, char** argv) try {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") o.model = v;
    else if (k == "--steps") o.steps = std::max(1, std::atoi(v.c_str()));
    else if (k == "--offload-dir") o.offload_dir = v;
    else if (k == "--cells") o.cells = std::atoll(v.c_str());
    else if (k == "--heat-steps") o.heat_steps = std::atoll(v.c_str());
    else if (k == "--only" && (v == "offload" || v == "dynamic")) only_rows = v;
    else if (k == "--fractions") {
      fractions.clear();
      smallest_row = false;
      for (size_t at = 0; at <= v.size();) {
        const size_t comma = std::min(v.find(',', at), v.size());
        const std::string item = v.substr(at, comma - at);
        if (item == "min") smallest_row = true;
        else if (double f = std::atof(item.c_str()); f > 0 && f <= 1) fractions.push_back(f);
        else throw Error("bench_dynamic: --fractions takes fractions in (0, 1] and min, comma-separated; not '" + item + "'");
        at = comma + 1;
      }
    }
    else throw Error("bench_dynamic: unknown option " + k);
  }
  std::printf("bench_dynamic: P = save-all's peak of saved bytes, T = its step time; median of %d steps\n", o.steps);

  if (o.model == "mlp" || o.model == "all") {
    auto chain = std::make_shared<Chain>();
    std::vector<Tensor> weights;
    for (int i = 0; i < 64; ++i) {
      Tensor w = randn({512, 512}, DType::f32, RngState{static_cast<uint64_t>(i), 0}, 0.0, 1.0 / std::sqrt(512.0))
                     .requires_grad_();
      // Model weights, accounted as parameters (as nn::Linear's are): not saved activations, so
      // neither P nor the dynamic budget counts them.
      w.storage()->set_tag(memory::Tag::parameter);
      weights.push_back(w);
      chain->add([w](const Tensor& h) { return tanh(matmul(h, w)); });
    }
    Tensor x = randn({128, 512}, DType::f32, RngState{99, 0});
    Program p{"64-layer tanh MLP (width 512, batch 128)",
              [chain, x] { return mean(chain->forward(x)); },
              [weights] { return TensorList(weights.begin(), weights.end()); },
              true,
              [chain] {
                chain->set_planner(std::make_shared<BudgetPlanner>());
                return chain->planner();
              }};
    sweep(p, o.steps, "");
  }
  if (o.model == "gpt" || o.model == "all") {
    auto model = std::make_shared<nn::GPT>(nn::GPTConfig{.vocab = 96, .layers = 4, .width = 128, .heads = 4, .seq = 64,
                                                         .dropout = 0.0, .dtype = DType::f32, .seed = 1});
    std::vector<int64_t> ids(32 * 64), targets(32 * 64);
    for (size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<int64_t>((i * 7919) % 96);
      targets[i] = static_cast<int64_t>((i * 104729 + 3) % 96);
    }
    Tensor in = from_indices(ids, {32, 64}), out = from_indices(targets, {32, 64});
    Program p{"default GPT (4 layers, width 128, seq 64, batch 32)",
              [model, in, out] { return model->loss(in, out); },
              [model] { return model->parameters(); },
              true,
              [model] { return model->planner(); }};
    sweep(p, o.steps, o.offload_dir);
  }
  if (o.model == "heat" || o.model == "all") {
    // u_{t+1} = u_t + r * d/dx (k(u) du/dx), k(u) = 1 + u^2 / 2, on a periodic rod (plain ops)
    const int64_t n = o.cells, steps = o.heat_steps;
    Tensor u0 = mul_scalar(tanh(randn({n}, DType::f32, RngState{7, 0})), 0.5).detach().requires_grad_();
    Program p{"heat solver as plain ops (" + std::to_string(n) + " cells, " + std::to_string(steps) + " steps)",
              [u0, n, steps] {
                Tensor u = u0;
                for (int64_t t = 0; t < steps; ++t) {
                  Tensor right = concat({u.slice(0, 1, n), u.slice(0, 0, 1)}, 0);
                  Tensor flux = mul(add_scalar(mul_scalar(square(u), 0.5), 1.0), sub(right, u));  // k(u) (u_{i+1} - u_i)
                  Tensor left_flux = concat({flux.slice(0, n - 1, n), flux.slice(0, 0, n - 1)}, 0);
                  u = add(u, mul_scalar(sub(flux, left_flux), 0.2));
                }
                return mean(square(u));
              },
              [u0] { return TensorList{u0}; },
              false,
              {}};
    sweep(p, o.steps, o.offload_dir);
  }
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "bench_dynamic: %s\n", e.what());
  return 1;
}
