// distributed::data_parallel_step: gradient accumulation over micro-batches and ranks, and the
// ZeRO-1 ownership of the parameters (the rules are in remat/distributed.h).
#include <algorithm>
#include <optional>
#include <unordered_map>

#include "remat/distributed.h"
#include "remat/error.h"
#include "remat/grad_ready.h"

namespace remat::distributed {

namespace {

// Runs f on t's values in host memory: t itself on the CPU; on a device, a host copy that is
// written back afterwards (the sums are the host's arithmetic on every device, so a device's
// accumulated gradient has the bits of the CPU's).
template <class F>
void on_host(const Tensor& t, F&& f) {
  if (t.device().type == DeviceType::cpu) return f(t);
  const Tensor host = t.to(kCpu);
  f(host);
  Tensor(t).copy_(host);
}

// into = into + g (f32 or f64, contiguous, same shape): the accumulated sum is the left operand.
void add_gradient(const Tensor& into, const Tensor& g) {
  REMAT_CHECK(into.dtype() == g.dtype() && into.numel() == g.numel() && into.is_contiguous() && g.is_contiguous(),
              "distributed: the gradients of one parameter differ between micro-batches");
  REMAT_CHECK(into.dtype() == DType::f32 || into.dtype() == DType::f64,
              "distributed: gradient accumulation supports f32 and f64, got ", dtype_name(into.dtype()));
  const Tensor gh = g.device().type == DeviceType::cpu ? g : g.to(kCpu);
  on_host(into, [&](const Tensor& a_t) {
    const int64_t n = a_t.numel();
    if (a_t.dtype() == DType::f32) {
      float* a = static_cast<float*>(a_t.raw_data());
      const float* b = static_cast<const float*>(gh.raw_data());
      for (int64_t i = 0; i < n; ++i) a[i] = a[i] + b[i];
    } else {
      double* a = static_cast<double*>(a_t.raw_data());
      const double* b = static_cast<const double*>(gh.raw_data());
      for (int64_t i = 0; i < n; ++i) a[i] = a[i] + b[i];
    }
  });
}

void scale_gradient(const Tensor& g, double factor) {
  on_host(g, [&](const Tensor& t) {
    const int64_t n = t.numel();
    if (t.dtype() == DType::f32) {
      float* a = static_cast<float*>(t.raw_data());
      const float f = static_cast<float>(factor);
      for (int64_t i = 0; i < n; ++i) a[i] *= f;
    } else {
      double* a = static_cast<double*>(t.raw_data());
      for (int64_t i = 0; i < n; ++i) a[i] *= factor;
    }
  });
}

// Note: accumulating a step's gradients. Each micro-batch runs on cleared gradients, so its
// gradient is computed exactly as a lone micro-batch's would be (contributions of a parameter
// used twice are summed within it first); it is then added to the rank's running sum, the sum on
// the left. In the last micro-batch a gradient can be final before the backward ends: take()
// folds it in at that moment and installs the rank's sum as the parameter's .grad(), so it can be
// handed on (to a reduction bucket, to an optimizer) while the rest of the backward runs; the
// parameters not taken are folded in and installed after the backward.
class Accumulation {
 public:
  explicit Accumulation(const std::vector<Tensor>& params) : params_(params), sum_(params.size()), taken_(params.size(), 0) {
    for (size_t i = 0; i < params.size(); ++i) index_.emplace(params[i].impl_ptr().get(), i);
  }
  // The parameter's index, or -1.
  int64_t find(const Tensor& leaf) const {
    auto it = leaf.defined() ? index_.find(leaf.impl_ptr().get()) : index_.end();
    return it == index_.end() ? -1 : static_cast<int64_t>(it->second);
  }
  // `leaf`'s gradient is final (in the last micro-batch): its index, -1 if it is not a parameter.
  int64_t take(const Tensor& leaf) {
    const int64_t i = find(leaf);
    if (i < 0) return -1;
    const auto k = static_cast<size_t>(i);
    REMAT_CHECK(!taken_[k], "distributed: the gradient of \"", leaf.name(), "\" was reported final twice in one step");
    fold_in(k);
    install(k);
    taken_[k] = 1;
    return i;
  }
  void end_micro_batch() {
    for (size_t i = 0; i < params_.size(); ++i)
      if (!taken_[i]) fold_in(i);
  }
  void install_rest() {
    for (size_t i = 0; i < params_.size(); ++i)
      if (!taken_[i]) install(i);
  }

