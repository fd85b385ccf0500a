// bench_memory_limit: budget:auto under a memory limit against the fixed policies that a user
// would otherwise pick by hand, on four CPU models. A step is: drop the gradients, forward, loss,
// backward (no optimizer: nothing changes between steps, so every step does the same work).
//
// Per model (gpt: nanoGPT's CPU shapes as bench_step; gpt-l: 8 layers, width 256, 8 heads,
// seq 128, batch 8; mlp: bench_budget's 64-layer tanh MLP, width 512, batch 128; resnet20: the
// CIFAR ResNet-20 of bench_resnet, width 16, batch 32):
//   1. save-all: S = a step's peak saved bytes, T = the step's peak total bytes (the allocator's
//      counters after reset_peaks() at the step start), and its step time.
//   2. budget:auto (no limit): the machine's memory bounds it, so its plan should be save-all;
//      its step time relative to save-all (target <= 1.02x) and its report's automatic fields.
//      Its report gives H, what the run holds besides saved values (the sum of the allocator's
//      per-tag peaks but saved, on the profiling step: parameters, gradients, temporaries).
//   3. For each fraction f (--fractions): the saved-bytes allowance A = f * S and the memory
//      limit L = H + A. Under L: budget:auto,limit=L, budget:A and
//      budget:auto,limit=L+offload:DIR (planned; the last may offload nodes), every-layer,
//      every-k:2..4, offload:DIR (save-all + offload) and every-layer+offload:DIR (DIR a temporary
//      directory, removed at exit; the threshold is per model, printed in the header: below the
//      1 MiB default where the model's saved values are smaller than that, else they would all
//      stay in memory). Each row: peak saved, peak total, median step time, fits (peak total <= L
//      and peak saved <= A), and for planned rows the predicted peak saved and its error
//      (measured - predicted) / predicted. The summary lines: each budget:auto,limit=L policy's
//      step time over the fastest other (not planned by budget:auto) policy that fits, and whether
//      its peak total stayed within L.
//   4. Before timing, every policy's gradients (a budget policy's on its first planned step) are
//      compared bitwise with save-all's; any difference aborts (exit 1).
// The fixed policies do not depend on L and are measured once per model, then judged against
// each L. Each budget policy has its own model instance (its planner keeps one plan; changing
// the budget of one planner re-plans inside the timed step), built from the same seed. The other
// instances' parameters are live during every step; that amount, the same for every step, is
// subtracted from the measured totals and from H, and added to the limit passed to the policy, so
// that every number printed is one model's own (as if it ran alone).
// Timing: the median of --steps steps after warm-up (a budget policy's kProfilingSteps profiling
// steps, then one round for all), all policies of a model interleaved round-robin per step so
// that machine noise hits them alike.
//
//   build/bench/bench_memory_limit [--models gpt,gpt-l,mlp,resnet20] [--steps 5] [--threads 2]
//                                  [--fractions 0.5,0.3,0.2] [--json]
// --json adds one JSON object per policy and fraction (and per model summary) on stdout, each on
// a line of its own starting with '{'.
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "remat/nn.h"
#include "remat/remat.h"

using namespace remat;

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<std::string> models = {"gpt", "gpt-l", "mlp", "resnet20"};
  std::vector<double> fractions = {0.5, 0.3, 0.2};
  int steps = 5, threads = 2;
  bool json = false;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "bench_memory_limit: %s\nusage: bench_memory_limit [--models gpt,gpt-l,mlp,resnet20] [--steps N] "
               "[--threads N] [--fractions 0.5,0.3,0.2] [--json]\n",
               why.c_str());
  std::exit(2);
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  for (size_t s = 0; s <= text.size();) {
    const size_t c = std::min(text.find(',', s), text.size());
    parts.push_back(text.substr(s, c - s));
    s = c + 1;
  }
  return parts;
}

