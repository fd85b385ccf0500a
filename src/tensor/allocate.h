// Internal: the one place where a shape becomes an allocation.
#pragma once

#include "remat/tensor.h"

namespace remat::detail {

// A new contiguous tensor of `shape`. Checks the shape (check_shape) and the byte size, and turns
// a failed allocation into remat::OutOfMemory naming `op` (when given), the shape, the dtype and
// the bytes asked; the allocator's counters are then unchanged.
Tensor allocate_tensor(const char* op, const Shape& shape, DType dtype, memory::Tag tag, Device device);

// A contiguous tensor over `data`, memory remat did not allocate (see the external Storage
// constructor): counted under `tag` while it lives; `release` runs when its storage ends. A
// refused shape throws before anything is counted, and `release` is then not called.
Tensor external_tensor(void* data, const Shape& shape, DType dtype, memory::Tag tag, Device device,
                       std::function<void()> release);

// A contiguous tensor whose value is computed when its data is first read (the deferred Storage
// constructor); shape, dtype and device are known now, the bytes only then.
Tensor deferred_tensor(const Shape& shape, DType dtype, Device device, Storage::Compute compute);

// Records on t's storage the range of the i64 values just written to it from the host (`values`,
// t.numel() of them), when t covers its whole storage (Storage::index_range); otherwise nothing.
void note_index_range(const Tensor& t, const int64_t* values);

// Told of every tensor handle made on this thread while it is installed: each new block
// (allocate_tensor, external_tensor, deferred_tensor) and each Tensor::detach(). A checkpoint
// region watches which handles a layer call made and left alive (Note [values that leave a layer
// call], src/checkpoint/traced_call.cpp). One per thread; an installed watcher passes what it is
// told on to the one it replaced.
class HandleWatcher {
 public:
  virtual ~HandleWatcher() = default;
  virtual void on_new_handle(const std::shared_ptr<TensorImpl>& impl) = 0;
};
HandleWatcher* handle_watcher();
HandleWatcher* set_handle_watcher(HandleWatcher* watcher);  // returns the previous one

}  // namespace remat::detail
