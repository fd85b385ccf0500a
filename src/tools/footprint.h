// The memory a GPT run needs, checked before the model is built: an impossible size on the
// command line or in a weight file's metadata is a remat::Error naming where it came from and
// the bytes needed, never an overflow, a std::bad_alloc or an out-of-memory kill.
#pragma once

#include <cstdint>
#include <string>

#include "remat/nn/gpt.h"

namespace remat::tools {

// The parameter count of nn::GPT(config); throws remat::Error naming `source` when it overflows.
uint64_t gpt_parameter_count(const nn::GPTConfig& config, const std::string& source);

enum class Use {
  train,    // weights, gradients, AdamW state, and one step's activations
  profile,  // weights, gradients and one step's activations (remat plan)
  sample,   // weights and one sequence's activations
};

// A lower bound on the bytes `use` needs for `batch` sequences of config.seq tokens: 4 bytes
// per f32 of the weights (plus gradients and AdamW state when training), the attention scores
// [batch, heads, seq, seq] and the logits [batch, seq, vocab] that one step must hold at once,
// and 1 KiB of module objects per block. Throws remat::Error when a count overflows or the
// bound exceeds the machine's physical memory; the message names `source` (e.g.
// "--layers 4 --width 128 ...") and the bytes.
uint64_t check_footprint(const nn::GPTConfig& config, int64_t batch, Use use, const std::string& source);

// The machine's physical memory in bytes.
uint64_t physical_memory_bytes();

}  // namespace remat::tools
