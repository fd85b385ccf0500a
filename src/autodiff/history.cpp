// See history.h.
#include "autodiff/history.h"

namespace remat::autodiff {

size_t attach_output(Tensor& out, const std::shared_ptr<Node>& node) {
  const size_t slot = node->outputs.size();
  node->outputs.push_back({out.shape(), out.dtype(), out.device()});
  TensorImpl& impl = out.impl();
  impl.grad_fn = node;
  impl.output_nr = static_cast<uint32_t>(slot);
  impl.requires_grad = true;
  return slot;
}

void CapturedEdges::add(Node& node, const Edge& e) {
  if (!e.valid() || index_.count(e)) return;
  index_[e] = node.next_edges.size();
  node.next_edges.push_back(e);
}

std::optional<size_t> CapturedEdges::slot_of(const Edge& e) const {
  auto it = index_.find(e);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

void route_captured(const EngineResult& result, const std::unordered_map<const Node*, size_t>& leaf_slots,
                    const CapturedEdges& captured, const std::function<void(size_t slot, size_t index)>& deliver,
                    const std::function<void(const Edge&)>& unknown) {
  for (size_t c = 0; c < result.captured_edges.size(); ++c) {
    if (result.captured_grads[c].empty()) continue;
    const Edge& e = result.captured_edges[c];
    auto leaf = leaf_slots.find(e.node.get());
    if (leaf != leaf_slots.end()) {
      deliver(leaf->second, c);
      continue;
    }
    std::optional<size_t> slot = captured.slot_of(e);
    if (!slot) {
      unknown(e);
      continue;
    }
    deliver(*slot, c);
  }
}

}  // namespace remat::autodiff