int parse_int(const std::string& option, const std::string& v, int lo) {
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end || n < lo || n > 100000) usage(option + " wants an integer >= " + std::to_string(lo) + ", not '" + v + "'");
  return static_cast<int>(n);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--json") {
      o.json = true;
      continue;
    }
    if (k != "--models" && k != "--steps" && k != "--threads" && k != "--fractions") usage("unknown option '" + k + "'");
    if (i + 1 >= argc) usage(k + " needs a value");
    const std::string v = argv[++i];
    if (k == "--steps") o.steps = parse_int(k, v, 1);
    else if (k == "--threads") o.threads = parse_int(k, v, 1);
    else if (k == "--models") {
      o.models = split(v);
      for (const auto& m : o.models)
        if (m != "gpt" && m != "gpt-l" && m != "mlp" && m != "resnet20") usage("unknown model '" + m + "' (gpt, gpt-l, mlp, resnet20)");
    } else {
      o.fractions.clear();
      for (const auto& f : split(v)) {
        char* end = nullptr;
        const double x = std::strtod(f.c_str(), &end);
        if (f.empty() || *end || !(x > 0 && x < 1)) usage("--fractions wants numbers in (0, 1), not '" + f + "'");
        o.fractions.push_back(x);
      }
    }
  }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

// A gradient's bytes in host memory outside the allocator (so that keeping the reference does not
// change the counters of the steps measured next); "-" for no gradient.
std::string grad_bytes(const Tensor& g) {
  if (!g.defined()) return "-";
  Tensor c = g.contiguous();
  return std::string(static_cast<const char*>(c.raw_data()), c.nbytes()) + shape_str(c.shape());
}

// One model instance: its loss, its parameters, its planner.
struct Instance {
  std::function<Tensor()> loss;
  std::function<TensorList()> parameters;
  std::function<std::shared_ptr<BudgetPlanner>()> planner;
  void zero_grad() const {
    for (auto p : parameters()) p.zero_grad();
  }
};

struct ModelSpec {
  std::string name, description;
  size_t offload_threshold;
  std::function<Instance()> make;  // a fresh instance, same seed every time
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

ModelSpec gpt_spec(const std::string& name, int64_t layers, int64_t width, int64_t heads, int64_t seq, int64_t batch,
                   size_t threshold) {
  const nn::GPTConfig config{.vocab = 65, .layers = layers, .width = width, .heads = heads, .seq = seq, .dropout = 0.0,
                             .dtype = DType::f32, .seed = 1};
  Tensor all = from_indices(tokens(static_cast<size_t>(batch * (seq + 1)), 65, 7), {batch, seq + 1});
  Tensor ids = all.slice(1, 0, seq).contiguous(), targets = all.slice(1, 1, seq + 1).contiguous();
  char text[160];
  std::snprintf(text, sizeof text, "GPT: %lld layers, width %lld, %lld heads, seq %lld, batch %lld, vocab 65",
                static_cast<long long>(layers), static_cast<long long>(width), static_cast<long long>(heads),
                static_cast<long long>(seq), static_cast<long long>(batch));
  return {name, text, threshold, [=] {
            auto m = std::make_shared<nn::GPT>(config);
            return Instance{[=] { return m->loss(ids, targets); }, [=] { return m->parameters(); },
                            [=] { return m->planner(); }};
          }};
}

ModelSpec mlp_spec() {
  const int layers = 64, width = 512, batch = 128;
  Tensor x = randn({batch, width}, DType::f32, {999, 0});
  return {"mlp", "64-layer tanh MLP, width 512, batch 128", size_t{64} << 10, [=] {
            auto chain = std::make_shared<Chain>();
            TensorList params;
            for (int i = 0; i < layers; ++i) {
              Tensor w = randn({width, width}, DType::f32, {static_cast<uint64_t>(i) + 1, 0}, 0.0, 1.0 / std::sqrt(width))
                             .requires_grad_();
              Tensor b = zeros({width}).requires_grad_();
              params.push_back(w);
              params.push_back(b);
              chain->add([w, b](const Tensor& h) { return tanh(add(matmul(h, w), b)); });
            }
            return Instance{[=] { return mean(chain->forward(x)); }, [=] { return params; },
                            [=] { return chain->planner(); }};
          }};
}

ModelSpec resnet_spec() {
  auto data = nn::make_synthetic_images({.count = 32, .seed = 5});
  const nn::ResNetConfig rc{.blocks_per_stage = 3, .width = 16, .seed = 1};
  return {"resnet20", "CIFAR ResNet-20, width 16, batch 32, 32x32 images", size_t{1} << 20, [=] {
            auto m = std::make_shared<nn::ResNet>(rc);
            return Instance{[=] { return m->loss(data.images, data.labels); }, [=] { return m->parameters(); },
                            [=] { return m->planner(); }};
          }};
}

ModelSpec spec(const std::string& name) {
  if (name == "gpt") return gpt_spec(name, 4, 128, 4, 64, 12, size_t{64} << 10);
  if (name == "gpt-l") return gpt_spec(name, 8, 256, 8, 128, 8, size_t{256} << 10);
  if (name == "mlp") return mlp_spec();
  return resnet_spec();
}

// A policy under measurement. `fraction` < 0: not tied to a memory limit (judged against each).
struct Config {
  std::string label;  // what is printed (limits as the user would write them)
  Policy policy;
  int instance;       // index into the model's instances
  double fraction = -1;
  std::vector<double> times;
  size_t peak_saved = 0, peak_total = 0;
  std::optional<BudgetPlanner::Report> report;
  std::string error;  // set when the policy could not run (a budget below the smallest feasible)
};

struct Run {
  const Options& o;
  std::vector<Instance> instances;
  size_t foreign = 0;  // the other instances' parameter bytes, live in every step
  std::vector<std::string> reference;  // save-all's first-step gradients

