// Chain: a container of layer functions. Its call is transparent and each child's call is a
// layer call (remat/call.h), so under the policy in force every child is a checkpoint region,
// every-k groups K children, and budget:BYTES plans over the children with the Chain's planner.
#include "remat/autodiff.h"
#include "remat/call.h"
#include "remat/chain.h"

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

Chain& Chain::set_planner(std::shared_ptr<BudgetPlanner> planner) {
  planner_ = std::move(planner);
  return *this;
}

const std::shared_ptr<BudgetPlanner>& Chain::planner() const {
  if (!planner_) planner_ = std::make_shared<BudgetPlanner>();
  return planner_;
}

Tensor Chain::forward(const Tensor& x) const {
  REMAT_CHECK(x.defined(), "Chain: the input is undefined");
  const Policy container = policy_.value_or(current_policy());
  REMAT_CHECK(container.keep.kind != Policy::Kind::budget || !grad_enabled() || !layers_.empty(), "Chain: policy ",
              container.to_string(), " applies to a non-empty chain");
  // Copies of the layer functions: a region may re-run one after this call has returned.
  auto layers = std::make_shared<const std::vector<Layer>>(layers_);
  auto names = std::make_shared<const std::vector<std::string>>(names_);
  auto policies = std::make_shared<const std::vector<std::optional<Policy>>>(layer_policies_);
  CallSite site;
  site.label = "";
  site.role = CallRole::transparent;
  site.policy = policy_;
  site.planner = planner();
  TensorList out = call(
      [layers, names, policies](const TensorList& in) {
        Tensor h = in[0];
        for (size_t i = 0; i < layers->size(); ++i) {
          Layer layer = (*layers)[i];
          CallSite child;
          child.label = (*names)[i];
          child.policy = (*policies)[i];
          h = call([layer](const TensorList& a) { return TensorList{layer(a[0])}; }, {h}, child)[0];
        }
        return TensorList{h};
      },
      {x}, site);
  return out[0];
}

}  // namespace remat
