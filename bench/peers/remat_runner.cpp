// bench/peers/remat_runner.cpp - one remat configuration of the peer benchmarks, in its own process.
//
//   remat_runner --model mlp|gpt|gpt-large|nanogpt|resnet|resnet-110 --policy POLICY [--steps 5] [--warmup 2] [--threads 2]
//                [--save-init FILE] [--lr 1e-4] [--alloc-cache BYTES]
//
// Builds the model from a fixed seed, makes its inputs from a fixed seed, optionally writes both to
// FILE (safetensors: the parameters under their module names, the inputs as "input.x" or
// "input.ids" / "input.targets", or "input.x" / "input.labels" for the ResNets, whose batch-norm
// running statistics start at PyTorch's defaults) for the PyTorch and JAX scripts, then runs `warmup` + `steps`
// training steps under POLICY and prints one JSON line. --alloc-cache sets the limit of the
// allocator's cache of freed blocks (memory::Allocator::set_cache_limit; 0 turns it off), for
// diagnosis; by default the library's own limit stands.
//
// A step is: drop the gradients, forward, loss, backward, plain SGD update (no momentum). The
// same in bench/peers/torch_runner.py and jax_runner.py. With --fuse-optimizer the update runs
// inside the backward, each parameter as soon as its gradient is final (the same weights).
//
// Memory, measured the same way in every system (see docs/performance.md):
//   rss_peak_growth_bytes  VmHWM at the end minus VmHWM right after setup (model, inputs and
//                          optimizer built, nothing run yet); before reading the baseline the
//                          high-water mark is reset to the current RSS (/proc/self/clear_refs 5),
//                          so setup transients do not hide step memory.
//   alloc_peak_bytes       remat's accounted allocator: the peak of live bytes over all steps minus
//                          the live bytes at the baseline (exact, every tensor byte).
//   alloc_peak_saved_bytes the peak of bytes held for the backward pass (Tag::saved).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "remat/nn.h"
#include "remat/remat.h"

using namespace remat;

namespace {

using Clock = std::chrono::steady_clock;

// ---- /proc/self/status
long status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(in, line))
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') return std::stol(line.substr(n + 1));
  return -1;
}
bool reset_hwm() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

// ---- models

// One layer of the tanh MLP: h = tanh(fc(h)) = tanh(h @ W^T + b).
class TanhLayer : public nn::Module {
 public:
  explicit TanhLayer(int64_t width) { fc = register_module("fc", std::make_shared<nn::Linear>(width, width)); }
  Tensor forward_impl(const Tensor& x) override { return remat::tanh(fc->forward(x)); }
  std::string type_name() const override { return "TanhLayer"; }
  std::shared_ptr<nn::Linear> fc;
};

class TanhMLP : public nn::Module {
 public:
  TanhMLP(int64_t depth, int64_t width, uint64_t seed) {
    layers = register_module("layers", std::make_shared<nn::Sequential>());
    for (int64_t i = 0; i < depth; ++i) layers->add(std::make_shared<TanhLayer>(width));
    // Xavier-like normal with the tanh gain 5/3, so the signal neither dies nor saturates over 64
    // layers; small random biases so that they matter in the loss check.
    for (const auto& [name, p] : named_parameters()) {
      if (name.ends_with(".weight")) set_parameter_init(name, nn::Init::normal(0.0, (5.0 / 3.0) / std::sqrt(static_cast<double>(width))));
      else set_parameter_init(name, nn::Init::uniform(-0.1, 0.1));
    }
    reset_parameters(seed);
  }
  Tensor forward_impl(const Tensor& x) override { return layers->forward(x); }
  std::string type_name() const override { return "TanhMLP"; }
  std::shared_ptr<nn::Sequential> layers;
};

struct ModelSpec {
  std::string kind;  // "mlp", "gpt" or "resnet"
  // mlp
  int64_t depth = 64, width = 512, batch = 128;
  // gpt
  nn::GPTConfig gpt;
  // resnet (images 32x32, 10 classes)
  nn::ResNetConfig resnet;
  int64_t layers() const {
    if (kind == "resnet") return resnet.stages * resnet.blocks_per_stage + 2;
    return kind == "mlp" ? depth : gpt.layers;
  }
};

