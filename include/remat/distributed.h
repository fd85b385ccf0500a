// remat/distributed.h - data-parallel training over MPI.
//
// N processes (ranks), started by `mpirun`, each hold the whole model. At start rank 0's weights
// are broadcast to all and every rank checks that it has the same model (parameter names, shapes,
// dtypes, then a checksum of the values). Each step every rank runs the forward and backward of
// its own share of the global batch (the sharding below), the gradients are summed over ranks,
// and every rank applies the same optimizer step to the same sum, so the weights stay identical.
//
//   remat::distributed::init();                       // MPI_Init when started by mpirun
//   auto params = model.named_parameters();
//   remat::distributed::broadcast_parameters(params);  // rank 0's values; checks every rank
//   for (int64_t step = 0; step < steps; ++step) {
//     optimizer.zero_grad();
//     int64_t index = remat::distributed::micro_batch_index(step, 0, 1);  // this rank's batch
//     remat::backward([&] { return model.loss(batch(index)); }, {policy});
//     remat::distributed::all_reduce_gradients(model.parameters());      // sum over ranks
//     for (const Tensor& p : model.parameters())                           // the mean over ranks
//       p.grad().copy_(remat::mul_scalar(p.grad(), 1.0 / remat::distributed::world_size()));
//     optimizer.step();
//   }
//   remat::distributed::finalize();
//
// Exactness. The gradient sum is `ordered` by default: the micro-batch gradients of a step are
// added in one fixed order, the pairwise tree over their global index (micro_batch_index: ((g0 +
// g1) + (g2 + g3)) for four), whatever the number of ranks that computed them and whatever the
// message sizes. So N ranks accumulating K micro-batches each give bitwise the step of one process
// accumulating N x K, for every split with the same product (1 x 4, 2 x 2, 4 x 1), with ZeRO-1 too,
// and the same bits on every rank; a training state written at one number of ranks resumes at
// another. It moves what a ring all-reduce moves (a reduce-scatter and an all-gather of its own).
// `native` uses MPI_Allreduce on each rank's sum, whose order is the MPI library's choice: bitwise
// equal to `ordered` only for N <= 2 ranks of one micro-batch (each element is then one
// addition), and for N > 2 its rounding depends on the algorithm MPI picks.
//
// Without MPI (a build with REMAT_WITH_MPI=OFF, or a process not started by mpirun) there is one
// rank: init() does nothing, the collectives leave their arguments as they are.
//
// Errors: a mismatch between ranks or a failed MPI call throws remat::Error on the ranks that see
// it; a program should then call abort() so that no other rank waits forever in a collective.
// mpirun ends every rank when one dies.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "remat/tensor.h"

