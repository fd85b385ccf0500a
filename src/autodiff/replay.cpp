// See replay.h.
#include "replay.h"

#include "remat/autodiff.h"

namespace remat::detail {

ReplayScope::ReplayScope(std::optional<RngState> start) : saved_(rng_state()) {
  if (start) set_rng_state(*start);
  autodiff::set_recompute_depth(autodiff::recompute_depth() + 1);
}

ReplayScope::~ReplayScope() {
  autodiff::set_recompute_depth(autodiff::recompute_depth() - 1);
  set_rng_state(saved_);
}

}  // namespace remat::detail
