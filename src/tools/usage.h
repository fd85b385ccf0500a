// Usage errors of the `remat` command line (exit code 2, against 1 for errors while running) and
// the "did you mean" suggestion for a mistyped option or subcommand.
#pragma once

#include <string>
#include <vector>

#include "remat/error.h"

namespace remat::tools {

inline constexpr int kExitRuntimeError = 1;
inline constexpr int kExitUsageError = 2;

// A bad command line: an unknown option, a value that does not parse or is out of range, options
// that cannot be combined. The message names the option.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& message) : Error(message) {}
};

#define REMAT_USAGE_CHECK(condition, ...)                                                      \
  do {                                                                                         \
    if (!(condition)) throw ::remat::tools::UsageError(::remat::detail::concat(__VA_ARGS__)); \
  } while (0)

// A byte count such as "64MiB" (memory::parse_bytes); a bad one is a UsageError "WHAT: reason".
size_t parse_bytes_option(const std::string& what, const std::string& text);

// Edit distance (insertions, deletions, substitutions, adjacent transpositions).
size_t edit_distance(const std::string& a, const std::string& b);
// The candidate closest to `word`, if it is close enough to be a likely typo (at most 1 edit for
// words up to 4 characters, 2 up to 8, else 3); empty otherwise.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace remat::tools
