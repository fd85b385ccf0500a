// Internal: the thread-local state of the autodiff layer.
#pragma once

#include <unordered_map>

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

// Measures, on this thread, the most bytes of a record that are in memory at once during its
// backward when each value comes back at its first read and goes at its last holder's release
// (Note [a record read back value by value] in saved_tensor.cpp). Values saved while it records
// count, except storages other saved values held already; reading() switches to the backward.
class StreamProbe {
 public:
  StreamProbe();
  ~StreamProbe();
  StreamProbe(const StreamProbe&) = delete;
  StreamProbe& operator=(const StreamProbe&) = delete;
  void reading() { reading_ = true; }
  size_t peak() const { return peak_; }

  struct Value {
    size_t bytes = 0;
    int holders = 0;
    bool counted = false;  // no other saved value held the storage when the record first saved it
    bool read = false;
  };
  void saved(const void* key, size_t bytes, bool held_before);
  void read(const void* key);
  void released(const void* key);

 private:
  StreamProbe* previous_;
  bool reading_ = false;
  std::unordered_map<const void*, Value> values_;
  size_t live_ = 0, peak_ = 0;
};

}  // namespace remat::autodiff
