// remat/nn/safetensors.h - weight files in the safetensors format (PyTorch / Hugging Face).
//
//   remat::nn::save_safetensors("w.safetensors", {{"fc.weight", w}, {"fc.bias", b}}, {{"step", "100"}});
//   remat::nn::SafetensorsFile f = remat::nn::load_safetensors("w.safetensors");
//   Tensor w2 = f.tensors.at("fc.weight");          // f.metadata.at("step") == "100"
//
// Layout: 8 bytes little-endian header length N; N bytes of JSON
//   {"__metadata__": {"key": "value", ...},
//    "name": {"dtype": "F32" | "F64" | "I64" | "BF16" | "F16", "shape": [d0, d1, ...],
//             "data_offsets": [begin, end]}, ...}
// padded with spaces to a multiple of 8; then the raw little-endian data, offsets relative to
// its start. Files are written atomically (a temporary file in the same directory, renamed over
// the target), so a reader never sees half a file.
//
// A weight file is untrusted input. Loading validates everything before it allocates tensor
// storage, and throws remat::Error naming the file, the tensor and the problem; a corrupt,
// truncated or hostile file never crashes and returns nothing:
//   - the header is at most 100 MB (as the reference implementation) and fits in the file;
//   - it is JSON nested at most 3 levels deep (an object of objects whose values are strings or
//     flat arrays), checked as the parser reads, before anything deeper is built; a key appears
//     once per object;
//   - "__metadata__", if present, maps strings to strings;
//   - each tensor has a dtype remat reads (F32, F64, I64, BF16 and F16, read as tensors of that
//     dtype, or as f32 tensors, exactly, with LoadOptions::widen_16bit_floats; others, e.g.
//     F8_E4M3 or I32, are errors naming them),
//     a shape of at most kMaxRank sizes, each a plain JSON integer (no sign, fraction or exponent)
//     whose byte count (and stride) fits in 63 bits, and data_offsets [begin, end] with
//     begin <= end, end - begin = the shape's byte count;
//   - the tensors tile the data section exactly: no overlap, no gap, nothing after the last.
// Unknown fields inside a tensor entry are ignored.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "remat/nn/module.h"

namespace remat::nn {

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;  // CPU tensors, memory::Tag::other
  Metadata metadata;
};

// Writes `tensors` (any device, any layout, any dtype: F32, F64, I64, BF16, F16) in the given
// order. Names must be unique, non-empty and not "__metadata__".
void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {});
struct LoadOptions {
  bool widen_16bit_floats = false;  // BF16 and F16 entries as f32 tensors (exact), not as bf16 / f16
};
SafetensorsFile load_safetensors(const std::string& path, const LoadOptions& options = {});
// The same for the bytes of a whole file held in memory (e.g. received over a network); `name`
// stands for the file in error messages.
SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& name = "memory",
                                  const LoadOptions& options = {});

}  // namespace remat::nn
