// Digests of values for the recomputation check (digest.h).
//
// Note [recomputation check]. remat's contract is bitwise: a recomputed value must be the value
// the first run computed. Whatever recomputes checks it: a region takes a digest of every output
// of every step when the step first runs and compares it with the recomputed output's; dynamic:
// takes a value's digest when it evicts it and compares it with the rematerialized one. A digest
// is 64 bits over the raw bytes in logical order (so -0.0 and 0.0, or two NaNs with different
// payloads, differ, as they do bitwise), one read of the value each time: cheap next to the
// computation that made it. Values not in host memory are not checked (reading them would copy
// them). set_recomputation_check(false) turns the check off; a mismatch it would have caught then
// gives a gradient that differs from save-all's, silently.
#include "digest.h"

#include <atomic>
#include <cstring>
#include <vector>

#include "remat/autodiff.h"

namespace remat {

namespace {
std::atomic<bool> check_enabled{true};
}

void set_recomputation_check(bool enabled) { check_enabled.store(enabled, std::memory_order_relaxed); }
bool recomputation_check() { return check_enabled.load(std::memory_order_relaxed); }

namespace detail {

namespace {

constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;

uint64_t mix(uint64_t h, uint64_t word) {
  h ^= word * kMul;
  h = (h << 29) | (h >> 35);
  return h * 0xBF58476D1CE4E5B9ull;
}

// Four independent lanes over 8-byte words, then the tail byte by byte.
uint64_t hash_bytes(const unsigned char* p, size_t n, uint64_t h) {
  uint64_t lane[4] = {h, h ^ 1, h ^ 2, h ^ 3};
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      lane[k] = mix(lane[k], w);
    }
  uint64_t out = mix(mix(mix(lane[0], lane[1]), lane[2]), lane[3]);
  for (; i < n; ++i) out = mix(out, p[i]);
  return mix(out, n);
}

}  // namespace

std::optional<uint64_t> recompute_digest(const Tensor& t) {
  if (!recomputation_check() || !t.defined() || t.device().type != DeviceType::cpu) return std::nullopt;
  if (t.storage()->pending()) return std::nullopt;  // a value the recomputation skipped: left unread
  const size_t item = dtype_size(t.dtype());
  const auto* base = static_cast<const unsigned char*>(t.storage()->data()) + t.offset() * static_cast<int64_t>(item);
  if (t.is_contiguous()) return hash_bytes(base, t.nbytes(), 0);
  // strided: element by element in logical (row-major) order
  const int rank = t.dim();
  std::vector<int64_t> index(static_cast<size_t>(rank), 0);
  uint64_t h = 0;
  for (int64_t n = 0; n < t.numel(); ++n) {
    int64_t at = 0;
    for (int d = 0; d < rank; ++d) at += index[d] * t.strides()[d];
    h = hash_bytes(base + at * static_cast<int64_t>(item), item, h);
    for (int d = rank - 1; d >= 0; --d) {
      if (++index[d] < t.shape()[d]) break;
      index[d] = 0;
    }
  }
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