  // One step; returns its seconds and records the peaks (one instance's own).
  double step(Config& c) {
    const Instance& in = instances[c.instance];
    in.zero_grad();
    ScopedPolicy scoped(c.policy);
    memory::reset_peaks();
    const size_t base = memory::live_bytes(memory::Tag::saved);
    const auto t0 = Clock::now();
    in.loss().backward();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const memory::Stats s = memory::stats();
    c.peak_saved = std::max(c.peak_saved, s.peak(memory::Tag::saved) - base);
    c.peak_total = std::max(c.peak_total, s.peak_total - foreign);
    return seconds;
  }

  // First steps: a budget policy's profiling steps, then the checked step, its report.
  void first_steps(Config& c) {
    if (c.policy.keep.kind == Policy::Kind::budget)
      for (int w = 0; w < BudgetPlanner::kProfilingSteps; ++w) step(c);
    c.peak_saved = c.peak_total = 0;
    step(c);
    if (c.policy.keep.kind == Policy::Kind::budget) c.report = instances[c.instance].planner()->report();
    std::vector<std::string> grads;
    for (const auto& p : instances[c.instance].parameters()) grads.push_back(grad_bytes(p.grad()));
    instances[c.instance].zero_grad();
    if (reference.empty()) {
      reference = grads;
      return;
    }
    for (size_t p = 0; p < grads.size(); ++p)
      if (grads[p] != reference[p]) {
        throw std::runtime_error(c.label + ": the gradient of parameter " + std::to_string(p) +
                                 " differs from save-all's (bitwise): aborting");
      }
  }

  void time_round_robin(std::vector<Config>& configs) {
    for (int round = 0; round <= o.steps; ++round)  // round 0: warm-up
      for (auto& c : configs) {
        if (!c.error.empty()) continue;
        const double s = step(c);
        instances[c.instance].zero_grad();
        if (round > 0) c.times.push_back(s);
        else c.peak_saved = c.peak_total = 0;  // the peaks reported are the timed steps' 
      }
  }
};

std::string bytes_text(size_t b) { return memory::format_bytes(static_cast<double>(b)); }

bool fits(const Config& c, size_t allowance, size_t limit) {
  return c.error.empty() && c.peak_total <= limit && c.peak_saved <= allowance;
}

void print_row(const Config& c, std::optional<size_t> allowance, std::optional<size_t> limit, double save_all_s) {
  if (!c.error.empty()) {
    std::printf("| %s | not run: %s | | | | no | | |\n", c.label.c_str(), c.error.c_str());
    return;
  }
  const double t = median(c.times);
  std::string fit = "-";
  if (limit) fit = fits(c, *allowance, *limit) ? "yes" : c.peak_total <= *limit ? "total only" : "no";
  std::string pred = "-", err = "-";
  if (c.report) {
    pred = std::to_string(c.report->predicted_peak_bytes);
    const double p = static_cast<double>(c.report->predicted_peak_bytes);
    char e[32];
    std::snprintf(e, sizeof e, "%+.1f%%", p > 0 ? 100.0 * (static_cast<double>(c.peak_saved) - p) / p : 0.0);
    err = e;
  }
  std::printf("| %s | %zu | %zu | %.4f | %.3f | %s | %s | %s |\n", c.label.c_str(), c.peak_saved, c.peak_total, t,
              t / save_all_s, fit.c_str(), pred.c_str(), err.c_str());
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (char ch : text) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) >= 0x20) out += ch;
  }
  return out + "\"";
}

