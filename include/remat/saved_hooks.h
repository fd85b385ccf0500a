// remat/saved_hooks.h - hooks on saved values: pack when an op saves a value, unpack when its
// backward reads it (the analogue of PyTorch's saved_tensors_hooks).
//
// Every value kept for a backward pass goes through autodiff::SavedTensor. While a
// ScopedSavedTensorHooks is alive on a thread, a SavedTensor created on that thread does not keep
// its value: it asks the hooks to pack the value's storage and keeps what pack returned, and the
// backward pass gets the storage back from unpack. This is the seam that dynamic
// rematerialization (policy dynamic:BYTES) and offloading (offload:DIR) plug into; user hooks can
// count, compress or move saved values.
//
//   // count how many bytes a step saves, without changing anything
//   size_t packed_bytes = 0;
//   remat::SavedTensorHooks counting{
//       [&](const Tensor& storage) -> remat::PackedValue {
//         packed_bytes += storage.nbytes();
//         return std::make_shared<Tensor>(storage);         // keep the storage itself
//       },
//       [](const remat::PackedValue& p) { return *std::static_pointer_cast<Tensor>(p); }};
//   {
//     remat::ScopedSavedTensorHooks hooks(counting);
//     Tensor loss = model.forward(x).mean();
//     loss.backward();
//   }
//
//   // keep float32 activations as float16-rounded copies (saves memory; changes gradients)
//   remat::SavedTensorHooks rounding{
//       [](const Tensor& storage) -> remat::PackedValue { return std::make_shared<Tensor>(round_to_f16(storage)); },
//       [](const remat::PackedValue& p) { return *std::static_pointer_cast<Tensor>(p); }};
//
// The unit is the storage: pack receives a contiguous 1-D tensor over the whole storage of the
// saved value, and two saves of views of the same storage while the same hooks are in force pack
// once and share the packed value. unpack must return a contiguous tensor of the same dtype and
// number of elements; the saved view (offset, shape, strides) is rebuilt on it. Because nothing
// keeps the original storage alive, the saved-bytes account of the allocator counts what the hooks
// keep: a hook that keeps the storage (as above) keeps it counted; one that drops it frees it.
// A value overwritten in place after it was saved is still an error when it is read, as without
// hooks, even where the original storage was freed since (its version is followed by a watch that
// outlives it: Storage::version_watch).
// pack may decline a value by returning an empty PackedValue: the enclosing hooks are asked in
// turn, and a value no hooks take is kept as without hooks (checkpoint segments keep what they
// cannot make again this way, so an offload target still receives it).
// Hooks nest (the innermost is in force) and are per thread; values saved before a scope or after
// it are not packed by it, and a packed value is unpacked by the hooks that packed it, whenever its
// backward runs.
#pragma once

#include <functional>
#include <memory>

#include "remat/tensor.h"

namespace remat {

// What pack returns: whatever the hooks need to give the storage back.
using PackedValue = std::shared_ptr<void>;

struct SavedTensorHooks {
  std::function<PackedValue(const Tensor& storage)> pack;
  std::function<Tensor(const PackedValue& packed)> unpack;
  // Optional: called for packed values that the backward pass will read soon (the engine looks a
  // few nodes ahead), so that hooks which moved a value away can bring it back in the background.
  std::function<void(const PackedValue& packed)> prefetch;
  // Optional: called when a storage packed before is saved again under these hooks (every save of
  // one storage shares its one packed form), with that packed form.
  std::function<void(const PackedValue& packed)> repack;
};

class ScopedSavedTensorHooks {
 public:
  explicit ScopedSavedTensorHooks(SavedTensorHooks hooks);
  ~ScopedSavedTensorHooks();
  ScopedSavedTensorHooks(const ScopedSavedTensorHooks&) = delete;
  ScopedSavedTensorHooks& operator=(const ScopedSavedTensorHooks&) = delete;

 private:
  std::shared_ptr<void> state_;
};

}  // namespace remat
