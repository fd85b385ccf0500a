#include "data_parallel.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <unordered_map>

namespace remat::tools {

namespace {

// into = into + g (f32 or f64, contiguous, same shape): the accumulated sum is the left operand.
void add_gradient(const Tensor& into, const Tensor& g) {
  REMAT_CHECK(into.dtype() == g.dtype() && into.numel() == g.numel() && into.is_contiguous() && g.is_contiguous(),
              "train: gradients of one parameter differ between micro-batches");
  const int64_t n = into.numel();
  if (into.dtype() == DType::f32) {
    float* a = static_cast<float*>(into.raw_data());
    const float* b = static_cast<const float*>(g.raw_data());
    for (int64_t i = 0; i < n; ++i) a[i] = a[i] + b[i];
  } else {
    REMAT_CHECK(into.dtype() == DType::f64, "train: gradient accumulation supports f32 and f64");
    double* a = static_cast<double*>(into.raw_data());
    const double* b = static_cast<const double*>(g.raw_data());
    for (int64_t i = 0; i < n; ++i) a[i] = a[i] + b[i];
  }
}

// Whether two tensors start at the same memory (device memory is not read).
bool same_memory(const Tensor& a, const Tensor& b) {
  return a.impl().storage == b.impl().storage && a.impl().offset == b.impl().offset;
}

void scale_gradient(const Tensor& g, double factor) {
  const int64_t n = g.numel();
  if (g.dtype() == DType::f32) {
    float* a = static_cast<float*>(g.raw_data());
    const float f = static_cast<float>(factor);
    for (int64_t i = 0; i < n; ++i) a[i] *= f;
  } else {
    double* a = static_cast<double*>(g.raw_data());
    for (int64_t i = 0; i < n; ++i) a[i] *= factor;
  }
}

}  // namespace

StepGradients step_gradients(nn::GPT& model, const std::vector<int64_t>& tokens, int64_t batch, int64_t seq,
                             uint64_t seed, const Policy& policy, int64_t step, const DataParallel& dp,
                             const FusedUpdate* fused) {
  REMAT_CHECK(fused == nullptr || (dp.world == 1 && fused->optimizer != nullptr),
              "train: the optimizer inside the backward runs with one rank only");
  TensorList params = model.parameters();
  const Device device = params.empty() ? kCpu : params.front().device();
  REMAT_CHECK(device.type == DeviceType::cpu || dp.micro_batches() == 1,
              "train: --accumulate and mpirun add gradients on the host; on ", device_name(device), " run one micro-batch per step");
  std::unordered_map<const TensorImpl*, size_t> index;
  for (size_t i = 0; i < params.size(); ++i) index.emplace(params[i].impl_ptr().get(), i);
  const int64_t n = dp.micro_batches();
  // The sum so far of each parameter's gradient over this rank's micro-batches. Each micro-batch
  // runs on cleared gradients, so its gradient is computed exactly as a lone micro-batch would be
  // (contributions of a parameter used twice are summed within it first), then added.
  std::vector<Tensor> sum(params.size());
  std::vector<char> handed_on(params.size(), 0);  // given to the buckets or the optimizer already
  auto fold_in = [&](size_t i) {
    Tensor g = params[i].grad();
    if (!g.defined()) return;
    if (!g.is_contiguous()) {
      params[i].set_grad(g.contiguous());
      g = params[i].grad();
    }
    if (sum[i].defined()) add_gradient(sum[i], g);
    else sum[i] = g;
  };
  // parameter i's gradient is the rank's final sum from here on
  auto install = [&](size_t i) {
    if (sum[i].defined() && !same_memory(params[i].grad(), sum[i])) {
      params[i].zero_grad();
      params[i].set_grad(sum[i]);
    }
    sum[i] = Tensor();
  };
  double loss_sum = 0;
  for (int64_t micro = 0; micro < dp.accumulate; ++micro) {
    const int64_t index_of_batch = distributed::micro_batch_index(step, micro, dp.accumulate, dp.rank, dp.world);
    Batch b = sample_batch(tokens, batch, seq, seed, static_cast<uint64_t>(index_of_batch), device);
    for (Tensor p : params) p.zero_grad();
    manual_seed(seed * 1000003ull + static_cast<uint64_t>(index_of_batch));  // the dropout stream of this micro-batch
    const bool last = micro + 1 == dp.accumulate;
    // The last micro-batch's gradients are final at their final point: hand each on from there
    // (to its all-reduce bucket, or to the optimizer) while the rest of the backward runs.
    auto take = [&](const Tensor& leaf) -> int64_t {
      auto it = index.find(leaf.impl_ptr().get());
      if (it == index.end()) return -1;
      fold_in(it->second);
      install(it->second);
      handed_on[it->second] = 1;
      return static_cast<int64_t>(it->second);
    };
    std::optional<GradReadyHook> bucket_hook;
    std::optional<nn::FusedOptimizerStep> fused_step;
    if (last && dp.world > 1 && dp.buckets != nullptr) {
      bucket_hook.emplace([&](const Tensor& leaf) {
        if (take(leaf) >= 0) dp.buckets->ready(leaf);
      });
    } else if (last && fused != nullptr) {
      fused_step.emplace(*fused->optimizer, nn::FusedStepOptions{.before_update = [&](const Tensor& leaf) {
        if (take(leaf) < 0) return;
        if (n > 1) scale_gradient(leaf.grad(), 1.0 / static_cast<double>(n));
        if (fused->before_update) fused->before_update(leaf);
      }});
    }
    Tensor loss = backward([&] { return model.loss(b.inputs, b.targets); }, GradOptions{policy});
    bucket_hook.reset();
    fused_step.reset();
    loss_sum += loss.detach().to(kCpu).item();
    for (size_t i = 0; i < params.size(); ++i)
      if (!handed_on[i]) fold_in(i);
  }
  for (size_t i = 0; i < params.size(); ++i)
    if (!handed_on[i]) install(i);
  StepGradients out;
  if (dp.world > 1) {
    if (dp.buckets != nullptr) {
      const distributed::GradientBuckets::Timing t = dp.buckets->finish();
      out.communication_seconds = t.hidden_seconds + t.exposed_seconds;
      out.hidden_seconds = t.hidden_seconds;
    } else {
      out.communication_seconds = distributed::all_reduce_gradients(params, dp.reduction);
    }
  }
  std::vector<double> losses = distributed::all_gather(loss_sum);
  double total = 0;
  for (double l : losses) total += l;  // rank order
  out.loss = total / static_cast<double>(n);
  if (n > 1)
    for (size_t i = 0; i < params.size(); ++i)
      if (!(fused != nullptr && handed_on[i]) && params[i].grad().defined())
        scale_gradient(params[i].grad(), 1.0 / static_cast<double>(n));
  return out;
}

std::vector<int> optimizer_owners(const TensorList& params, int world) {
  double total = 0;
  for (const Tensor& p : params) total += static_cast<double>(p.nbytes());
  std::vector<int> owners;
  double before = 0;
  for (const Tensor& p : params) {
    // the rank whose equal share of the bytes holds this parameter's midpoint
    const double mid = before + static_cast<double>(p.nbytes()) / 2;
    int owner = total > 0 ? static_cast<int>(mid / total * world) : 0;
    owners.push_back(std::min(std::max(owner, owners.empty() ? 0 : owners.back()), world - 1));
    before += static_cast<double>(p.nbytes());
  }
  return owners;
}

void broadcast_from_owners(const TensorList& params, const std::vector<int>& owners) {
  for (size_t i = 0; i < params.size(); ++i) distributed::broadcast({params[i]}, owners[i]);
}

}  // namespace remat::tools
