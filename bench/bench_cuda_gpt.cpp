// bench_cuda_gpt: GPT training steps on a device under save-all, every-layer and a budget: step
// time and the device's own peak saved and total bytes, for scripts/cuda-check (against PyTorch:
// bench/peers/torch_gpt_cuda.py, the same shapes).
//
//   build/bench/bench_cuda_gpt [--device cuda:0] [--layers 12] [--width 768] [--heads 12] [--seq 1024]
//                              [--batch 8] [--vocab 50304] [--steps 5] [--warmup 3]
//                              [--budget-fraction 0.5] [--backend-options LIST] [--tf32] [--optimizer sgd|adamw]
//                              [--policies save-all,every-layer,budget] [--profile-steps N] [--dtype f32|bf16]
//
// Defaults are GPT-2 small (12 layers, width 768, 12 heads, context 1024, vocabulary padded to
// 50304 as nanoGPT does), float32, the device's default backend options (TF32 off); --dtype bf16
// trains in mixed precision (float32 master weights and AdamW state, bf16 compute:
// docs/precision.md), which on CUDA needs the backend option sixteen_bit (--backend-options
// sixteen_bit; --tf32 is --backend-options tf32). A step: drop the gradients, forward, loss, backward,
// the update (SGD lr 1e-4, no momentum, or AdamW lr 1e-4; as bench/peers), then the loss read back
// to the host, which waits for the device. The budget run's B lies between every-layer's and
// save-all's measured peak saved bytes: every-layer's + --budget-fraction x the difference (it
// needs both runs). Its first steps profile (BudgetPlanner::kProfilingSteps), so --warmup must
// cover them.
// Peaks are taken over the measured steps, from the device's counters (remat::memory_stats),
// relative to what was live before the step (the parameters). Each measured step also counts the
// device's launches and host synchronisations (remat::device_activity). With --profile-steps N
// (which turns the backend option profile on) N more steps follow the measured ones, each with
// its per-kernel device times (remat::take_kernel_profile), printed as a "profile" line; their
// step times are not the measured ones. One JSON line per policy (and per profile) on stdout,
// naming the backend options in force (remat::describe_backend_options).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "remat/devices.h"
#include "remat/nn.h"
#include "remat/remat.h"

using namespace remat;

