// libFuzzer target: nn::parse_safetensors on arbitrary bytes. Every input must either load or
// throw remat::Error; anything else (a crash, a sanitizer report, another exception, a leak) is
// a finding. A loaded file must be consistent: its tensors exactly fill the data section.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "remat/nn/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  remat::nn::SafetensorsFile file;
  try {
    file = remat::nn::parse_safetensors(bytes, "fuzz");
  } catch (const remat::Error&) {
    return 0;
  }
  uint64_t header = 0;
  for (int i = 0; i < 8; ++i) header |= static_cast<uint64_t>(data[i]) << (8 * i);
  uint64_t total = 0;
  unsigned checksum = 0;
  for (const auto& [name, t] : file.tensors) {
    if (t.name() != name || !t.is_contiguous()) std::abort();
    total += t.nbytes();
    const auto* p = static_cast<const unsigned char*>(t.nbytes() ? t.raw_data() : nullptr);
    for (size_t i = 0; i < t.nbytes(); ++i) checksum += p[i];  // every byte is readable
  }
  if (8 + header + total != size) std::abort();
  static volatile unsigned sink;
  sink = checksum;
  return 0;
}
