// Strict numbers for the command line and weight-file metadata: decimal digits only (a leading
// '-' for signed values), no spaces, no '+', no hexadecimal or octal, nothing after the number,
// no overflow; reals must be finite. Every failure is a remat::Error naming `what` (an option
// such as "--width", or "metadata \"layers\" of w.safetensors") and the text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace remat::tools {

// An integer in [min, max].
int64_t parse_int(const std::string& what, std::string_view text, int64_t min, int64_t max);
// Any unsigned 64-bit integer (no sign).
uint64_t parse_uint64(const std::string& what, std::string_view text);
// A finite real number, e.g. "2e-3", "0.5".
double parse_real(const std::string& what, std::string_view text);

}  // namespace remat::tools
