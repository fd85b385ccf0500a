#include "data_parallel.h"

#include <optional>

namespace remat::tools {

StepGradients step_gradients(nn::GPT& model, const std::vector<int64_t>& tokens, int64_t batch, int64_t seq,
                             uint64_t seed, const Policy& policy, int64_t step, const DataParallel& dp,
                             const FusedUpdate* fused) {
  REMAT_CHECK(fused == nullptr || (dp.world == 1 && fused->optimizer != nullptr),
              "train: the optimizer inside the backward runs with one rank only");
  const TensorList params = model.parameters();
  const Device device = params.empty() ? kCpu : params.front().device();
  REMAT_CHECK(device.type == DeviceType::cpu || dp.micro_batches() == 1, "train: --accumulate and mpirun add ",
              "gradients on the host; on ", device_name(device), " run one micro-batch per step");
  const distributed::StepOptions options{.accumulate = dp.accumulate, .reduction = dp.reduction, .buckets = dp.buckets};
  auto micro = [&](int64_t index, bool last, const distributed::HandOnFn& hand_on) {
    Batch b = sample_batch(tokens, batch, seq, seed, static_cast<uint64_t>(index), device);
    manual_seed(seed * 1000003ull + static_cast<uint64_t>(index));  // the dropout stream of this micro-batch
    // the last micro-batch's final gradients go to the optimizer as the backward reaches them
    std::optional<nn::FusedOptimizerStep> fused_step;
    if (last && fused != nullptr)
      fused_step.emplace(*fused->optimizer, nn::FusedStepOptions{.before_update = [&](const Tensor& leaf) {
        if (hand_on(leaf) && fused->before_update) fused->before_update(leaf);
      }});
    return backward([&] { return model.loss(b.inputs, b.targets); }, GradOptions{policy}).detach().to(kCpu).item();
  };
  const distributed::StepResult r = distributed::data_parallel_step(params, step, options, micro);
  return {r.loss, r.communication_seconds, r.hidden_seconds};
}

}  // namespace remat::tools
