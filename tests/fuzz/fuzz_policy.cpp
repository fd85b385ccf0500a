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
  const remat::Keep& k = p.keep;
  if (k.kind == remat::Keep::Kind::every_k && k.k < 1) std::abort();
  // a budget is positive, unless budget:auto derives it when planning (then a limit, if any, is)
  if (k.kind == remat::Keep::Kind::budget && !k.budget_auto && k.budget_bytes == 0) std::abort();
  if (k.budget_auto && (k.kind != remat::Keep::Kind::budget || k.budget_bytes != 0)) std::abort();
  if (k.kind == remat::Keep::Kind::selective && k.ops.empty()) std::abort();
  // dynamic: keeps save-all's axis and takes no ram=; an offload target has a directory
  const remat::Saved& s = p.saved;
  if (s.dynamic_bytes > 0 && k.kind != remat::Keep::Kind::save_all) std::abort();
  if (s.offload && (s.offload->directory.empty() || (s.dynamic_bytes > 0 && s.offload->ram_bytes != 0))) std::abort();
  try {
    p.validate();
  } catch (const remat::Error&) {
    std::abort();  // a parsed policy is valid
  }
  remat::Policy again;
  try {
    again = remat::Policy::parse(p.to_string());
  } catch (const remat::Error&) {
    std::abort();  // to_string() of a parsed policy must parse
  }
  if (!(again == p)) std::abort();
  return 0;
}