ModelSpec spec_for(const std::string& name) {
  ModelSpec s;
  if (name == "mlp") {
    s.kind = "mlp";
  } else if (name == "gpt") {  // the default model of `remat train` (vocabulary of the fortunes corpus)
    s.kind = "gpt";
    s.gpt = nn::GPTConfig{.vocab = 114, .layers = 4, .width = 128, .heads = 4, .seq = 64, .dropout = 0.0,
                          .dtype = DType::f32, .seed = 1};
    s.batch = 32;
  } else if (name == "gpt-large") {  // about 1 GiB of saved activations under save-all
    s.kind = "gpt";
    s.gpt = nn::GPTConfig{.vocab = 114, .layers = 8, .width = 256, .heads = 8, .seq = 256, .dropout = 0.0,
                          .dtype = DType::f32, .seed = 2};
    s.batch = 20;
  } else if (name == "nanogpt") {  // nanoGPT's CPU configuration of shakespeare_char
    s.kind = "gpt";
    s.gpt = nn::GPTConfig{.vocab = 65, .layers = 4, .width = 128, .heads = 4, .seq = 64, .dropout = 0.0,
                          .dtype = DType::f32, .seed = 3};
    s.batch = 12;
  } else if (name == "resnet" || name == "resnet-110") {  // CIFAR ResNet-20 / ResNet-110, width 16
    s.kind = "resnet";
    s.resnet = nn::ResNetConfig{.stages = 3, .blocks_per_stage = name == "resnet" ? 3 : 18, .width = 16, .seed = 3};
    s.batch = 32;
  } else {
    REMAT_CHECK(false, "remat_runner: unknown --model ", name, " (mlp, gpt, gpt-large, nanogpt, resnet, resnet-110)");
  }
  return s;
}

