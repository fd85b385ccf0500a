// `remat train`'s step gradients: gradient accumulation over micro-batches (--accumulate K) and
// data parallelism over MPI ranks (mpirun -np N), the library's distributed::data_parallel_step
// run on the GPT and the corpus. The global batch of a step is N x K micro-batches of --batch
// sequences, numbered rank-major (remat::distributed::micro_batch_index); each micro-batch has its
// own batch and dropout stream, functions of its number, so rank r of N (K = 1) runs exactly
// what one process with K = N runs as its micro-batch r.
#pragma once

#include <cstdint>
#include <vector>

#include "corpus.h"
#include "remat/distributed.h"
#include "remat/nn.h"
#include "remat/remat.h"

namespace remat::tools {

struct DataParallel {
  int64_t accumulate = 1;  // micro-batches per rank and step
  int rank = 0, world = 1;
  distributed::Reduction reduction = distributed::Reduction::ordered;
  // With several ranks: the gradients are reduced in these buckets while the last micro-batch's
  // backward runs (--bucket-bytes); nullptr: all at once after it (--bucket-bytes 0).
  distributed::GradientBuckets* buckets = nullptr;
  int64_t micro_batches() const { return accumulate * world; }  // per step, over all ranks
};

// The optimizer inside the last micro-batch's backward (--fuse-optimizer; one rank only): each
// parameter's final gradient (the micro-batches' sum, scaled to the mean) is handed to
// `before_update`, then `optimizer` updates the parameter and its gradient is dropped.
struct FusedUpdate {
  nn::Optimizer* optimizer = nullptr;
  GradReadyFn before_update;
};

struct StepGradients {
  double loss = 0;                    // mean over the global batch
  double communication_seconds = 0;  // in the all-reduce (0 with one rank)
  double hidden_seconds = 0;         // of which overlapped with the backward (bucketed reduction)
};

// Leaves in the parameters' .grad() the mean gradient over the step's global batch, the same bits
// on every rank (see distributed::data_parallel_step). With `fused`, the parameters are updated
// instead and have no gradient afterwards.
StepGradients step_gradients(nn::GPT& model, const std::vector<int64_t>& tokens, int64_t batch, int64_t seq,
                             uint64_t seed, const Policy& policy, int64_t step, const DataParallel& dp,
                             const FusedUpdate* fused = nullptr);

}  // namespace remat::tools
