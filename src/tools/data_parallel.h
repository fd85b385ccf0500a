// `remat train`'s step gradients: gradient accumulation over micro-batches (--accumulate K) and
// data parallelism over MPI ranks (mpirun -np N), one code path. The global batch of a step is
// N x K micro-batches of --batch sequences, numbered rank-major (remat::distributed::
// micro_batch_index); each micro-batch has its own dropout stream, a function of its number, so
// rank r of N (K = 1) runs exactly what one process with K = N runs as its micro-batch r.
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
// on every rank: this rank's micro-batch gradients are added in order (acc + g), the ranks' sums
// are added in rank order (distributed::Reduction::ordered), then scaled by 1 / (N x K) (nothing
// is scaled when N x K = 1, so a plain run is unchanged). With `fused`, the parameters are
// updated instead and have no gradient afterwards.
StepGradients step_gradients(nn::GPT& model, const std::vector<int64_t>& tokens, int64_t batch, int64_t seq,
                             uint64_t seed, const Policy& policy, int64_t step, const DataParallel& dp,
                             const FusedUpdate* fused = nullptr);

// ZeRO stage 1 (--shard-optimizer): rank owners[i] keeps parameter i's AdamW moments and updates
// it; the parameters are split into contiguous runs balanced by bytes, so each rank holds about
// 1/N of the optimizer state. AdamW updates each parameter on its own from the (identical, reduced)
// gradients, so the owner computes the same bits every rank would.
std::vector<int> optimizer_owners(const TensorList& params, int world);
// After the owners' steps: every parameter sent from its owner to all ranks.
void broadcast_from_owners(const TensorList& params, const std::vector<int>& owners);

}  // namespace remat::tools
