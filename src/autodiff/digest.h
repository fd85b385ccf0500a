// Internal: a 64-bit digest of a tensor's values, for checking that a recomputation reproduced
// its first run bit for bit (segment.cpp, scan.cpp, dynamic.cpp). See Note
// [recomputation check] and Note [device digests are read once a backward pass] in digest.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "remat/tensor.h"

namespace remat::detail {

// A digest taken where its value lives: on the host for a value in host memory; for a value on a
// device, an i64 on that device, read only when it is compared (no wait for the device).
struct ValueDigest {
  uint64_t host = 0;
  Tensor on_device;  // defined: the digest, not yet read
};

// The digest of t's values in logical order, taken on t's device, or nullopt where the check does
// not apply (the check is off, or t's device has no digest kernel).
std::optional<ValueDigest> take_digest(const Tensor& t);

// take_digest read to the host at once (for a device value, a wait for the device): what tests
// compare across devices.
std::optional<uint64_t> recompute_digest(const Tensor& t);

// Checks `now` (the recomputed value) against `first` (its first run's digest, nullopt: not
// checkable); a difference is a remat::Error with message(). Host digests are compared at once;
// device digests at the end of the backward pass in progress on this thread (DeferredDigestChecks),
// or at once outside one.
void check_digest(const std::optional<ValueDigest>& first, const Tensor& now, std::function<std::string()> message);

// The error for a recomputed value that differs from its first run: names `what` (a layer or an
// op) and the usual causes.
std::string recompute_mismatch(const std::string& what);

// While one lives on this thread (a backward pass: autodiff/engine.cpp), check_digest puts the
// comparisons of device digests off; finish() reads them, one copy a device, and throws the first
// mismatch (in the order they were asked). Destroyed without finish() (the pass failed), it drops
// what it holds. Nests: each compares only what was put off while it was the innermost.
class DeferredDigestChecks {
 public:
  DeferredDigestChecks();
  ~DeferredDigestChecks();
  DeferredDigestChecks(const DeferredDigestChecks&) = delete;
  DeferredDigestChecks& operator=(const DeferredDigestChecks&) = delete;
  void finish();

 private:
  size_t mark_;
  bool finished_ = false;
};

}  // namespace remat::detail
