// libFuzzer target: nn::parse_safetensors on arbitrary bytes. Every input must either load or
// throw remat::Error; anything else (a crash, a sanitizer report, another exception, a leak) is
// a finding. A loaded file must be consistent: its tensors exactly fill the data section (F16 and
// BF16 entries are read as themselves, f16 and bf16, two bytes an element as in the file).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

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
  // The loader accepted the header, so it is valid JSON: each tensor's dtype as the file names it.
  const auto json = nlohmann::json::parse(bytes.substr(8, header));
  uint64_t total = 0;
  unsigned checksum = 0;
  for (const auto& [name, t] : file.tensors) {
    if (t.name() != name || !t.is_contiguous()) std::abort();
    const std::string dtype = json.at(name).at("dtype").get<std::string>();
    if ((dtype == "BF16") != (t.dtype() == remat::DType::bf16) || (dtype == "F16") != (t.dtype() == remat::DType::f16))
      std::abort();
    total += t.nbytes();
    const auto* p = static_cast<const unsigned char*>(t.nbytes() ? t.raw_data() : nullptr);
    for (size_t i = 0; i < t.nbytes(); ++i) checksum += p[i];  // every byte is readable
  }
  if (8 + header + total != size) std::abort();
  static volatile unsigned sink;
  sink = checksum;
  return 0;
}