namespace remat::distributed {

// True when this library was built with MPI (REMAT_WITH_MPI).
bool available();
// True when the process was started by an MPI launcher (mpirun / mpiexec), from its environment.
bool launched();
// Starts MPI when launched() (and available(); otherwise throws remat::Error naming the build
// option when launched). Idempotent. MPI errors then throw remat::Error instead of aborting.
void init();
// Ends MPI (collective: every rank calls it). No-op when init() did not start MPI.
void finalize();
// Ends every rank of the job with `code` (MPI_Abort); returns only when MPI is not running.
void abort(int code);
bool initialized();  // MPI was started by init() and not yet finalized
int rank();          // 0 without MPI
int world_size();    // 1 without MPI

enum class Reduction {
  ordered,  // rank-order sum, the same bits on every rank and as sequential accumulation (default)
  native,   // MPI_Allreduce (library order; bitwise as `ordered` for N <= 2)
};
// "ordered" or "native"; anything else is a remat::Error.
Reduction parse_reduction(const std::string& text);
const char* to_string(Reduction mode);

// Sums each tensor (f32 or f64, contiguous, the same shapes and dtypes in the same order on every
// rank) elementwise over the ranks, in place. Undefined tensors are an error.
void all_reduce_sum(const std::vector<Tensor>& tensors, Reduction mode = Reduction::ordered);
// all_reduce_sum of the parameters' .grad(). A parameter without a gradient gets a zero one first
// (another rank may have one). Returns the seconds spent communicating.
double all_reduce_gradients(const std::vector<Tensor>& params, Reduction mode = Reduction::ordered);
// Gradient buckets: the all-reduce overlapped with the backward pass.
//
// The parameters are grouped into buckets of about `bucket_bytes` (one dtype per bucket; a
// parameter larger than that gets a bucket of its own) in *reverse* registration order, since the
// backward reaches the last layers first. ready(p) is told when p's gradient is final (from a
// GradReadyHook, remat/grad_ready.h: under checkpointing that is after its last contribution, which
// may arrive during a region's recomputation, never a partial sum); it copies the gradient into
// its bucket, and a bucket whose every gradient is in starts a non-blocking reduction
// (MPI_Iallreduce for `native`; for `ordered`, the tree order of Exactness above, the same bits as
// all_reduce_sum). With `accumulate` K > 1 each rank holds partial sums of its K micro-batches, one
// per aligned block of them (one when K is a power of two): ready(p, pieces) takes them.
// Buckets start strictly in bucket order on every rank (a later bucket that fills first waits for
// the earlier ones), so the collectives match across ranks. Every ready() call also drives the
// progress of the reductions in flight. finish() starts what is left (a parameter that got no
// gradient on this rank contributes zeros, as in all_reduce_gradients), waits for every bucket
// and writes the sums into the parameters' .grad(). Memory: the bucket buffers, the sum of the
// parameters' bytes per block of partial sums, plus (ordered) about as much again as scratch,
// allocated at construction in the `other` account and kept for reuse.
//
//   distributed::GradientBuckets buckets(model.parameters());
//   {
//     GradReadyHook hook([&](const Tensor& p) { buckets.ready(p); });
//     loss.backward();
//   }
//   distributed::GradientBuckets::Timing t = buckets.finish();  // every .grad() is now the sum
class GradientBuckets {
 public:
  // 1 MiB: on the default GPT of `remat train` (3.3 MB of f32 parameters, 2 ranks, loopback)
  // small enough that the first buckets start early in the backward, large enough that the
  // per-collective latency stays small (bench/run_data_parallel.sh measures other sizes).
  static constexpr size_t kDefaultBucketBytes = size_t{1} << 20;
  GradientBuckets(std::vector<Tensor> params, size_t bucket_bytes = kDefaultBucketBytes,
                  Reduction mode = Reduction::ordered, int64_t accumulate = 1);
  ~GradientBuckets();
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  // p's gradient is final. p must be one of the parameters, reported once per step, with a
  // gradient of its own shape and dtype; anything else is a remat::Error. The first form takes
  // p.grad() as this rank's sum (accumulate 1); the second this rank's partial sums of it, one per
  // block of its micro-batches in order (data_parallel_step hands them).
  void ready(const Tensor& p);
  void ready(const Tensor& p, const std::vector<Tensor>& pieces);
  struct Timing {
    double hidden_seconds = 0;   // reductions in flight while the backward still ran
    double exposed_seconds = 0;  // the wait in finish(), after the backward
    size_t buckets_started_early = 0;  // buckets started by ready(), before finish()
  };
  Timing finish();  // also resets the buckets for the next step
  size_t bucket_count() const;
  size_t bucket_of(size_t param) const;  // the bucket of params()[param]
  size_t buffer_bytes() const;           // what the buckets hold, gathered copies included

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Overwrites each tensor with rank `root`'s values (same layout on every rank).
void broadcast(const std::vector<Tensor>& tensors, int root = 0);
// Every rank's value of `v`, in rank order.
std::vector<double> all_gather(double v);
std::vector<uint64_t> all_gather(uint64_t v);

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
// FNV-1a over the names, dtypes and shapes, in order.
uint64_t layout_hash(const NamedTensors& tensors);
// FNV-1a over the bytes of the values, in order.
uint64_t value_hash(const NamedTensors& tensors);
// Throws remat::Error on every rank when the ranks' `value`s differ, naming `what` and the first
// rank whose value differs from rank 0's.
void check_same(uint64_t value, const std::string& what);
// The start-up check: layouts equal on every rank (else an error before anything is sent), then
// rank 0's values broadcast, then the value checksums compared. With require_equal_values the
// values must already agree before the broadcast (e.g. every rank loaded what should be one file).
void broadcast_parameters(const NamedTensors& params, bool require_equal_values = false);

// Data sharding. A step's global batch is world_size() x per_rank micro-batches, numbered
// step * world * per_rank + rank * per_rank + micro (rank-major: rank r owns a contiguous run).
// With one rank this is step * per_rank + micro: a single process accumulating world micro-batches
// per step runs, as its micro-batch r, what rank r runs with per_rank = 1.
int64_t micro_batch_index(int64_t step, int64_t micro, int64_t per_rank, int rank, int world);
inline int64_t micro_batch_index(int64_t step, int64_t micro, int64_t per_rank) {
  return micro_batch_index(step, micro, per_rank, rank(), world_size());
}
// The contiguous share [begin, end) of `count` items that `rank` of `world` owns (the first
// count % world ranks get one more).
struct Range {
  int64_t begin = 0, end = 0;
};
Range shard(int64_t count, int rank, int world);

// One data-parallel step: gradient accumulation over micro-batches and ranks, one code path.
// A step's global batch is world_size() x `accumulate` micro-batches, numbered as
// micro_batch_index says. data_parallel_step calls `micro(index, last, hand_on)` for each of this
// rank's micro-batches in order, on cleared gradients; it runs that micro-batch's forward and
// backward (seeding its own dropout stream from `index`, say) and returns its loss. Afterwards
// every parameter's .grad() is the mean gradient over the global batch, the same bits on every
// rank and as one process accumulating all N x K micro-batches: each micro-batch's own gradient is
// computed as a lone backward would, they are added in the tree order of Exactness above (with
// `reduction` native, the ranks' sums in MPI's order), then scaled by 1 / (N x K) (nothing is
// scaled when N x K = 1, so a plain step is unchanged). The loss is the micro-batches' mean, added
// in the same order.
//   - With `buckets` (built with the same `accumulate`) and several ranks the reduction overlaps
//     the last micro-batch's backward: a GradReadyHook (remat/grad_ready.h) gives each parameter's
//     partial sums to buckets->ready() the moment its gradient is final.
//   - hand_on(p), one rank only, for a consumer of final gradients inside the last micro-batch's
//     backward (the optimizer inside the backward, nn::FusedOptimizerStep): called from that
//     consumer's hook with a parameter whose gradient is final, it puts in p.grad() the sum over
//     the micro-batches scaled to the mean and returns true (false for a tensor that is not one of
//     the parameters); the step then leaves p's gradient to the consumer (it may drop it).
// A parameter with no gradient in any micro-batch has none afterwards (one rank) or zeros (several);
// one with a gradient in some micro-batches only counts zeros for the others.
//
//   distributed::StepResult r = distributed::data_parallel_step(model.parameters(), step, {.accumulate = 4},
//       [&](int64_t index, bool last, const distributed::HandOnFn&) {
//         Batch b = batch_of(index);
//         return remat::backward([&] { return model.loss(b.inputs, b.targets); }, {policy}).item();
//       });
//   optimizer.step();                                   // r.loss: the global batch's mean loss
using HandOnFn = std::function<bool(const Tensor& param)>;
using MicroBatchFn = std::function<double(int64_t index, bool last, const HandOnFn& hand_on)>;
struct StepOptions {
  int64_t accumulate = 1;  // micro-batches per rank and step, >= 1
  Reduction reduction = Reduction::ordered;
  GradientBuckets* buckets = nullptr;  // built over the same parameters, with the same reduction
};
struct StepResult {
  double loss = 0;                   // the mean of the micro-batches' losses over the global batch
  double communication_seconds = 0;  // in the gradient reduction (0 with one rank)
  double hidden_seconds = 0;         // of which overlapped with the backward (buckets)
};
StepResult data_parallel_step(const std::vector<Tensor>& params, int64_t step, const StepOptions& options,
                              const MicroBatchFn& micro);

// ZeRO stage 1: the rank that keeps parameter i's optimizer state and updates it. The parameters
// are split into contiguous runs balanced by bytes (a parameter goes to the rank whose equal share
// of the bytes holds its midpoint), so each rank holds about 1 / world of the state. An optimizer
// that updates each parameter on its own from the (identical, reduced) gradients computes on the
// owner the same bits every rank would.
std::vector<int> optimizer_owners(const std::vector<Tensor>& params, int world);
// After the owners' updates: every parameter sent from its owner to all ranks.
void broadcast_from_owners(const std::vector<Tensor>& params, const std::vector<int>& owners);

}  // namespace remat::distributed
