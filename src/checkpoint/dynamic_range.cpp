// dynamic_feasible_range (remat/dynamic.h): the budgets dynamic: can run a step under, found by
// running it under ScopedPolicy (this layer's), with the runtime of src/saved/dynamic.cpp.
#include <algorithm>
#include <functional>

#include "remat/dynamic.h"
#include "remat/error.h"
#include "remat/policy.h"
#include "saved/dynamic_internal.h"

namespace remat {

namespace {

// One run of `step` under dynamic:budget: whether it ran, and the need a failed run reported.
struct Trial {
  bool ran = false;
  size_t need = 0;
};

Trial try_budget(const std::function<void()>& step, size_t budget) {
  auto& counters = detail::dynamic_counters();
  counters.smallest_feasible_bytes = 0;
  try {
    ScopedPolicy scope(Policy::dynamic(budget));
    step();
    return {true, counters.smallest_feasible_bytes};
  } catch (const Error&) {
    // the runtime records the need of the op that failed before it throws; any other error is the step's own
    if (counters.smallest_feasible_bytes <= budget) throw;
    return {false, counters.smallest_feasible_bytes};
  }
}

}  // namespace

// Note [feasible range of dynamic:]. Which budgets run a step depends on the eviction order,
// which depends on the budget, so the smallest one is found by running: from the largest need a
// run without evictions meets (a lower bound), each failed run raises the budget to the need it
// failed on, until one runs; then the byte below is run. Runs are identical up to the first need
// above the budget, so this usually ends there (the search of test_module_property and of users
// reading the errors, automated); when the byte below runs too, the smallest budget between the
// last one that failed and it is bisected, so the result always runs and the byte below it fails.
DynamicRange dynamic_feasible_range(const std::function<void()>& step) {
  REMAT_CHECK(!detail::dynamic_running() && !detail::offload_running(),
              "dynamic_feasible_range: a dynamic: or offload: runtime is running on this thread; end it first");
  DynamicRange range;
  auto& counters = detail::dynamic_counters();
  const DynamicCounters before = counters;
  counters.peak_held_bytes = 0;
  const Trial generous = try_budget(step, (size_t{1} << 63) - 1);
  ++range.runs;
  REMAT_ASSERT(generous.ran, "dynamic_feasible_range: the step failed under an unbounded budget");
  range.save_all_peak_bytes = counters.peak_held_bytes;
  size_t budget = std::max<size_t>(1, generous.need), failed = 0;  // 0: no failed budget yet
  for (;;) {
    ++range.runs;
    const Trial t = try_budget(step, budget);
    if (t.ran) break;
    failed = budget;
    budget = std::max(t.need, budget + 1);
  }
  size_t good = budget;
  if (good - 1 > failed) {  // the byte below
    ++range.runs;
    if (try_budget(step, good - 1).ran) good -= 1;
    else failed = good - 1;
  }
  while (good - 1 > failed) {  // bisect (failed, good): `good` runs, `failed` fails (0: none)
    const size_t mid = failed + (good - failed) / 2;
    ++range.runs;
    if (try_budget(step, mid).ran) good = mid;
    else failed = mid;
  }
  range.smallest_budget_bytes = good;
  const size_t peak = counters.peak_held_bytes;
  counters = before;  // the probing runs' evictions and needs are not the program's
  counters.peak_held_bytes = std::max(before.peak_held_bytes, peak);
  detail::measured_smallest_budget() = good;
  return range;
}

}  // namespace remat