 private:
  void fold_in(size_t i) {
    Tensor g = params_[i].grad();
    if (!g.defined()) return;
    if (!g.is_contiguous()) {
      params_[i].set_grad(g.contiguous());
      g = params_[i].grad();
    }
    if (sum_[i].defined()) add_gradient(sum_[i], g);
    else sum_[i] = g;
  }
  // parameter i's gradient is the rank's final sum from here on
  void install(size_t i) {
    // the same storage: the sum is the parameter's own gradient (compared without reading the
    // values, which may be on a device)
    const Tensor g = params_[i].grad();
    if (sum_[i].defined() && (!g.defined() || g.storage() != sum_[i].storage())) {
      params_[i].zero_grad();
      params_[i].set_grad(sum_[i]);
    }
    sum_[i] = Tensor();
  }

  std::vector<Tensor> params_;
  std::vector<Tensor> sum_;
  std::vector<char> taken_;
  std::unordered_map<const TensorImpl*, size_t> index_;
};

}  // namespace

StepResult data_parallel_step(const std::vector<Tensor>& params, int64_t step, const StepOptions& options,
                              const MicroBatchFn& micro) {
  const int me = rank(), world = world_size();
  REMAT_CHECK(options.accumulate >= 1 && step >= 0, "distributed: data_parallel_step needs accumulate >= 1 and step >= 0, got ",
              options.accumulate, " and ", step);
  REMAT_CHECK(micro != nullptr, "distributed: data_parallel_step needs a micro-batch function");
  const int64_t n = options.accumulate * world;
  Accumulation acc(params);
  std::vector<char> handed_scaled(params.size(), 0);  // hand_on scaled it and gave it away
  double loss_sum = 0;
  for (int64_t m = 0; m < options.accumulate; ++m) {
    const int64_t index = micro_batch_index(step, m, options.accumulate, me, world);
    const bool last = m + 1 == options.accumulate;
    for (Tensor p : params) p.zero_grad();
    const HandOnFn hand_on = [&](const Tensor& p) {
      REMAT_CHECK(last && world == 1, "distributed: hand_on is for the last micro-batch's backward of a one-rank step "
                  "(with several ranks the gradients are reduced before they are final)");
      const int64_t i = acc.take(p);
      if (i < 0) return false;
      if (n > 1) scale_gradient(p.grad(), 1.0 / static_cast<double>(n));
      handed_scaled[static_cast<size_t>(i)] = 1;
      return true;
    };
    std::optional<GradReadyHook> to_buckets;
    if (last && world > 1 && options.buckets != nullptr)
      to_buckets.emplace([&](const Tensor& leaf) {
        if (acc.take(leaf) >= 0) options.buckets->ready(leaf);
      });
    loss_sum += micro(index, last, hand_on);
    to_buckets.reset();
    acc.end_micro_batch();
  }
  acc.install_rest();
  StepResult out;
  if (world > 1) {
    if (options.buckets != nullptr) {
      const GradientBuckets::Timing t = options.buckets->finish();
      out.communication_seconds = t.hidden_seconds + t.exposed_seconds;
      out.hidden_seconds = t.hidden_seconds;
    } else {
      out.communication_seconds = all_reduce_gradients(params, options.reduction);
    }
  }
  double total = 0;
  for (double l : all_gather(loss_sum)) total += l;  // rank order
  out.loss = total / static_cast<double>(n);
  if (n > 1)
    for (size_t i = 0; i < params.size(); ++i)
      if (!handed_scaled[i] && params[i].grad().defined()) scale_gradient(params[i].grad(), 1.0 / static_cast<double>(n));
  return out;
}

std::vector<int> optimizer_owners(const std::vector<Tensor>& params, int world) {
  REMAT_CHECK(world >= 1, "distributed: optimizer_owners needs world >= 1, got ", world);
  double total = 0;
  for (const Tensor& p : params) total += static_cast<double>(p.nbytes());
  std::vector<int> owners;
  double before = 0;
  for (const Tensor& p : params) {
    const double mid = before + static_cast<double>(p.nbytes()) / 2;
    const int owner = total > 0 ? static_cast<int>(mid / total * world) : 0;
    owners.push_back(std::min(std::max(owner, owners.empty() ? 0 : owners.back()), world - 1));
    before += static_cast<double>(p.nbytes());
  }
  return owners;
}

void broadcast_from_owners(const std::vector<Tensor>& params, const std::vector<int>& owners) {
  REMAT_CHECK(owners.size() == params.size(), "distributed: broadcast_from_owners got ", owners.size(), " owners for ",
              params.size(), " parameters");
  for (size_t i = 0; i < params.size(); ++i) broadcast({params[i]}, owners[i]);
}

}  // namespace remat::distributed