// Token ids in [0, vocab) from a fixed 64-bit LCG (the same file feeds PyTorch and JAX).
std::vector<int64_t> random_tokens(size_t n, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> v(n);
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& t : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<int64_t>((x >> 33) % static_cast<uint64_t>(vocab));
  }
  return v;
}

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void usage() {
  std::fprintf(stderr,
               "usage: remat_runner --model mlp|gpt|gpt-large|nanogpt|resnet|resnet-110 --policy POLICY [--steps N] [--warmup W] "
               "[--threads T] [--lr LR] [--save-init FILE] [--alloc-cache BYTES] [--fuse-optimizer]\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_name = "mlp", policy_text = "every-layer", save_init;
  int steps = 5, warmup = 2, threads = 2;
  double lr = 1e-4;
  long long cache_limit = -1;  // the allocator's cache of freed blocks: -1 leaves the library default
  bool fuse_optimizer = false;  // the SGD update inside the backward (nn::FusedOptimizerStep)
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        usage();
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model") model_name = value();
    else if (a == "--policy") policy_text = value();
    else if (a == "--steps") steps = std::stoi(value());
    else if (a == "--warmup") warmup = std::stoi(value());
    else if (a == "--threads") threads = std::stoi(value());
    else if (a == "--lr") lr = std::stod(value());
    else if (a == "--save-init") save_init = value();
    else if (a == "--alloc-cache") cache_limit = static_cast<long long>(memory::parse_bytes(value()));
    else if (a == "--fuse-optimizer") fuse_optimizer = true;
    else {
      usage();
      return 2;
    }
  }
  try {
    set_num_threads(threads);
    if (cache_limit >= 0) memory::cpu().set_cache_limit(static_cast<size_t>(cache_limit));
    const Policy policy = Policy::parse(policy_text);
    const ModelSpec spec = spec_for(model_name);

    // ---- setup: model, inputs, optimizer
    std::shared_ptr<nn::Module> model;
    std::shared_ptr<nn::GPT> gpt;
    std::shared_ptr<nn::ResNet> resnet;
    Tensor x, ids, targets, labels;
    nn::NamedTensors inputs;
    if (spec.kind == "mlp") {
      model = std::make_shared<TanhMLP>(spec.depth, spec.width, /*seed=*/7);
      x = randn({spec.batch, spec.width}, DType::f32, RngState{11, 0});
      inputs = {{"input.x", x}};
    } else if (spec.kind == "resnet") {
      resnet = std::make_shared<nn::ResNet>(spec.resnet);
      model = resnet;
      auto data = nn::make_synthetic_images({.count = spec.batch, .seed = 5});
      x = data.images;
      labels = data.labels;
      inputs = {{"input.x", x}, {"input.labels", labels}};
    } else {
      gpt = std::make_shared<nn::GPT>(spec.gpt);
      model = gpt;
      const size_t n = static_cast<size_t>(spec.batch * spec.gpt.seq);
      ids = from_indices(random_tokens(n, spec.gpt.vocab, 101), {spec.batch, spec.gpt.seq});
      targets = from_indices(random_tokens(n, spec.gpt.vocab, 202), {spec.batch, spec.gpt.seq});
      inputs = {{"input.ids", ids}, {"input.targets", targets}};
    }
    if (!save_init.empty()) {
      nn::NamedTensors all = model->named_parameters();
      all.insert(all.end(), inputs.begin(), inputs.end());
      nn::save_safetensors(save_init, all, {{"model", model_name}});
    }
    nn::SGD optimizer(model->parameters(), {.lr = lr});
    auto loss_fn = [&]() -> Tensor {
      if (spec.kind == "mlp") return mean(square(model->forward(x)));
      if (spec.kind == "resnet") return resnet->loss(x, labels);
      return gpt->loss(ids, targets);
    };

    ScopedPolicy scoped(policy);
    const bool hwm_reset = reset_hwm();
    const long rss_base_kib = status_kib("VmRSS");
    const long hwm_base_kib = status_kib("VmHWM");
    memory::reset_peaks();
    const size_t live_base = memory::stats().live_total;
    const size_t saved_base = memory::live_bytes(memory::Tag::saved);

    // Under budget:B the first kProfilingSteps steps profile and the next one plans: warm up past
    // them all, so the measured steps run the plan.
    if (policy.keep.kind == Policy::Kind::budget) warmup = std::max(warmup, BudgetPlanner::kProfilingSteps + 1);

    std::vector<double> times, cpu_times, losses;
    size_t steady_peak = 0, steady_saved_peak = 0;
    double recomputed_flops = 0, forward_flops = 0;
    for (int step = 0; step < warmup + steps; ++step) {
      if (step == warmup) memory::reset_peaks();
      if (step >= warmup) reset_counters();
      auto t0 = Clock::now();
      const double c0 = cpu_seconds();
      optimizer.zero_grad();
      Tensor loss = loss_fn();
      if (fuse_optimizer) {
        nn::FusedOptimizerStep inside(optimizer);  // each parameter updated as its gradient is final
        loss.backward();
      } else {
        loss.backward();
        optimizer.step();
      }
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      const double cpu = cpu_seconds() - c0;
      losses.push_back(loss.item());
      if (step >= warmup) {
        times.push_back(seconds);
        cpu_times.push_back(cpu);
        auto c = counters();
        recomputed_flops += c.ops.recomputed_flops;
        forward_flops += c.ops.forward_flops;
      }
    }
    const long hwm_end_kib = status_kib("VmHWM");
    auto stats = memory::stats();
    steady_peak = stats.peak_total - std::min(stats.peak_total, live_base);
    steady_saved_peak = stats.peak(memory::Tag::saved) - std::min(stats.peak(memory::Tag::saved), saved_base);

    nlohmann::json j = {
        {"system", "remat"},
        {"model", model_name},
        {"policy", policy.to_string()},
        {"threads", num_threads()},
        {"steps", steps},
        {"warmup", warmup},
        {"step_seconds", times},
        {"median_step_seconds", median(times)},
        {"step_cpu_seconds", cpu_times},
        {"median_step_cpu_seconds", median(cpu_times)},
        {"losses", losses},
        {"first_loss", losses.front()},
        {"rss_peak_growth_bytes", (hwm_end_kib - hwm_base_kib) * 1024},
        {"rss_base_bytes", rss_base_kib * 1024},
        {"hwm_reset", hwm_reset},
        // the allocator's peaks over the measured steps (after warm-up), above the live bytes at
        // the baseline (parameters, inputs)
        {"alloc_peak_bytes", steady_peak},
        {"alloc_peak_saved_bytes", steady_saved_peak},
        {"alloc_live_base_bytes", live_base},
        {"alloc_peak_total_bytes", stats.peak_total},
        {"alloc_peak_by_tag", {{"parameter", stats.peak(memory::Tag::parameter)}, {"gradient", stats.peak(memory::Tag::gradient)},
                               {"saved", stats.peak(memory::Tag::saved)}, {"other", stats.peak(memory::Tag::other)}}},
        {"parameter_bytes", memory::live_bytes(memory::Tag::parameter)},
        {"parameters", model->num_parameters()},
        {"forward_flops_per_step", forward_flops / std::max(1, steps)},
        {"recomputed_flops_per_step", recomputed_flops / std::max(1, steps)},
    };
    if (resnet) {
      // batch-norm updates per step: 1 under every policy (PyTorch's checkpoint re-runs them)
      j["bn_batches_tracked"] = resnet->batch_norms().front()->num_batches_tracked();
      j["bn_batches_tracked_per_step"] =
          static_cast<double>(resnet->batch_norms().front()->num_batches_tracked()) / (warmup + steps);
    }
    if (policy.keep.kind == Policy::Kind::budget) {
      // the plan scope is the root module (remat/budget.h)
      if (auto report = model->planner()->report()) {
        j["plan_predicted_peak_bytes"] = report->predicted_peak_bytes;
        j["plan_predicted_seconds"] = report->predicted_seconds;
        j["plan_tree"] = report->tree;
      }
    }
    std::printf("%s\n", j.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    nlohmann::json j = {{"system", "remat"}, {"model", model_name}, {"policy", policy_text}, {"error", e.what()}};
    std::printf("%s\n", j.dump().c_str());
    return 1;
  }
}
