// Internal: the thread-local state of the autodiff layer.
#pragma once

#include "remat/autodiff.h"

namespace remat::autodiff {

struct ThreadState {
  bool grad_enabled = true;
  bool in_op_forward = false;      // inside an op's forward body: nested ops are plain calls
  bool in_backward_formula = false;  // inside an op's backward formula: not counted as forward work
  int recompute_depth = 0;
  int backward_depth = 0;          // top-level backward() / grad() runs in progress (nested > 1)
  int quiet_backward = 0;          // > 0: a backward that asked for no recomputation (gradcheck)
  RecordingObserver* observer = nullptr;
  OpListener* listener = nullptr;
  OpCounters counters;
};
ThreadState& thread_state();

// How many saved values hold `storage` on this thread: as itself (Storage::saved_references), or
// packed by the innermost saved-value hooks, where every save of one storage shares one packed form.
int saved_holders(const Storage& storage);

// Whether a storage's bytes are among the allocator's saved bytes (tagged saved or other), as an
// activation's are and a parameter's are not.
bool counted_as_saved(const Storage& storage);

}  // namespace remat::autodiff
