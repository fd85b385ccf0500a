// Digests of values for the recomputation check (digest.h).
//
// Note [recomputation check]. remat's contract is bitwise: a recomputed value must be the value
// the first run computed. Whatever recomputes checks it: a region takes a digest of every output
// of every step when the step first runs and compares it with the recomputed output's; dynamic:
// takes a value's digest when it evicts it and compares it with the rematerialized one. A digest
// is 64 bits over the raw bytes in logical order (so -0.0 and 0.0, or two NaNs with different
// payloads, differ, as they do bitwise), one read of the value each time: cheap next to the
// computation that made it. The byte stream is cut into 64 KiB blocks, digested in parallel (a
// strided value's block gathered into a 64 KiB scratch first) and chained in order, so a value's
// digest is the same whatever its layout and however many threads run. Values not in host memory
// are not checked (reading them would copy them). set_recomputation_check(false) turns the check
// off; a mismatch it would have caught then gives a gradient that differs from save-all's,
// silently.
#include "digest.h"

#include <algorithm>
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

// Eight independent lanes over 8-byte words (each step a bijection of the word: xor, odd multiply,
// rotate, so a changed word always changes its lane), then the lanes and the tail mixed fully.
uint64_t hash_bytes(const unsigned char* p, size_t n, uint64_t h) {
  constexpr int kLanes = 8;
  uint64_t lane[kLanes];
  for (int k = 0; k < kLanes; ++k) lane[k] = h ^ static_cast<uint64_t>(k);
  size_t i = 0;
  for (; i + 8 * kLanes <= n; i += 8 * kLanes)
    for (int k = 0; k < kLanes; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      const uint64_t x = (lane[k] ^ w) * kMul;
      lane[k] = (x << 31) | (x >> 33);
    }
  uint64_t out = lane[0];
  for (int k = 1; k < kLanes; ++k) out = mix(out, lane[k]);
  for (; i < n; ++i) out = mix(out, p[i]);
  return mix(out, n);
}

// Values are digested in blocks of kBlock bytes of their logical byte stream, each block on its
// own (blocks run in parallel), and the block digests chained in order: the digest depends on the
// values only, never on the layout or the thread count.
constexpr int64_t kBlock = 64 * 1024;

// Copies the logical bytes [first, first + count) elements of a strided tensor into out.
void gather(const Tensor& t, const unsigned char* base, int64_t first, int64_t count, unsigned char* out) {
  const int rank = t.dim();
  const int64_t item = static_cast<int64_t>(dtype_size(t.dtype()));
  std::vector<int64_t> index(static_cast<size_t>(rank), 0);
  for (int d = rank - 1; d >= 0; --d) {
    index[d] = first % t.shape()[d];
    first /= t.shape()[d];
  }
  const int64_t inner = rank == 0 ? 1 : t.shape()[rank - 1];
  const int64_t inner_stride = rank == 0 ? 0 : t.strides()[rank - 1] * item;
  int64_t done = 0;
  while (done < count) {
    int64_t at = 0;
    for (int d = 0; d < rank; ++d) at += index[d] * t.strides()[d];
    const unsigned char* src = base + at * item;
    const int64_t run = std::min(count - done, rank == 0 ? 1 : inner - index[rank - 1]);
    for (int64_t j = 0; j < run; ++j) std::memcpy(out + (done + j) * item, src + j * inner_stride, item);
    done += run;
    if (rank == 0) break;
    index[rank - 1] += run;
    for (int d = rank - 1; d > 0 && index[d] >= t.shape()[d]; --d) {
      index[d] = 0;
      ++index[d - 1];
    }
  }
}

}  // namespace

std::optional<uint64_t> recompute_digest(const Tensor& t) {
  if (!recomputation_check() || !t.defined() || t.device().type != DeviceType::cpu) return std::nullopt;
  if (t.storage()->pending()) return std::nullopt;  // a value the recomputation skipped: left unread
  const int64_t item = static_cast<int64_t>(dtype_size(t.dtype()));
  const auto* base = static_cast<const unsigned char*>(t.storage()->data()) + t.offset() * item;
  const bool contiguous = t.is_contiguous();
  const int64_t bytes = t.numel() * item;
  const int64_t blocks = (bytes + kBlock - 1) / kBlock;  // kBlock is a multiple of every item size
  std::vector<uint64_t> digests(static_cast<size_t>(blocks));
  auto digest_block = [&](int64_t b, unsigned char* scratch) {
    const int64_t begin = b * kBlock, n = std::min(kBlock, bytes - begin);
    const unsigned char* p = base + begin;
    if (!contiguous) {
      gather(t, base, begin / item, n / item, scratch);
      p = scratch;
    }
    digests[static_cast<size_t>(b)] = hash_bytes(p, static_cast<size_t>(n), static_cast<uint64_t>(b));
  };
#pragma omp parallel if (blocks >= 4)
  {
    std::vector<unsigned char> scratch(contiguous ? 0 : static_cast<size_t>(kBlock));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) digest_block(b, scratch.data());
  }
  uint64_t h = mix(0, static_cast<uint64_t>(bytes));
  for (uint64_t d : digests) h = mix(h, d);
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
