// Chain: the container whose children become checkpoint regions under the policy, so a model
// written once is checkpointed without wrapping anything (the seed user's container rewrite,
// done once here).
#include "remat/checkpoint.h"

namespace remat {

Chain& Chain::add(Layer layer, std::string name, std::optional<Policy> policy) {
  REMAT_CHECK(static_cast<bool>(layer), "Chain::add: the layer function is empty");
  if (name.empty()) name = std::to_string(layers_.size());
  layers_.push_back(std::move(layer));
  names_.push_back(std::move(name));
  layer_policies_.push_back(std::move(policy));
  return *this;
}

Chain& Chain::set_policy(std::optional<Policy> policy) {
  policy_ = std::move(policy);
  return *this;
}

Tensor Chain::forward(const Tensor& x) const {
  const Policy container = policy_.value_or(current_policy());
  REMAT_CHECK(container.kind != Policy::Kind::budget,
              "Chain: policy ", container.to_string(), " needs the budget planner, which is not available in this "
              "build yet; use save-all, every-layer, every-k:K or selective:OPS");
  Tensor h = x;
  size_t i = 0;
  while (i < layers_.size()) {
    const Policy policy = layer_policies_[i].value_or(container);
    if (policy.kind == Policy::Kind::every_k && policy.k > 1 && !layer_policies_[i]) {
      // a segment of up to K consecutive children without their own override
      size_t end = i;
      while (end < layers_.size() && end - i < static_cast<size_t>(policy.k) && !layer_policies_[end]) ++end;
      std::vector<Layer> segment(layers_.begin() + static_cast<std::ptrdiff_t>(i),
                                 layers_.begin() + static_cast<std::ptrdiff_t>(end));
      std::string label = names_[i] + ".." + names_[end - 1];
      h = checkpoint(
          [segment](const Tensor& in) {
            Tensor t = in;
            for (const auto& layer : segment) t = layer(t);
            return t;
          },
          h, {policy, label});
      i = end;
      continue;
    }
    Layer layer = layers_[i];  // copied: the region may re-run it after this call returns
    h = checkpoint([layer](const Tensor& in) { return layer(in); }, h, {policy, names_[i]});
    ++i;
  }
  return h;
}

}  // namespace remat
