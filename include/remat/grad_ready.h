// remat/grad_ready.h - run code at the moment a parameter's gradient is final.
//
// During backward(), a leaf's gradient is *final* when every contribution to it has arrived,
// including those that arrive during a checkpoint region's recomputation or from a value that
// dynamic rematerialization brought back: the engine reaches the leaf's accumulator only after
// every node that feeds it has run. A GradReadyHook, while it lives on a thread, is called at that
// point for every leaf that backward() accumulates into, with the leaf's .grad() already holding
// the new total (the old gradient plus this pass's). Two users in the library: the optimizer
// inside the backward (nn::FusedOptimizer, remat/nn/optim.h) and the bucketed all-reduce of data
// parallel training (distributed::GradientBuckets, remat/distributed.h).
//
//   size_t final_grads = 0;
//   {
//     remat::GradReadyHook hook([&](const remat::Tensor& leaf) {
//       ++final_grads;                          // leaf.grad() is final here
//     });
//     loss.backward();
//   }
//
// Rules:
//   - Only backward() (and Tensor::backward) calls hooks; grad() returns gradients instead of
//     accumulating them and calls none. Each leaf is reported at most once per backward(), in the
//     order the engine reaches the accumulators (the reverse of the order of first use, roughly);
//     a leaf that received no gradient is not reported.
//   - A leaf that is reported has its gradient committed at that point, so it opts out of the
//     rollback of Note [leaf gradients are transactional] (src/autodiff/engine.cpp): if a later
//     node throws, the leaves already reported keep their new gradients (and whatever the hook did
//     with them); the leaves not yet reached are unchanged, as without a hook.
//   - The hook runs under no-grad on the thread that called backward(). It may read, modify or
//     drop the leaf's gradient (zero_grad()) and update the leaf in place; a value that is still
//     needed by a later node of the same backward must not be changed (an optimizer that updates a
//     parameter is safe: every node that uses the parameter with a gradient path to it has run).
//     An exception from the hook ends the backward() and propagates to its caller.
//   - Hooks nest: the innermost one is active, and the one outside is restored at its end. While a
//     hook runs it is not active (a backward() inside it calls the enclosing hook, if any).
#pragma once

#include <functional>

#include "remat/tensor.h"

namespace remat {

using GradReadyFn = std::function<void(const Tensor& leaf)>;

class GradReadyHook {
 public:
  explicit GradReadyHook(GradReadyFn fn);
  ~GradReadyHook();
  GradReadyHook(const GradReadyHook&) = delete;
  GradReadyHook& operator=(const GradReadyHook&) = delete;

  // The hook active on this thread, or nullptr.
  static GradReadyHook* current();
  void operator()(const Tensor& leaf) const;

 private:
  GradReadyFn fn_;
  GradReadyHook* previous_;
};

}  // namespace remat
