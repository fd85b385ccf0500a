// The budget planner on long chains: wall and CPU seconds of plan_chain for 100 to 100,000
// random heterogeneous stages, and on small chains the grouped planner's predicted time against
// the exact rotor programme's (docs/planners.md, "Long chains").
//   bench_planner            all rows;  bench_planner --quick   without 100,000 stages
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include "remat/schedule.h"
#include "schedule/chain_internal.h"
#include "../tests/random_chain.h"

namespace rs = remat::schedule;

namespace {


struct Timed {
  rs::ChainPlan plan;
  double wall = 0, cpu = 0;
};

Timed timed_plan(const rs::ChainCosts& c, size_t limit, const rs::ChainPlanOptions& options) {
  const auto wall = std::chrono::steady_clock::now();
  const std::clock_t cpu = std::clock();
  Timed t{rs::plan_chain(c, limit, options)};
  t.wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count();
  t.cpu = static_cast<double>(std::clock() - cpu) / CLOCKS_PER_SEC;
  return t;
}

// Speed: limits at a quarter of every-layer's peak (deep recomputation) and half of save-all's.
void speed(bool quick) {
  std::printf("| stages | limit | planner | wall s | CPU s | predicted time / save-all's | exact wall s | grouped / exact time |\n");
  std::printf("|---:|---|---|---:|---:|---:|---:|---:|\n");
  for (int stages : {100, 1000, 10000, 100000}) {
    if (quick && stages > 10000) continue;
    const rs::ChainCosts c = random_chain(stages, 1);
    const rs::Plan save_all = rs::plan_save_all(c);
    const size_t every_layer = rs::plan_every_layer(c).predicted_peak_bytes;
    for (const auto& [name, limit] : {std::pair<const char*, size_t>{"every-layer / 4", every_layer / 4},
                                      std::pair<const char*, size_t>{"save-all / 2", save_all.predicted_peak_bytes / 2}}) {
      const Timed t = timed_plan(c, limit, {});
      std::printf("| %d | %s | %s | %.3f | %.3f | %.4f |", stages, name, t.plan.describe().c_str(), t.wall, t.cpu,
                  t.plan.plan.predicted_time / save_all.predicted_time);
      if (t.plan.method == rs::RotorMethod::exact) {
        rs::ChainPlanOptions grouped;
        grouped.method = rs::RotorMethod::grouped;
        const Timed g = timed_plan(c, limit, grouped);
        std::printf(" %.3f | %.4f (grouped %.3f s) |\n", t.wall, g.plan.plan.predicted_time / t.plan.plan.predicted_time,
                    g.wall);
      } else {
        std::printf(" - | - |\n");
      }
      std::fflush(stdout);
    }
  }
}

// Optimality: the grouped planner (4 top-level parts) against the exact programme, on chains of
// 20 to 200 stages, 3 seeds, 7 limits from the least feasible peak to save-all's peak.
void optimality() {
  std::printf("\n| stages | plans | mean grouped / exact time | worst | grouped least peak / exact least peak (worst) | peaks <= limit |\n");
  std::printf("|---:|---:|---:|---:|---:|---|\n");
  for (int stages : {20, 50, 100, 200}) {
    double sum = 0, worst = 0, worst_least = 0;
    int count = 0;
    bool fit = true;
    for (unsigned seed = 1; seed <= 3; ++seed) {
      const rs::ChainCosts c = random_chain(stages, seed);
      const size_t lo = rs::min_feasible_memory(c), hi = rs::plan_save_all(c).predicted_peak_bytes;
      rs::ChainPlanOptions grouped;
      grouped.method = rs::RotorMethod::grouped;
      grouped.top_parts = 4;  // groups as deep as a long chain's under the default 64
      try {
        rs::plan_chain(c, 0, grouped);
      } catch (const rs::InfeasibleError& e) {
        worst_least = std::max(worst_least, static_cast<double>(e.min_feasible_bytes) / static_cast<double>(lo));
      }
      for (double f : {0.02, 0.05, 0.1, 0.2, 0.4, 0.7, 1.0}) {
        const size_t limit = lo + static_cast<size_t>(static_cast<double>(hi - lo) * f);
        const rs::Plan exact = rs::plan_rotor(c, limit);
        const rs::Plan scaled = rs::plan_chain(c, limit, grouped).plan;
        fit = fit && exact.predicted_peak_bytes <= limit && scaled.predicted_peak_bytes <= limit;
        const double ratio = scaled.predicted_time / exact.predicted_time;
        sum += ratio;
        worst = std::max(worst, ratio);
        ++count;
      }
    }
    std::printf("| %d | %d | %.4f | %.4f | %.4f | %s |\n", stages, count, sum / count, worst, worst_least, fit ? "yes" : "NO");
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  speed(quick);
  optimality();
  return 0;
}
