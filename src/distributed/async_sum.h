// Internal: the non-blocking sum over ranks that GradientBuckets (buckets.cpp) is built on,
// implemented over MPI in mpi.cpp and for one rank in single_process.cpp.
#pragma once

#include <memory>

#include "remat/distributed.h"

namespace remat::distributed::internal {

// One reduction in flight: `flat` (a contiguous 1-D f32 or f64 tensor) is summed over the ranks
// in place. `gathered` is the scratch of the ordered mode: world_size() x flat.numel() elements of
// flat's dtype (unused by native).
class AsyncSum {
 public:
  virtual ~AsyncSum() = default;
  virtual bool test() = 0;  // true once complete (flat then holds the sum); drives progress
  virtual void wait() = 0;  // blocks until complete
};
std::unique_ptr<AsyncSum> start_sum(const Tensor& flat, const Tensor& gathered, Reduction mode);

}  // namespace remat::distributed::internal
