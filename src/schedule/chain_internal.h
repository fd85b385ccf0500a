// Internal to the schedule layer's chain files (chain.cpp, chain_costs.cpp).
#pragma once

#include <string>

#include "remat/error.h"

namespace remat::schedule {

// Throws remat::Error "FUNCTION: WHY": an invalid argument of a chain function.
[[noreturn]] inline void invalid(const std::string& function, const std::string& why) {
  throw Error(function + ": " + why);
}

}  // namespace remat::schedule
