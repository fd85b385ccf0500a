#include "data_parallel.h"

#include <algorithm>
#include <chrono>

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
                             uint64_t seed, const Policy& policy, int64_t step, const DataParallel& dp) {
  TensorList params = model.parameters();
  // The sum so far of each parameter's gradient over this rank's micro-batches. Each micro-batch
  // runs on cleared gradients, so its gradient is computed exactly as a lone micro-batch would be
  // (contributions of a parameter used twice are summed within it first), then added.
  std::vector<Tensor> sum(params.size());
  double loss_sum = 0;
  for (int64_t micro = 0; micro < dp.accumulate; ++micro) {
    const int64_t index = distributed::micro_batch_index(step, micro, dp.accumulate, dp.rank, dp.world);
    Batch b = sample_batch(tokens, batch, seq, seed, static_cast<uint64_t>(index));
    for (Tensor p : params) p.zero_grad();
    manual_seed(seed * 1000003ull + static_cast<uint64_t>(index));  // the dropout stream of this micro-batch
    Tensor loss = backward([&] { return model.loss(b.inputs, b.targets); }, GradOptions{policy});
    loss_sum += loss.item();
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor g = params[i].grad();
      if (!g.defined()) continue;
      if (!g.is_contiguous()) {
        params[i].set_grad(g.contiguous());
        g = params[i].grad();
      }
      if (sum[i].defined()) add_gradient(sum[i], g);
      else sum[i] = g;
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (sum[i].defined() && params[i].grad().raw_data() != sum[i].raw_data()) {
      params[i].zero_grad();
      params[i].set_grad(sum[i]);
    }
  }
  sum.clear();
  StepGradients out;
  if (dp.world > 1) out.communication_seconds = distributed::all_reduce_gradients(params, dp.reduction);
  std::vector<double> losses = distributed::all_gather(loss_sum);
  double total = 0;
  for (double l : losses) total += l;  // rank order
  const int64_t n = dp.micro_batches();
  out.loss = total / static_cast<double>(n);
  if (n > 1)
    for (const Tensor& p : params)
      if (p.grad().defined()) scale_gradient(p.grad(), 1.0 / static_cast<double>(n));
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
