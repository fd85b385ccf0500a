// remat/nn/safetensors.h - weight files in the safetensors format (PyTorch / Hugging Face).
//
//   remat::nn::save_safetensors("w.safetensors", {{"fc.weight", w}, {"fc.bias", b}}, {{"step", "100"}});
//   remat::nn::SafetensorsFile f = remat::nn::load_safetensors("w.safetensors");
//   Tensor w2 = f.tensors.at("fc.weight");          // f.metadata.at("step") == "100"
//
// Layout: 8 bytes little-endian header length N; N bytes of JSON
//   {"__metadata__": {"key": "value", ...},
//    "name": {"dtype": "F32" | "F64" | "I64", "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...}
// padded with spaces to a multiple of 8; then the raw little-endian data, offsets relative to
// its start. Files are written atomically (a temporary file in the same directory, renamed over
// the target), so a reader never sees half a file.
//
// Loading validates everything before it allocates tensor storage: the header length against
// the file size, the JSON, each entry's dtype, shape and offsets (in range, byte count equal to
// shape x dtype size, no overlap, no gap, the data section exactly covered), and throws
// remat::Error naming the file and the problem; a corrupt or truncated file never crashes.
// Other dtypes (BF16, F16, ...) are rejected with an error naming them.
#pragma once

#include <map>
#include <string>

#include "remat/nn/module.h"

namespace remat::nn {

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;  // CPU tensors, memory::Tag::other
  Metadata metadata;
};

// Writes `tensors` (any device, any layout; f32, f64 or i64) in the given order. Names must be
// unique, non-empty and not "__metadata__".
void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {});
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace remat::nn
