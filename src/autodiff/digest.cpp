// Digests of values for the recomputation check (digest.h).
//
// Note [recomputation check]. remat's contract is bitwise: a recomputed value must be the value
// the first run computed. Whatever recomputes checks it: a region takes a digest of every output
// of every step when the step first runs and compares it with the recomputed output's; dynamic:
// takes a value's digest when it evicts it and compares it with the rematerialized one; a loop
// (scan, while_loop) digests each step's state on its forward sweep. A digest is 64 bits over the
// raw bytes in logical order (so -0.0 and 0.0, or two NaNs with different payloads, differ, as they
// do bitwise), one read of the value each time: cheap next to the computation that made it. It is
// the `digest` kernel of the value's device (remat/backend.h; the formula, in 64 KiB blocks chained
// in order, is src/tensor/digest_formula.h), so a value on an accelerator is digested there and
// only the 8 bytes of the digest cross to the host. A device whose backend does not support the
// kernel is not checked (the CPU fallback would copy every value to the host); the CUDA backend's
// kernel is off until a device check has passed it (src/tensor/cuda/digest.cu).
// set_recomputation_check(false) turns the check off; a mismatch it would have caught then gives
// a gradient that differs from save-all's, silently.
//
// Note [device digests are read once a backward pass]. Reading a digest back from a device is a
// wait for the device; one per value would be hundreds a step. A device value's digest therefore
// stays on the device (an i64 there) from the first run on, and while a backward pass runs
// (DeferredDigestChecks in engine.cpp) the comparisons of its recomputations are put off: at the
// end of the pass, before any gradient is committed, the digests are gathered into one buffer a
// device by device copies and read with one copy, and the first mismatch, in the order the
// comparisons were asked, is raised. A pass that recomputed device values so makes one wait more
// than one that did not; an error still leaves every .grad() as it was (gradients committed at a
// GradReadyHook's final point, which opt out of the rollback, are the exception, as for the
// deferred index checks of remat/backend.h). Host values are compared at once.
#include "digest.h"

#include <atomic>
#include <iterator>
#include <vector>

#include "remat/autodiff.h"
#include "remat/backend.h"
#include "tensor/allocate.h"

