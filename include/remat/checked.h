// remat/checked.h - overflow-checked arithmetic for sizes, counts, strides, offsets and bytes.
//
// Every place where a shape or a user-supplied number becomes an element count, a stride, an
// offset or a byte size goes through these, so an overflow is a remat::Error naming what was
// being computed instead of a wrapped value:
//
//   size_t bytes = remat::checked_mul(size_t(numel), dtype_size(dtype),
//                                     [&] { return "zeros: byte size of shape " + shape_str(shape); });
//   // throws remat::Error("zeros: byte size of shape [...]: 2305843009213693952 * 8 overflows")
//
// `what` is a string or a callable returning one; a callable is called only when the check
// fails, so the checks cost two instructions on the normal path.
#pragma once

#include <concepts>
#include <string>
#include <type_traits>
#include <utility>

#include "remat/error.h"

namespace remat {

namespace detail {
template <class What>
std::string describe_context(What&& what) {
  if constexpr (std::is_invocable_v<What>)
    return std::string(std::forward<What>(what)());
  else
    return std::string(std::forward<What>(what));
}
template <class T, class What>
[[noreturn]] void overflow_error(T a, const char* op, T b, What&& what) {
  throw Error(concat(describe_context(std::forward<What>(what)), ": ", a, " ", op, " ", b, " overflows"));
}
}  // namespace detail

// a * b, or remat::Error "<what>: a * b overflows" when the exact product does not fit in T.
template <std::integral T, class What>
T checked_mul(T a, T b, What&& what) {
  T result;
  if (__builtin_mul_overflow(a, b, &result)) detail::overflow_error(a, "*", b, std::forward<What>(what));
  return result;
}

// a + b, or remat::Error "<what>: a + b overflows" when the exact sum does not fit in T.
template <std::integral T, class What>
T checked_add(T a, T b, What&& what) {
  T result;
  if (__builtin_add_overflow(a, b, &result)) detail::overflow_error(a, "+", b, std::forward<What>(what));
  return result;
}

}  // namespace remat
