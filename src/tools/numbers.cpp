#include "numbers.h"

#include <charconv>
#include <cmath>
#include <system_error>

#include "remat/error.h"

namespace remat::tools {

namespace {

// At most 40 characters of `text`, quoted, for messages.
std::string quoted(std::string_view text) {
  std::string s(text.substr(0, 40));
  if (text.size() > 40) s += "...";
  return "\"" + s + "\"";
}

template <class T>
T parse_integer(const std::string& what, std::string_view text, const char* expected) {
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value, 10);
  if (ec == std::errc::result_out_of_range)
    throw Error(detail::concat(what, ": ", quoted(text), " is too large (", expected, ")"));
  if (text.empty() || ec != std::errc() || ptr != end)
    throw Error(detail::concat(what, ": expected ", expected, ", got ", quoted(text)));
  return value;
}

}  // namespace

int64_t parse_int(const std::string& what, std::string_view text, int64_t min, int64_t max) {
  const std::string expected = detail::concat("a whole number from ", min, " to ", max);
  const int64_t value = parse_integer<int64_t>(what, text, expected.c_str());
  if (value < min || value > max) throw Error(detail::concat(what, ": ", value, " is out of range (", expected, ")"));
  return value;
}

uint64_t parse_uint64(const std::string& what, std::string_view text) {
  return parse_integer<uint64_t>(what, text, "a whole number from 0 to 18446744073709551615");
}

double parse_real(const std::string& what, std::string_view text) {
  double value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value, std::chars_format::general);
  if (ec == std::errc::result_out_of_range)
    throw Error(detail::concat(what, ": ", quoted(text), " is out of the range of a double"));
  if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(value))
    throw Error(detail::concat(what, ": expected a finite number, got ", quoted(text)));
  return value;
}

}  // namespace remat::tools
