// Internal: the non-blocking sum over ranks that GradientBuckets (buckets.cpp) and all_reduce_sum
// are built on, implemented over MPI in mpi.cpp and for one rank in single_process.cpp. The
// ordered mode adds in the order of the micro-batch tree (tree_sum.h), whatever the number of
// ranks: Note [the micro-batch tree] in data_parallel.cpp, Note [the ordered reduction] in mpi.cpp.
#pragma once

#include <memory>
#include <vector>

#include "remat/distributed.h"
#include "tree_sum.h"

namespace remat::distributed::internal {

// Which blocks of a step's micro-batches each rank holds partial sums of: rank r holds
// blocks_of(r x accumulate, (r + 1) x accumulate).
struct SumLayout {
  std::vector<std::vector<Block>> blocks;  // per rank
  int64_t total_blocks() const {
    int64_t n = 0;
    for (const auto& b : blocks) n += static_cast<int64_t>(b.size());
    return n;
  }
};
SumLayout layout_of(int64_t accumulate, int world);

// The scratch an ordered sum of `elements` needs (elements of the pieces' dtype).
int64_t scratch_elements(int64_t elements, const SumLayout& layout);

// One reduction in flight. `pieces` (contiguous 1-D f32 or f64 tensors of one size and dtype, one
// per block of this rank in the layout) are summed over the ranks in the layout's tree order; the
// sum is written into pieces[0] (the others are clobbered). `scratch`: scratch_elements() elements
// of their dtype (the ordered mode's; unused by native, which adds this rank's pieces in order
// and hands their sum to MPI_Iallreduce).
class AsyncSum {
 public:
  virtual ~AsyncSum() = default;
  virtual bool test() = 0;  // true once complete (pieces[0] then holds the sum); drives progress
  virtual void wait() = 0;  // blocks until complete
};
std::unique_ptr<AsyncSum> start_sum(const std::vector<Tensor>& pieces, const Tensor& scratch, const SumLayout& layout,
                                    Reduction mode);

// Every rank's `values` (the same count on every rank), rank after rank.
std::vector<double> all_gather_values(const std::vector<double>& values);

// left = left + right, elementwise (f32 or f64, contiguous, same size and dtype): the one addition
// every ordered sum is made of.
void add_into(const Tensor& left, const Tensor& right);

}  // namespace remat::distributed::internal
