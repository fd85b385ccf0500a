// remat/error.h - the one exception type of the public API.
//
// Every public function that rejects its input throws remat::Error with a message that names the
// operation and the offending shapes or values, e.g.
//   "matmul: inner dimensions differ: a is [2, 3], b is [4, 5]".
// A failed allocation throws remat::OutOfMemory (a remat::Error) with the bytes asked for.
// Internal invariants use REMAT_ASSERT, which also throws (with file:line) so that a broken
// invariant is reported rather than silently corrupting state.
#pragma once

#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace remat {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// An allocation that could not be satisfied. The message names the operation, the shape and the
// bytes asked for; bytes() is that size. The allocator's counters are unchanged when it is thrown.
class OutOfMemory : public Error {
 public:
  OutOfMemory(const std::string& message, size_t bytes) : Error(message), bytes_(bytes) {}
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_;
};

namespace detail {
template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}
[[noreturn]] void assert_failed(const char* condition, const char* file, int line, const std::string& message);
}  // namespace detail

// REMAT_CHECK(condition, parts...): user-facing validation; throws remat::Error(parts...).
#define REMAT_CHECK(condition, ...)                                   \
  do {                                                                \
    if (!(condition)) throw ::remat::Error(::remat::detail::concat(__VA_ARGS__)); \
  } while (0)

// REMAT_ASSERT(condition, parts...): internal invariant; throws remat::Error with file:line.
#define REMAT_ASSERT(condition, ...)                                                         \
  do {                                                                                       \
    if (!(condition))                                                                        \
      ::remat::detail::assert_failed(#condition, __FILE__, __LINE__,                         \
                                     ::remat::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

}  // namespace remat
