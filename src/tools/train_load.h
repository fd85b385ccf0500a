// `remat train`'s first part: the options checked before anything is read or built, then the
// corpus, the model's architecture (from --load or the flags) and its weights loaded; and the
// validation loss, which the step loop and --eval-only share.
//
//   const CheckedOptions checked = check_options(o, dp);     // a UsageError naming the flag
//   Loaded l = load(o, select_device("train --device", o.device));
//   if (o.eval_only) return evaluate_only(o, l);
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "corpus.h"
#include "data_parallel.h"
#include "remat/nn.h"
#include "remat/remat.h"

namespace remat::tools::training {

struct CheckedOptions {
  Policy policy;
  size_t bucket_bytes = 0;  // --bucket-bytes in bytes
};

CheckedOptions check_options(const TrainOptions& o, const DataParallel& dp);

struct Loaded {
  Device device;  // --device: the model, the batches and the evaluation's
  std::string data_path;
  Corpus corpus;
  nn::GPTConfig config;
  CharTokenizer tokenizer;
  std::vector<int64_t> tokens;  // the corpus, encoded
  TokenSplit split;
  std::shared_ptr<nn::GPT> model;
};

Loaded load(const TrainOptions& o, Device device);
// The dtype of --save's weights (--save-dtype, checked by load).
DType save_dtype(const TrainOptions& o);

// The mean loss of kValidationBatches batches of the validation tokens, in eval mode, without
// gradients; the model is back in train mode afterwards.
inline constexpr int kValidationBatches = 8;
double validation_loss(nn::GPT& model, const std::vector<int64_t>& tokens, int64_t batch, int64_t seq, uint64_t seed,
                       Device device);

// --eval-only: the validation loss of the --load weights; nothing is trained.
int evaluate_only(const TrainOptions& o, Loaded& l);

}  // namespace remat::tools::training
