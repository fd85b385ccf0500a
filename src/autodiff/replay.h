// Internal: re-running forward code in a backward pass (checkpoint regions, scan turns).
#pragma once

#include <optional>

#include "remat/random.h"

namespace remat::detail {

// While it lives: the thread's recompute depth is one more (so ops count as recomputed and
// is_recomputing() holds), and the RNG state is `start` when given. Both are restored on every exit
// path, so a replay that draws random numbers leaves the caller's generator where it was.
class ReplayScope {
 public:
  explicit ReplayScope(std::optional<RngState> start = std::nullopt);
  ~ReplayScope();
  ReplayScope(const ReplayScope&) = delete;
  ReplayScope& operator=(const ReplayScope&) = delete;

 private:
  RngState saved_;
};

}  // namespace remat::detail
