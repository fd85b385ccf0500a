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

// A tensor over `storage` with these view fields as they are: nothing allocated, nothing checked
// (the caller's fields describe memory inside the storage).
Tensor tensor_over(std::shared_ptr<Storage> storage, int64_t offset, const Shape& shape, const Strides& strides,
                   DType dtype);

// Records on t's storage the range of the i64 values just written to it from the host (`values`,
// t.numel() of them), when t covers its whole storage (Storage::index_range); otherwise nothing.
void note_index_range(const Tensor& t, const int64_t* values);

}  // namespace remat::detail