void print_json(const std::string& model, const Config& c, std::optional<size_t> allowance, std::optional<size_t> limit,
                double fraction) {
  char f[32] = "null";
  if (fraction >= 0) std::snprintf(f, sizeof f, "%g", fraction);
  std::printf("{\"model\": \"%s\", \"policy\": %s, \"fraction\": %s, \"allowance_bytes\": %zu, \"limit_bytes\": %zu, "
              "\"error\": %s, \"peak_saved_bytes\": %zu, \"peak_total_bytes\": %zu, \"median_step_s\": %.6f, "
              "\"fits\": %s, \"predicted_peak_saved_bytes\": %zu}\n",
              model.c_str(), json_string(c.label).c_str(), f, allowance.value_or(0), limit.value_or(0),
              c.error.empty() ? "null" : json_string(c.error).c_str(), c.peak_saved, c.peak_total, median(c.times),
              !limit ? "null" : fits(c, *allowance, *limit) ? "true" : "false",
              c.report ? c.report->predicted_peak_bytes : 0);
}

void print_auto(const Config& c, size_t foreign) {
  if (!c.report) return;
  const auto& r = *c.report;
  std::printf("%s: automatic %s, capacity %s (%s), held besides saved %zu, budget %s, predicted peak saved %zu, "
              "plan %s\n",
              c.label.c_str(), r.automatic ? "yes" : "no", bytes_text(r.memory_capacity_bytes - foreign).c_str(),
              r.capacity_source.c_str(), r.held_besides_saved_bytes - foreign, bytes_text(r.budget_bytes).c_str(),
              r.predicted_peak_bytes, r.tree.c_str());
}

// The table for one fraction: the fixed policies judged against L, then the planned ones.
void report_fraction(const Options& o, const std::string& model, std::vector<Config>& configs, double f, size_t a,
                     size_t l, double save_all_s, size_t foreign) {
  std::printf("\nf = %.2f: allowance A = %zu (%s), limit L = H + A = %zu (%s)\n", f, a, bytes_text(a).c_str(), l,
              bytes_text(l).c_str());
  std::printf("| policy | peak saved B | peak total B | median step s | vs save-all | fits | pred. peak saved B | "
              "meas-pred |\n|---|---:|---:|---:|---:|---|---:|---:|\n");
  std::vector<const Config*> planned;  // budget:auto,limit=L, and with +offload:DIR
  const Config* best = nullptr;
  std::vector<const Config*> rows;
  for (auto& c : configs) {
    if (c.fraction != f && !(c.fraction < 0 && c.label != "save-all" && c.label != "budget:auto")) continue;
    rows.push_back(&c);
    print_row(c, a, l, save_all_s);
    if (c.label.rfind("budget:auto,limit=", 0) == 0) planned.push_back(&c);
    else if (fits(c, a, l) && (!best || median(c.times) < median(best->times))) best = &c;
  }
  if (o.json)
    for (const Config* c : rows) print_json(model, *c, a, l, f);
  for (const Config* limited : planned) {
    if (!limited->error.empty()) {
      std::printf("=> %s: not run (its error is in the table)\n", limited->label.c_str());
      continue;
    }
    print_auto(*limited, foreign);
    const double ratio = best ? median(limited->times) / median(best->times) : 0;
    std::printf("=> %s: %.3fx the fastest other that fits (%s); its peak total %s L\n", limited->label.c_str(), ratio,
                best ? best->label.c_str() : "none fits", limited->peak_total <= l ? "<=" : "EXCEEDS");
    if (o.json)
      std::printf("{\"model\": \"%s\", \"policy\": %s, \"fraction\": %g, \"limit_bytes\": %zu, "
                  "\"auto_vs_best_fitting\": %.4f, \"best_fitting\": %s, \"auto_within_limit\": %s}\n",
                  model.c_str(), json_string(limited->label).c_str(), f, l, ratio,
                  best ? json_string(best->label).c_str() : "null", limited->peak_total <= l ? "true" : "false");
  }
}