namespace {

using Clock = std::chrono::steady_clock;

// GPT-2 small, its vocabulary padded to a multiple of 64 (nanoGPT's 50304).
nn::GPTConfig gpt2_small() {
  nn::GPTConfig c;
  c.vocab = 50304;
  c.seed = 1;
  return c;  // the other defaults of GPTConfig are GPT-2 small's, float32, no dropout
}

struct Options {
  nn::GPTConfig config = gpt2_small();
  std::string device = "cuda:0";
  int64_t batch = 8;
  int steps = 5, warmup = 3, profile_steps = 0;
  double budget_fraction = 0.5;
  std::string backend_options;  // --backend-options, on the defaults
  std::string optimizer = "sgd";
  std::string dtype = "f32";  // the compute dtype: f32, or bf16 (mixed precision)
  std::vector<std::string> policies = {"save-all", "every-layer", "budget"};
};

// One profiled step: device seconds and launches per kernel name.
struct Profile {
  double step_seconds = 0;
  std::vector<KernelTime> kernels;
};

struct Result {
  std::string policy;
  std::vector<double> seconds, losses;
  size_t peak_saved = 0, peak_total = 0;
  int64_t parameters = 0;  // elements of the model's parameters (for the report's MFU)
  uint64_t fallback_calls = 0;
  std::vector<uint64_t> launches, kernel_calls, synchronizations;  // per measured step
  std::vector<Profile> profiles;
  double median() const {
    std::vector<double> v = seconds;
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  }
};

// n token ids drawn from the Philox stream `seed`.
std::vector<int64_t> tokens(size_t n, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = static_cast<int64_t>(philox_word({seed, 0}, i) % static_cast<uint64_t>(vocab));
  return ids;
}

// warmup + steps training steps under `policy` on a fresh model; the measured steps' figures.
Result run(const Options& o, Device device, const std::string& policy_text) {
  Result r;
  r.policy = policy_text;
  const Policy policy = Policy::parse(policy_text);
  nn::GPTConfig config = o.config;
  if (o.dtype == "bf16") config.compute_dtype = DType::bf16;
  nn::GPT model(config);
  model.to(device);
  for (const Tensor& p : model.parameters()) r.parameters += p.numel();
  const Shape shape{o.batch, o.config.seq};
  const size_t n = static_cast<size_t>(o.batch * o.config.seq);
  const Tensor ids = from_indices(tokens(n, o.config.vocab, 1), shape, device);
  const Tensor targets = from_indices(tokens(n, o.config.vocab, 2), shape, device);
  std::unique_ptr<nn::Optimizer> optimizer;
  if (o.optimizer == "adamw")
    optimizer = std::make_unique<nn::AdamW>(model.parameters(), nn::AdamWOptions{.lr = 1e-4});
  else
    optimizer = std::make_unique<nn::SGD>(model.parameters(), nn::SGDOptions{.lr = 1e-4});
  Backend& b = backend(device);
  const uint64_t fallback_before = device.type == DeviceType::cpu ? 0 : fallback_calls(device);
  for (int step = 0; step < o.warmup + o.steps + o.profile_steps; ++step) {
    const bool profiled = step >= o.warmup + o.steps;
    optimizer->zero_grad();  // before the baseline: the step's gradients count in its peak
    b.synchronize();
    if (profiled) (void)take_kernel_profile(device);  // starts the step's profile
    reset_peaks(device);
    const memory::Stats base = memory_stats(device);
    const DeviceActivity activity_before = device_activity(device);
    const auto t0 = Clock::now();
    Tensor loss = backward([&] { return model.loss(ids, targets); }, GradOptions{policy});
    optimizer->step();
    const double value = loss.detach().to(kCpu).item();  // the step's one wait for the device
    const DeviceActivity activity_after = device_activity(device);
    b.synchronize();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    r.losses.push_back(value);
    if (profiled) {
      r.profiles.push_back({seconds, take_kernel_profile(device)});
      continue;
    }
    if (step < o.warmup) continue;
    const memory::Stats after = memory_stats(device);
    r.seconds.push_back(seconds);
    r.peak_saved = std::max(r.peak_saved, after.peak(memory::Tag::saved) - base.live(memory::Tag::saved));
    r.peak_total = std::max(r.peak_total, after.peak_total - base.live_total);
    r.launches.push_back(activity_after.launches - activity_before.launches);
    r.kernel_calls.push_back(activity_after.kernel_calls - activity_before.kernel_calls);
    r.synchronizations.push_back(activity_after.host_synchronizations - activity_before.host_synchronizations);
  }
  r.fallback_calls = (device.type == DeviceType::cpu ? 0 : fallback_calls(device)) - fallback_before;
  return r;
}

template <class T, class F>
std::string join(const std::vector<T>& values, F&& format) {
  std::string out;
  for (const T& v : values) out += (out.empty() ? "" : ",") + format(v);
  return out;
}

void emit(const Options& o, Device device, const Result& r, size_t budget_bytes) {
  auto number = [](auto v) { return detail::concat(v); };
  std::printf("{\"system\":\"remat\",\"device\":\"%s\",\"description\":\"%s\",\"policy\":\"%s\",\"layers\":%lld,"
              "\"width\":%lld,\"heads\":%lld,\"seq\":%lld,\"batch\":%lld,\"vocab\":%lld,\"tf32\":%s,"
              "\"optimizer\":\"%s\",\"dtype\":\"%s\",\"backend_options\":\"%s\","
              "\"step_seconds\":[%s],\"median_seconds\":%.6f,\"peak_saved_bytes\":%zu,\"peak_total_bytes\":%zu,"
              "\"budget_bytes\":%zu,\"parameters\":%lld,\"fallback_calls\":%llu,\"launches\":[%s],\"kernel_calls\":[%s],"
              "\"synchronizations\":[%s],\"losses\":[%s]}\n",
              device_name(device).c_str(), describe_device(device).c_str(), r.policy.c_str(),
              static_cast<long long>(o.config.layers), static_cast<long long>(o.config.width),
              static_cast<long long>(o.config.heads), static_cast<long long>(o.config.seq),
              static_cast<long long>(o.batch), static_cast<long long>(o.config.vocab),
              backend(device).options().tf32 ? "true" : "false", o.optimizer.c_str(), o.dtype.c_str(),
              backend_options_text(backend(device).options()).c_str(), join(r.seconds, number).c_str(),
              r.median(),
              r.peak_saved, r.peak_total, budget_bytes, static_cast<long long>(r.parameters),
              static_cast<unsigned long long>(r.fallback_calls),
              join(r.launches, number).c_str(), join(r.kernel_calls, number).c_str(),
              join(r.synchronizations, number).c_str(), join(r.losses, number).c_str());
  for (const Profile& p : r.profiles) {
    std::string kernels = join(p.kernels, [](const KernelTime& k) {
      return detail::concat("{\"name\":\"", k.name, "\",\"launches\":", k.launches, ",\"seconds\":", k.seconds, "}");
    });
    std::printf("{\"system\":\"remat\",\"kind\":\"profile\",\"policy\":\"%s\",\"dtype\":\"%s\","
                "\"backend_options\":\"%s\",\"step_seconds\":%.6f,\"kernels\":[%s]}\n",
                r.policy.c_str(), o.dtype.c_str(), backend_options_text(backend(device).options()).c_str(),
                p.step_seconds, kernels.c_str());
  }
  std::fflush(stdout);
}

void usage() {
  std::fprintf(stderr,
               "usage: bench_cuda_gpt [--device D] [--layers N] [--width C] [--heads H] [--seq T] [--batch B] "
               "[--vocab V] [--steps N] [--warmup N] [--budget-fraction F] [--backend-options LIST] [--tf32] "
               "[--optimizer sgd|adamw] "
               "[--policies P,...] [--profile-steps N] [--dtype f32|bf16]\n");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        usage();
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--device") o.device = value();
    else if (a == "--layers") o.config.layers = std::stoll(value());
    else if (a == "--width") o.config.width = std::stoll(value());
    else if (a == "--heads") o.config.heads = std::stoll(value());
    else if (a == "--seq") o.config.seq = std::stoll(value());
    else if (a == "--batch") o.batch = std::stoll(value());
    else if (a == "--vocab") o.config.vocab = std::stoll(value());
    else if (a == "--steps") o.steps = std::stoi(value());
    else if (a == "--warmup") o.warmup = std::stoi(value());
    else if (a == "--budget-fraction") o.budget_fraction = std::stod(value());
    else if (a == "--backend-options") o.backend_options += "," + value();
    else if (a == "--tf32") o.backend_options += ",tf32";
    else if (a == "--optimizer") o.optimizer = value();
    else if (a == "--profile-steps") o.profile_steps = std::stoi(value());
    else if (a == "--dtype") o.dtype = value();
    else if (a == "--policies") {
      o.policies.clear();
      std::string list = value();
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        if (comma > at) o.policies.push_back(list.substr(at, comma - at));
        at = comma + 1;
      }
    }
    else {
      usage();
      std::exit(2);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    REMAT_CHECK(o.steps >= 1 && o.warmup >= BudgetPlanner::kProfilingSteps + 1, "bench_cuda_gpt: --steps >= 1 and --warmup >= ",
                BudgetPlanner::kProfilingSteps + 1, " (the budget's profiling steps and one more)");
    REMAT_CHECK(o.budget_fraction > 0 && o.budget_fraction < 1, "bench_cuda_gpt: --budget-fraction must be in (0, 1)");
    REMAT_CHECK(o.optimizer == "sgd" || o.optimizer == "adamw", "bench_cuda_gpt: --optimizer sgd or adamw, not ",
                o.optimizer);
    REMAT_CHECK(o.profile_steps >= 0, "bench_cuda_gpt: --profile-steps must be >= 0");
    REMAT_CHECK(o.dtype == "f32" || o.dtype == "bf16", "bench_cuda_gpt: --dtype f32 or bf16, not ", o.dtype);
    const Device device = parse_device(o.device);
    BackendOptions options = parse_backend_options(o.backend_options, default_backend_options());
    if (o.profile_steps > 0) options.profile = true;
    if (device.type == DeviceType::cpu) use_device(device);
    else use_device(device, options);
    std::optional<Result> save_all, every_layer;
    for (const std::string& p : o.policies) {
      if (p == "budget") {
        REMAT_CHECK(save_all && every_layer, "bench_cuda_gpt: the budget run needs save-all and every-layer first");
        const size_t lo = std::min(save_all->peak_saved, every_layer->peak_saved);
        const size_t budget =
            every_layer->peak_saved + static_cast<size_t>(o.budget_fraction * static_cast<double>(save_all->peak_saved - lo));
        emit(o, device, run(o, device, detail::concat("budget:", budget)), budget);
        continue;
      }
      Result r = run(o, device, p);
      emit(o, device, r, 0);
      if (p == "save-all") save_all = std::move(r);
      if (p == "every-layer") every_layer = std::move(r);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_gpt: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
