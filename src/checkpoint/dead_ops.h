// Internal: which ops of a region's recomputation no backward formula needs (Note [skipping dead
// ops] in dead_ops.cpp), and the outputs that stand for them while they are skipped.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "autodiff/digest.h"
#include "remat/autodiff.h"

namespace remat::detail {

class OpTrace {
 public:
  // ---- the first run
  // Before it: the values this region's label had to check last time (Note [skipping dead ops]).
  void expect(const std::string& label);
  // Every op in the region's extent, in order (the observer's replay() call, which ops of regions
  // nested in a re-run reach too); the order numbers them.
  void on_sequence(const std::string& op);
  // The op just sequenced ran as the region's own (its saved values and data flow are known);
  // `replay` is its definition (event.make_replay()).
  void on_event(const autodiff::OpEvent& event, const std::shared_ptr<autodiff::OpReplay>& replay);
  // `to` is a new handle of `from` (a region's output detached from the op that made it).
  void alias(const Tensor& from, const Tensor& to);
  // At the region's close: decides which ops a recomputation skips, and forgets the rest.
  void finish();

  // ---- a recomputation
  // Whether the op numbered `ordinal` (named `op`) is skipped; false for any mismatch with the
  // first run (the recomputation then runs it, and the region's checks speak).
  bool skips(size_t ordinal, const std::string& op) const;
  // Outputs standing for the skipped op, computed from the first run's definition of the op on
  // `inputs` when first read; `record_as` is that definition. Raises (naming `region`) when an
  // input computed by the recomputation differs from the first run's.
  TensorList defer(size_t ordinal, const TensorList& inputs, std::shared_ptr<const autodiff::OpReplay>& record_as,
                   const std::string& region) const;
  size_t skipped_ops() const { return skipped_; }
  // The recomputation is over (its sub-tape is built): the skipped ops' inputs are let go, so that
  // the backward frees each as its last reader is done, as without skipping.
  void end_recomputation() const;

 private:
  struct Producer {
    int op = -1;  // ordinal, or -1: from outside the region's ops
    uint32_t output = 0;
  };
  struct Op {
    std::string name;
    bool known = false;   // on_event seen
    bool forced = false;  // must run whatever its outputs (random, custom, saves an output)
    std::shared_ptr<autodiff::OpReplay> first;  // the first run's definition
    std::vector<Producer> inputs;
    std::vector<bool> input_saved;
    std::vector<autodiff::OutputMeta> outputs;
    // inputs made by ops that run: their first-run digests (nullopt: not checkable), by input
    std::vector<std::pair<uint32_t, std::optional<ValueDigest>>> checked;
    bool skip = false;
  };
  struct Seen {
    Producer producer;
    std::weak_ptr<TensorImpl> impl;  // the tensor still alive: the address is not reused
  };

  std::string label_;
  std::vector<Op> ops_;
  std::unordered_map<const TensorImpl*, Seen> producers_;  // first run only
  // first run only: the label's last ops and frontier (op, input) to digest; once the ops differ
  // from the last ones (or there were none), every input an op that might be skipped reads
  std::vector<std::string> expected_ops_;
  std::vector<std::pair<uint32_t, uint32_t>> expected_;
  bool unpredicted_ = true;
  mutable std::vector<std::weak_ptr<void>> deferred_;  // a recomputation's deferred calls
  size_t skipped_ = 0;
};

}  // namespace remat::detail