// The configurations of one model, in the order of their first steps: save-all (the gradient
// reference, S), budget:auto (H), the fixed policies, then each fraction's planned ones.
std::vector<Config> first_steps(Run& run, const ModelSpec& m, const std::string& dir, size_t& s, size_t& h) {
  std::vector<Config> configs;
  auto add = [&](std::string label, Policy p, int instance, double f) -> bool {
    Config c{std::move(label), std::move(p), instance, f, {}, 0, 0, std::nullopt, {}};
    try {
      run.first_steps(c);
    } catch (const Error& e) {  // a budget below the smallest feasible one: reported, not timed
      c.error = e.what();
    }
    configs.push_back(std::move(c));
    return configs.back().error.empty();
  };
  add("save-all", Policy::save_all(), 0, -1);
  s = configs[0].peak_saved;
  if (!add("budget:auto", Policy::budget_from_memory(), 1, -1) || !configs[1].report)
    throw Error("bench_memory_limit: budget:auto made no plan for " + m.name);
  h = configs[1].report->held_besides_saved_bytes - run.foreign;
  add("every-layer", Policy::every_layer(), 0, -1);
  for (int k = 2; k <= 4; ++k) add("every-k:" + std::to_string(k), Policy::every_k(k), 0, -1);
  const std::string target = "offload:" + dir + ",threshold=" + std::to_string(m.offload_threshold);
  add("offload:DIR", Policy::parse(target), 0, -1);
  add("every-layer+offload:DIR", Policy::parse("every-layer+" + target), 0, -1);
  for (size_t i = 0; i < run.o.fractions.size(); ++i) {
    const double f = run.o.fractions[i];
    const size_t a = static_cast<size_t>(f * static_cast<double>(s)), l = h + a;
    const int inst = 2 + 3 * static_cast<int>(i);
    add("budget:auto,limit=" + std::to_string(l), Policy::budget_from_memory(l + run.foreign), inst, f);
    add("budget:" + std::to_string(a), Policy::budget(a), inst + 1, f);
    add("budget:auto,limit=" + std::to_string(l) + "+offload:DIR",
        Policy::budget_from_memory(l + run.foreign).with_offload(Policy::parse(target).saved.offload.value()), inst + 2, f);
  }
  return configs;
}

void bench_model(const Options& o, const std::string& name, const std::string& dir) {
  const ModelSpec m = spec(name);
  Run run{o, {}, 0, {}};
  const int count = 2 + 3 * static_cast<int>(o.fractions.size());
  for (int i = 0; i < count; ++i) run.instances.push_back(m.make());
  size_t param_bytes = 0;
  for (const auto& p : run.instances[0].parameters()) param_bytes += p.nbytes();
  run.foreign = static_cast<size_t>(count - 1) * param_bytes;
  size_t s = 0, h = 0;
  std::fprintf(stderr, "bench_memory_limit: %s: first steps, gradients checked against save-all's\n", name.c_str());
  std::vector<Config> configs = first_steps(run, m, dir, s, h);
  std::fprintf(stderr, "bench_memory_limit: %s: timing %zu policies, %d rounds after one of warm-up\n", name.c_str(),
               configs.size(), o.steps);
  run.time_round_robin(configs);
  const Config& sa = configs[0];
  const Config& au = configs[1];
  const double sa_s = median(sa.times);
  std::printf("\n== %s: %s (%d threads, median of %d steps, round-robin; offload threshold %s) ==\n",
              m.name.c_str(), m.description.c_str(), num_threads(), o.steps, bytes_text(m.offload_threshold).c_str());
  std::printf("parameters %zu B; save-all: S = peak saved %zu B (%s), T = peak total %zu B (%s), step %.4f s\n",
              param_bytes, s, bytes_text(s).c_str(), sa.peak_total, bytes_text(sa.peak_total).c_str(), sa_s);
  std::printf("H = held besides saved (budget:auto's report) = %zu B (%s)\n", h, bytes_text(h).c_str());
  print_auto(au, run.foreign);
  std::printf("budget:auto vs save-all: step %.4f s = %.3fx (target <= 1.02x), peak saved %zu B\n", median(au.times),
              median(au.times) / sa_s, au.peak_saved);
  if (o.json) {
    print_json(name, sa, std::nullopt, std::nullopt, -1);
    print_json(name, au, std::nullopt, std::nullopt, -1);
  }
  for (double f : o.fractions) {
    const size_t a = static_cast<size_t>(f * static_cast<double>(s));
    report_fraction(o, name, configs, f, a, h + a, sa_s, run.foreign);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it is made, also into a file or a pipe
  set_num_threads(o.threads);
  std::string pattern = (std::filesystem::temp_directory_path() / "bench_memory_limit.XXXXXX").string();
  if (!mkdtemp(pattern.data())) {
    std::perror("bench_memory_limit: mkdtemp");
    return 1;
  }
  int rc = 0;
  try {
    for (const auto& name : o.models) bench_model(o, name, pattern);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_memory_limit: %s\n", e.what());
    rc = 1;
  }
  std::filesystem::remove_all(pattern);
  return rc;
}
