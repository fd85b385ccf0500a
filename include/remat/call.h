// remat/call.h - layer calls: the rule that makes every layer of any model a checkpoint region.
//
// nn::Module::forward() and remat::Chain route every call of a layer through remat::call(), so a
// model is checkpointed by the policy in force however it is written: a user's own class looping
// over its layers, nn::Sequential, nn::Residual, nn::Parallel, a container written by the user,
// a shared layer called twice. Code that is not a Module can use it directly:
//
//   remat::CallSite site{.label = "encoder.3"};
//   TensorList y = remat::call([&](const TensorList& in) { return TensorList{block(in[0])}; }, {x}, site);
//
// The rule. Every call carries a role (CallRole):
//   - The outermost call (no call in progress on this thread) is the root. It runs plain, and is
//     transparent.
//   - A call made while a transparent call is the innermost one in progress is a LAYER CALL:
//     under a recomputing policy it runs as a checkpoint region (remat/checkpoint.h). Layer calls
//     that a transparent call makes through a transparent child (a container that only routes
//     data: Sequential, Residual, Parallel, Chain, or a module marked transparent) are layer calls
//     too: containers are looked through.
//   - A call made inside a layer call runs plain: it is part of that layer, recomputed with it,
//     so no layer is recomputed more than once per backward pass. A call whose role is `layer`
//     is a region even there (multi-level checkpointing, by request).
//   - A call whose role is `transparent` is never a region itself; the calls it makes are judged
//     as if its caller had made them.
// What a layer call does under each policy:
//   save-all       a plain call (everything its ops need is kept)
//   every-layer    one region per layer call
//   selective:OPS  one region per layer call; inside it the outputs of the listed op kinds are kept
//                  where save-all would keep them too. The region also keeps its inputs, which
//                  save-all keeps only when an op of the layer saves them: a layer whose input no
//                  op saves (it begins with dropout, an add, a scalar multiply) keeps that input
//                  where save-all would not, so selective can keep up to the inputs of such layers
//                  more than save-all; with layers that begin with a Linear (or any op saving its
//                  input) it never keeps more
//   every-k:K      K consecutive layer calls of the same transparent call share one region (a
//                  segment: the ops between the calls, e.g. a residual add, are in it too); a
//                  transparent call, a call with its own policy, or the end of the transparent
//                  call closes the group early
//   budget:BYTES   the outermost transparent call under the budget is a plan scope: its layer calls
//                  (through nested containers) are the stages of a rotor plan (remat/budget.h)
//                  profiled on the first steps; regions of the plan are segments, nested as the
//                  plan nests them
// A region records the program's graph as save-all does and drops only what it can make again by
// running its ops (never the layer's code), so a value a layer leaves behind (kept in a member or a
// list, handed to a callback) holds save-all's value and gradient path under every policy
// (docs/checkpointing.md).
// A call's own policy (CallSite::policy: Module::set_policy, the per-child policy of a container)
// decides how that call runs and is the default for every call inside it. Under a budget plan the
// policies of containers inside the plan scope are ignored; a layer with its own policy is run by
// that policy and is not a stage of the plan.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "remat/budget.h"
#include "remat/policy.h"
#include "remat/tensor.h"

namespace remat {

using RegionFn = std::function<TensorList(const TensorList&)>;

enum class CallRole {
  automatic,    // a layer when called by a transparent call (the default for modules)
  layer,        // always a layer, even inside another layer (nested region)
  transparent,  // a container: never a region; its calls are judged as its caller's
};

struct CallSite {
  std::string label;                       // names the call in counters and reports ("blocks.3")
  CallRole role = CallRole::automatic;
  std::optional<Policy> policy;            // this call's own policy, and the default inside it
  std::shared_ptr<BudgetPlanner> planner;  // kept by the caller across steps: used when this call
                                           // is a plan scope under budget:BYTES
};

// Runs fn(inputs) under the rule above; returns its outputs.
TensorList call(const RegionFn& fn, const TensorList& inputs, const CallSite& site);

// True while a layer call (or an explicit checkpoint region) is in progress on this thread.
bool in_layer_call();

}  // namespace remat
