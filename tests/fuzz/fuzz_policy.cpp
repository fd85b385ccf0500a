// libFuzzer target: Policy::parse on arbitrary text. Every input must either parse or throw
// remat::Error; a parsed policy must be valid and survive a round trip through to_string().
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "remat/error.h"
#include "remat/policy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  remat::Policy p;
  try {
    p = remat::Policy::parse(text);
  } catch (const remat::Error&) {
    return 0;
  }
  if (p.kind == remat::Policy::Kind::every_k && p.k < 1) std::abort();
  // a budget is positive, unless budget:auto derives it when planning (then a limit, if any, is)
  if (p.kind == remat::Policy::Kind::budget && !p.budget_auto && p.budget_bytes == 0) std::abort();
  if (p.budget_auto && (p.kind != remat::Policy::Kind::budget || p.budget_bytes != 0)) std::abort();
  if (p.offload_to && (p.offload_to->directory.empty() ||
                       (p.kind == remat::Policy::Kind::dynamic && p.offload_to->ram_bytes != 0)))
    std::abort();
  if (p.kind == remat::Policy::Kind::selective && p.ops.empty()) std::abort();
  remat::Policy again;
  try {
    again = remat::Policy::parse(p.to_string());
  } catch (const remat::Error&) {
    std::abort();  // to_string() of a parsed policy must parse
  }
  if (!(again == p)) std::abort();
  return 0;
}
