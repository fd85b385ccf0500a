// Internal: the one place where a shape becomes an allocation.
#pragma once

#include "remat/tensor.h"

namespace remat::detail {

// A new contiguous tensor of `shape`. Checks the shape (check_shape) and the byte size, and turns
// a failed allocation into remat::OutOfMemory naming `op` (when given), the shape, the dtype and
// the bytes asked; the allocator's counters are then unchanged.
Tensor allocate_tensor(const char* op, const Shape& shape, DType dtype, memory::Tag tag, Device device);

}  // namespace remat::detail
