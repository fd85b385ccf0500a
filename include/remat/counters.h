// remat/counters.h - what the library counts, as plain data every layer can see: ops run and
// re-run (autodiff), saved values evicted, written and read back (the saved-value runtimes of
// remat/dynamic.h and remat/offload.h), and one record per checkpoint region.
//
//   remat::reset_counters();                       // remat/checkpoint.h reads and resets them
//   loss.backward();
//   remat::Counters c = remat::counters();
//   std::cout << c.regions_recomputed << " regions recomputed, "
//             << c.ops.recomputed_flops << " FLOPs re-run, "
//             << c.dynamic.bytes_offloaded << " bytes written to the offload target\n";
//
// The counters are per thread, totals since the last reset_counters(). This header has no code
// and includes nothing of the library, so a layer that writes a counter includes it without
// reaching up to the layer that reports them (docs/design.md, "Layers of the code").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace remat {

namespace autodiff {
// Forward ops and their FLOP estimates (autodiff::op_counters, reset_op_counters).
struct OpCounters {
  uint64_t forward_ops = 0;        // forward op executions (first runs and recomputations)
  double forward_flops = 0;
  uint64_t recomputed_ops = 0;     // of which during recomputation
  double recomputed_flops = 0;
  // ops a recomputation did not run because all it needed of them still lived (a selective
  // policy's kept values, values the program still holds)
  uint64_t cached_ops = 0;
  // ops a recomputation did not run because no value it makes again needs what they produce
  uint64_t skipped_ops = 0;
  double skipped_flops = 0;
  uint64_t backward_nodes = 0;     // nodes executed by the engine
};
}  // namespace autodiff

// The saved-value runtimes: dynamic: (evictions, rematerializations) and offload: (writes and
// reads of the offload target, by offload:DIR, a budget plan's offloaded nodes and dynamic:'s
// evictions to a file).
struct DynamicCounters {
  uint64_t evictions = 0;
  uint64_t rematerializations = 0;
  double remat_flops = 0;
  double remat_seconds = 0;
  size_t smallest_feasible_bytes = 0;  // dynamic: the largest need seen (a lower bound of any feasible budget)
  size_t peak_held_bytes = 0;          // dynamic: the most saved bytes held at once (what the budget bounds)
  uint64_t offloaded = 0;              // offload: values written to the target
  size_t bytes_offloaded = 0;
  size_t bytes_prefetched = 0;         // read back ahead of need
  size_t bytes_read_on_demand = 0;     // read back when the backward pass needed them
  size_t bytes_mapped = 0;             // of those read back, the bytes handed over as mapped file pages
  double stall_seconds = 0;            // waiting for writes (ram bound) or reads
  // A budget plan with an offload target: the most its saved bytes went above the plan's
  // prediction with no write left to wait for (the plan's model of the step did not hold; no test
  // model does this). 0: the model held (Note [writes behind a plan's peak]).
  size_t bytes_over_plan = 0;
};

// One checkpoint region (or, past 4096 rows, every later region of the same label added up).
struct RegionRecord {
  std::string label;                // the layer call's dotted name, a Chain child's name, or a group
  std::string kind;                 // "layer" (one call) or "segment" (a group of calls)
  size_t calls = 0;                 // layer calls inside (a segment groups several)
  size_t boundary_bytes = 0;        // values kept by the region to make its values again (its inputs)
  size_t cached_bytes = 0;          // outputs kept by a selective policy
  size_t recomputed_saved_bytes = 0;  // what a recomputation made again of the values its nodes saved
  double forward_seconds = 0;       // first run
  double recompute_seconds = 0;     // recomputations in backward passes
  double backward_seconds = 0;      // from a recomputation to the release of the last value it made
  uint64_t recomputations = 0;
  // FLOP estimates of the recomputations: run, and skipped because no value made again needs the
  // ops' results (a block's last projection and residual add; docs/checkpointing.md)
  double recomputed_flops = 0;
  double skipped_flops = 0;
};

// Budget policies (remat/budget.h): every step of a plan scope compares the measured peak of saved
// bytes with the budget; a step above it is counted here and warned of once per plan key.
struct BudgetCounters {
  uint64_t steps = 0;          // steps compared with their budget
  uint64_t steps_over = 0;     // of which the measured peak went above the budget
  size_t most_over_bytes = 0;  // the most a step's peak went above its budget
  size_t last_peak_bytes = 0;  // the last step's measured peak of saved bytes
  size_t last_budget_bytes = 0;  // and the budget it was compared with
};

struct Counters {
  autodiff::OpCounters ops;          // forward ops executed / recomputed, FLOP estimates
  uint64_t regions_created = 0;
  uint64_t regions_recomputed = 0;
  uint64_t layer_calls = 0;          // layer calls met (regions or not)
  DynamicCounters dynamic;           // dynamic:BYTES and the offload target
  BudgetCounters budget;             // budget:BYTES and budget:auto
  std::vector<RegionRecord> regions;  // one per region created since the reset; past 4096 rows, a
                                      // region adds to its label's first row (bounded)
};

}  // namespace remat
