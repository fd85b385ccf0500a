// libFuzzer target: the --costs reader of `remat plan` (parse_costs) on arbitrary text. Every
// input must either give costs the planner accepts or throw remat::Error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "costs.h"
#include "remat/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  remat::schedule::ChainCosts costs;
  try {
    costs = remat::tools::parse_costs(text, "fuzz.json");
  } catch (const remat::Error&) {
    return 0;
  }
  try {
    costs.validate();  // what parse_costs returns, the planner takes
  } catch (...) {
    std::abort();
  }
  if (costs.num_stages() <= 8) remat::schedule::plan_every_layer(costs);  // and can plan
  return 0;
}
