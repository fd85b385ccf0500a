// Digests of values for the recomputation check (digest.h).
//
// Note [recomputation check]. remat's contract is bitwise: a recomputed value must be the value
// the first run computed. Whatever recomputes checks it: a region takes a digest of every output
// of every step when the step first runs and compares it with the recomputed output's; dynamic:
// takes a value's digest when it evicts it and compares it with the rematerialized one; a loop
// (scan, while_loop) digests each step's state on its forward sweep. A digest is 64 bits over the
// raw bytes in logical order (so -0.0 and 0.0, or two NaNs with different payloads, differ, as they
// do bitwise), one read of the value each time: cheap next to the computation that made it. It is
// the `digest` kernel of the value's device (remat/backend.h; the formula, in 64 KiB blocks chained
// in order, is src/tensor/digest_formula.h), so a value on an accelerator is digested there and
// only the 8 bytes of the digest cross to the host. A device whose backend does not support the
// kernel is not checked (the CPU fallback would copy every value to the host); the CUDA backend's
// kernel is off until a device check has passed it (src/tensor/cuda/digest.cu).
// set_recomputation_check(false) turns the check off; a mismatch it would have caught then gives
// a gradient that differs from save-all's, silently.
#include "digest.h"

#include <atomic>

#include "remat/autodiff.h"
#include "remat/backend.h"

namespace remat {

namespace {
std::atomic<bool> check_enabled{true};
}

void set_recomputation_check(bool enabled) { check_enabled.store(enabled, std::memory_order_relaxed); }
bool recomputation_check() { return check_enabled.load(std::memory_order_relaxed); }

namespace detail {

std::optional<uint64_t> recompute_digest(const Tensor& t) {
  if (!recomputation_check() || !t.defined()) return std::nullopt;
  if (t.storage()->pending()) return std::nullopt;  // a value the recomputation skipped: left unread
  const Device device = t.device();
  Backend& be = backend(device);
  if (device.type != DeviceType::cpu && !be.supports(Kernel::digest, t.dtype())) return std::nullopt;
  Tensor out = Tensor::empty({1}, DType::i64, memory::Tag::other, device);
  be.digest(t, out);
  uint64_t h;
  be.copy_to_host(out, &h);  // a device verb, not an op: a region observing ops sees nothing
  return h;
}

std::string recompute_mismatch(const std::string& what) {
  return concat(what, ": its recomputation differs, bit for bit, from its first run, so the gradient would differ "
                      "from save-all's. Its forward is not a pure function of its inputs; the usual causes: state "
                      "captured outside the tensors (a scalar or a tensor changed between the forward and the backward "
                      "pass), a private random generator (draw from remat's RNG instead), or train()/eval() switched "
                      "between the forward and the backward pass. Keep that state fixed until the backward pass is "
                      "done, or run this part under save-all");
}

}  // namespace detail
}  // namespace remat
