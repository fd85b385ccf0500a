#include "footprint.h"

#include <unistd.h>

#include "remat/memory.h"
#include "remat/tensor.h"

namespace remat::tools {

namespace {

struct Overflow {};

uint64_t mul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) throw Overflow{};
  return r;
}
uint64_t add(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) throw Overflow{};
  return r;
}
uint64_t positive(int64_t v) { return v > 0 ? static_cast<uint64_t>(v) : throw Overflow{}; }

std::string bytes_text(uint64_t bytes) {
  return detail::concat(bytes, " bytes (", memory::format_bytes(static_cast<double>(bytes)), ")");
}

uint64_t parameters(const nn::GPTConfig& c) {
  const uint64_t v = positive(c.vocab), l = static_cast<uint64_t>(c.layers), w = positive(c.width),
                 t = positive(c.seq);
  // wte [v, w], wpe [t, w], per block 12 w^2 + 13 w (two LayerNorms, qkv, proj, fc, proj with
  // biases), ln_f 2 w, lm_head [v, w] without bias (none of its own when tied to wte)
  const uint64_t block = add(mul(12, mul(w, w)), mul(13, w));
  return add(add(add(mul(v, w), mul(t, w)), mul(l, block)), add(mul(2, w), c.tie_embeddings ? 0 : mul(v, w)));
}

}  // namespace

uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return UINT64_MAX;  // unknown: no bound
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

uint64_t gpt_parameter_count(const nn::GPTConfig& config, const std::string& source) {
  REMAT_CHECK(config.layers >= 0, source, ": layers ", config.layers, " is negative");
  try {
    return parameters(config);
  } catch (const Overflow&) {
    throw Error(detail::concat(source, ": the model would have more than 2^64 parameters"));
  }
}

uint64_t check_footprint(const nn::GPTConfig& c, int64_t batch, Use use, const std::string& source) {
  const uint64_t p = gpt_parameter_count(c, source);
  constexpr uint64_t kFloat = 4, kBlockObjects = 1024;
  uint64_t weights = 0, scores = 0, logits = 0, total = 0;
  try {
    const uint64_t b = positive(batch), h = positive(c.heads), t = positive(c.seq), v = positive(c.vocab);
    const uint64_t copies = use == Use::train ? 4 : use == Use::profile ? 2 : 1;  // + grad, + AdamW m and v
    weights = mul(mul(p, kFloat), copies);
    scores = mul(mul(mul(mul(b, h), t), t), kFloat);
    logits = mul(mul(mul(b, t), v), kFloat);
    total = add(add(add(weights, scores), logits), mul(static_cast<uint64_t>(c.layers), kBlockObjects));
  } catch (const Overflow&) {
    throw Error(detail::concat(source, ": the model (", p, " parameters) with batch ", batch, " and seq ", c.seq,
                               " would need more than 2^64 bytes"));
  }
  const uint64_t available = physical_memory_bytes();
  if (total > available) {
    const char* state = use == Use::train ? " with gradients and AdamW state" : use == Use::profile ? " with gradients" : "";
    throw Error(detail::concat(source, ": needs at least ", bytes_text(total), " but this machine has ",
                               bytes_text(available), " of memory: ", p, " parameters", state, " take ",
                               bytes_text(weights), ", the attention scores [", batch, ", ", c.heads, ", ", c.seq, ", ",
                               c.seq, "] of one block ", bytes_text(scores), ", the logits [", batch, ", ", c.seq, ", ",
                               c.vocab, "] ", bytes_text(logits)));
  }
  return total;
}

}  // namespace remat::tools