namespace remat {

namespace {
std::atomic<bool> check_enabled{true};
}

void set_recomputation_check(bool enabled) { check_enabled.store(enabled, std::memory_order_relaxed); }
bool recomputation_check() { return check_enabled.load(std::memory_order_relaxed); }

namespace detail {

namespace {

// A comparison put off to the end of the backward pass (DeferredDigestChecks).
struct Pending {
  ValueDigest first, now;
  std::function<std::string()> message;
};

struct Deferred {
  std::vector<Pending> pending;
  int scopes = 0;
};

Deferred& deferred() {
  thread_local Deferred d;
  return d;
}

// A 1-element i64 on `device`, for a digest.
Tensor digest_slot(Device device) { return Tensor::empty({1}, DType::i64, memory::Tag::other, device); }

// Element i of the contiguous i64 `buffer`, as a view made without an op.
Tensor element(const Tensor& buffer, int64_t i) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = buffer.storage();
  impl->offset = buffer.impl().offset + i;
  impl->shape = {1};
  impl->strides = {1};
  impl->dtype = DType::i64;
  return Tensor(std::move(impl));
}

uint64_t read_now(const ValueDigest& d) {
  if (!d.on_device.defined()) return d.host;
  uint64_t h = 0;
  backend(d.on_device.device()).copy_to_host(d.on_device, &h);
  return h;
}

// The device digests of `entries` (all on `device`), read with one copy: [first, now] pairs.
std::vector<uint64_t> read_pairs(Device device, const std::vector<const Pending*>& entries) {
  Backend& be = backend(device);
  Tensor all = Tensor::empty({static_cast<int64_t>(2 * entries.size())}, DType::i64, memory::Tag::other, device);
  std::vector<uint64_t> host(2 * entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const ValueDigest* pair[2] = {&entries[i]->first, &entries[i]->now};
    for (size_t k = 0; k < 2; ++k) {
      if (pair[k]->on_device.defined())
        be.copy(pair[k]->on_device, element(all, static_cast<int64_t>(2 * i + k)));
      else
        host[2 * i + k] = pair[k]->host;
    }
  }
  std::vector<uint64_t> read(2 * entries.size());
  be.copy_to_host(all, read.data());
  for (size_t i = 0; i < entries.size(); ++i)
    for (size_t k = 0; k < 2; ++k)
      if (!(k == 0 ? entries[i]->first : entries[i]->now).on_device.defined()) read[2 * i + k] = host[2 * i + k];
  return read;
}

}  // namespace

std::optional<ValueDigest> take_digest(const Tensor& t) {
  if (!recomputation_check() || !t.defined()) return std::nullopt;
  const Device device = t.device();
  Backend& be = backend(device);
  if (device.type == DeviceType::cpu) {
    Tensor out = digest_slot(device);
    be.digest(t, out);  // a kernel, not an op: a region observing ops sees nothing
    ValueDigest d;
    d.host = static_cast<uint64_t>(out.data<int64_t>()[0]);
    return d;
  }
  if (!be.supports(Kernel::digest, t.dtype())) return std::nullopt;
  ValueDigest d;
  d.on_device = digest_slot(device);
  be.digest(t, d.on_device);  // stays on the device until compared
  return d;
}

std::optional<uint64_t> recompute_digest(const Tensor& t) {
  const std::optional<ValueDigest> d = take_digest(t);
  if (!d) return std::nullopt;
  return read_now(*d);
}

void check_digest(const std::optional<ValueDigest>& first, const Tensor& now, std::function<std::string()> message) {
  if (!first) return;
  const std::optional<ValueDigest> again = take_digest(now);
  if (!again) return;
  const bool on_device = first->on_device.defined() || again->on_device.defined();
  if (on_device && deferred().scopes > 0) {
    deferred().pending.push_back({*first, *again, std::move(message)});
    return;
  }
  if (read_now(*first) != read_now(*again)) throw Error(message());
}

std::string recompute_mismatch(const std::string& what) {
  return concat(what, ": its recomputation differs, bit for bit, from its first run, so the gradient would differ "
                      "from save-all's. What ran again (an op's forward: a custom op's, or a loop's step function) is "
                      "not a pure function of its inputs; the usual causes: state captured outside the tensors (a "
                      "scalar or a tensor changed between the forward and the backward pass), a private random "
                      "generator (draw from remat's RNG instead), or, for a loop's step function, train()/eval() "
                      "switched between the forward and the backward pass. Keep that state fixed until the backward "
                      "pass is done, or run this part under save-all");
}

DeferredDigestChecks::DeferredDigestChecks() : mark_(deferred().pending.size()) { ++deferred().scopes; }

DeferredDigestChecks::~DeferredDigestChecks() {
  Deferred& d = deferred();
  --d.scopes;
  if (!finished_ && d.pending.size() > mark_) d.pending.resize(mark_);
}

// Note [device digests are read once a backward pass].
void DeferredDigestChecks::finish() {
  finished_ = true;
  Deferred& d = deferred();
  if (d.pending.size() <= mark_) return;
  std::vector<Pending> mine(std::make_move_iterator(d.pending.begin() + static_cast<std::ptrdiff_t>(mark_)),
                            std::make_move_iterator(d.pending.end()));
  d.pending.resize(mark_);
  std::vector<Device> devices;
  std::vector<std::vector<const Pending*>> by_device;
  std::vector<size_t> first_mismatch_of;
  for (const Pending& p : mine) {
    const Device device = (p.first.on_device.defined() ? p.first.on_device : p.now.on_device).device();
    size_t k = 0;
    while (k < devices.size() && !(devices[k] == device)) ++k;
    if (k == devices.size()) {
      devices.push_back(device);
      by_device.emplace_back();
    }
    by_device[k].push_back(&p);
  }
  // the first mismatch in the order the comparisons were asked
  const Pending* failed = nullptr;
  for (size_t k = 0; k < devices.size(); ++k) {
    const std::vector<uint64_t> read = read_pairs(devices[k], by_device[k]);
    for (size_t i = 0; i < by_device[k].size(); ++i)
      if (read[2 * i] != read[2 * i + 1] && (failed == nullptr || by_device[k][i] < failed)) failed = by_device[k][i];
  }
  if (failed != nullptr) throw Error(failed->message());
}

}  // namespace detail
}  // namespace remat
