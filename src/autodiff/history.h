// Internal: the pieces every node that runs a sub-tape needs (scan loops, ordinary ops): hashing edges, attaching a node to the tensors it produced, installing a
// recording observer for a scope, and the ordered set of edges a node captured from outside.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>

#include "remat/autodiff.h"

namespace remat::autodiff {

// One hash for an edge (node, input_nr), wherever edges are keys.
inline size_t hash_edge(const void* node, uint32_t input_nr) {
  return std::hash<const void*>()(node) * 31 + input_nr;
}
struct EdgeHash {
  size_t operator()(const Edge& e) const { return hash_edge(e.node.get(), e.input_nr); }
};

// Makes `node` the grad_fn of `out` as its next output (recorded in node->outputs); returns that
// output's index. `out` must be a handle no one else holds (detach() first if it may be aliased).
size_t attach_output(Tensor& out, const std::shared_ptr<Node>& node);

// Installs `observer` as the thread's recording observer until the scope ends (on every exit path).
class ObserverScope {
 public:
  explicit ObserverScope(RecordingObserver* observer) : previous_(set_recording_observer(observer)) {}
  ~ObserverScope() { set_recording_observer(previous_); }
  ObserverScope(const ObserverScope&) = delete;
  ObserverScope& operator=(const ObserverScope&) = delete;

 private:
  RecordingObserver* previous_;
};

// The edges into the tape outside a node's sub-tape that its function used (captured parameters,
// activations computed before it), each added once, in first-seen order, as a next edge of the node.
class CapturedEdges {
 public:
  // Appends e to node.next_edges unless it is invalid or already captured.
  void add(Node& node, const Edge& e);
  bool contains(const Edge& e) const { return index_.count(e) != 0; }
  // The next_edges slot of a captured edge, or nullopt.
  std::optional<size_t> slot_of(const Edge& e) const;

 private:
  std::unordered_map<Edge, size_t, EdgeHash> index_;
};

// Hands out what a sub-tape's backward captured (EngineResult, capture order) to the node that ran
// it. An edge into the accumulator of one of the sub-tape's fresh leaves goes to that leaf's slot
// (leaf_slots: accumulator node -> slot); any other edge to its slot in `captured`; an edge in
// neither is passed to `unknown`, which throws (the function used a tensor its first run did not).
// Edges that received no gradient are skipped.
void route_captured(const EngineResult& result, const std::unordered_map<const Node*, size_t>& leaf_slots,
                    const CapturedEdges& captured, const std::function<void(size_t slot, size_t index)>& deliver,
                    const std::function<void(const Edge&)>& unknown);

}  // namespace remat::autodiff
