// Test helpers for GPT models: token batches and one step's parameter gradients under a policy.
#pragma once

#include <cstdint>
#include <vector>

#include "remat/nn.h"
#include "remat/remat.h"

namespace remat::testing {

// Token ids (i * 7 + seed * 3) mod vocab, shape [batch, seq].
inline Tensor token_ids(int64_t batch, int64_t seq, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < batch * seq; ++i)
    v.push_back(static_cast<int64_t>((static_cast<uint64_t>(i) * 7 + seed * 3) % vocab));
  return from_indices(v, {batch, seq});
}

// One step of `model` on (ids, targets) under `policy`, dropout seeded by `seed`: every
// parameter's gradient.
inline TensorList gpt_gradients(nn::GPT& model, const Tensor& ids, const Tensor& targets, const Policy& policy,
                                uint64_t seed) {
  model.zero_grad();
  manual_seed(seed);
  ScopedPolicy scope(policy);
  model.loss(ids, targets).backward();
  TensorList g;
  for (auto& p : model.parameters()) g.push_back(p.grad().clone());
  return g;
}

}  // namespace remat::testing
