// A test-only device backend that proves the device seam without a GPU.
//
// The "emulated" device keeps its tensors in host memory but behaves as an accelerator does: it
// has its own allocator (and so its own counters), the host may not read its memory except
// through an explicit copy (Tensor::to, copy_from_host / copy_to_host; the dispatcher enforces it,
// see remat/tensor.h), and it can be told to lack kernels, which then run through the CPU
// fallback. Its kernels are the CPU backend's, so results on it must equal the CPU's bit for bit.
// It waits as CUDA does with the same backend options (BackendOptions, `backend_options`; async by
// default): a copy to the host, synchronize() and a time reading not yet ready count as host
// synchronisations; with async, time marks become readable at the next wait and an index check
// whose ids' range the host does not know is deferred to the next wait
// (Backend::raise_deferred_errors) and its failure raised there; without it, as CUDA's default
// path, a time mark waits for the device, every index check is read back at once (a wait) and an
// upload waits. Its asynchronous copies
// (copy_to_host_async, copy_from_host_async) run on an emulated copy engine: their bytes move only
// when the copy completes, in issue order, at the second copy_done query of it, at a wait_copy or
// wait_on_device of it or of a later copy, or at any host wait; so a device block dropped too early
// or a value read before its copy was waited for gives wrong bits. `fail_async_copy = n` makes the
// n-th asynchronous copy fail (its bytes are not moved; the error is raised once by a query of it);
// `synchronous_copies = true` makes them the Backend's synchronous defaults, as a backend without
// a copy stream (CUDA without the option copy_stream).
//
//   EmulatedDevice dev;                        // registers emulated:0 for the scope
//   Tensor x = randn({4, 3}, DType::f32, 0.0, 1.0, dev.device);
//   dev.backend.refuse(Kernel::softmax, DType::f32);   // softmax now runs via the CPU fallback
#pragma once

#include <cstring>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "remat/backend.h"
#include "tensor/cpu/cpu_backend.h"
#include "tensor/kernel_common.h"

namespace remat::testing {

class EmulatedBackend final : public cpu::CpuBackend {
 public:
  explicit EmulatedBackend(int index = 0) : allocator_("emulated:" + std::to_string(index)) {}
  DeviceType device_type() const override { return DeviceType::emulated; }
  memory::Allocator& allocator() override { return allocator_; }
  void copy_from_host(const void* host, const Tensor& dst) override {
    ++host_to_device;
    CpuBackend::copy_from_host(host, dst);
    if (!backend_options.async) wait();
  }
  void copy_to_host(const Tensor& src, void* host) override {
    ++device_to_host;
    CpuBackend::copy_to_host(src, host);
    wait();
  }
  void synchronize() override {
    ++synchronizations;
    wait();
  }
  // ---- asynchronous copies (see the top of the file)
  CopyTicket copy_to_host_async(const Tensor& src, const Tensor& host) override {
    if (synchronous_copies) return CpuBackend::copy_to_host_async(src, host);  // copy_to_host: a wait
    ++device_to_host;
    return issue(src, host);
  }
  CopyTicket copy_from_host_async(const Tensor& host, const Tensor& dst) override {
    if (synchronous_copies) return CpuBackend::copy_from_host_async(host, dst);
    ++host_to_device;
    return issue(host, dst);
  }
  bool copy_done(const CopyTicket& ticket) override {
    if (!ticket.pending()) return true;
    Copy& c = *static_cast<Copy*>(ticket.event.get());
    if (!c.done && ++c.queries >= 2) complete_through(c.number);
    raise_failure(c);
    return c.done;
  }
  void wait_copy(const CopyTicket& ticket) override {
    if (!ticket.pending()) return;
    Copy& c = *static_cast<Copy*>(ticket.event.get());
    if (!c.done) {
      ++waits;
      complete_through(c.number);
    }
    raise_failure(c);
  }
  void wait_on_device(const CopyTicket& ticket) override {
    if (!ticket.pending()) return;
    Copy& c = *static_cast<Copy*>(ticket.event.get());
    ++device_waits;
    complete_through(c.number);
    raise_failure(c);
  }
  // ---- time marks: ready once the host has waited for the device after making them; without
  // async, made after a wait (CUDA's default path reads the host clock then)
  TimeMark mark_time() override {
    ++marks;
    if (!backend_options.async) {
      wait();
      return CpuBackend::mark_time();
    }
    TimeMark m = CpuBackend::mark_time();
    m.event = std::make_shared<uint64_t>(waits);
    return m;
  }
  bool time_ready(const TimeMark& mark) override {
    return !mark.event || *static_cast<const uint64_t*>(mark.event.get()) < waits;
  }
  double seconds_between(const TimeMark& from, const TimeMark& to) override {
    if (!time_ready(to)) wait();
    return to.host_seconds - from.host_seconds;
  }
  // ---- deferred index checks
  void raise_deferred_errors() override {
    if (checks_pending_) wait();
  }
  void embedding(const Tensor& table, const Tensor& ids, const Tensor& out) override {
    checked(ids, 0, table.size(0), out, [&] { CpuBackend::embedding(table, ids, out); });
  }
  void embedding_backward(const Tensor& ids, const Tensor& gout, const Tensor& gtable) override {
    checked(ids, 0, gtable.size(0), Tensor(), [&] { CpuBackend::embedding_backward(ids, gout, gtable); });
  }
  void cross_entropy(const Tensor& logits, const Tensor& targets, double smoothing, int64_t ignore, const Tensor& losses,
                     const Tensor& kept, const Tensor& scale) override {
    checked(targets, 0, logits.size(1), kept, [&] {
      CpuBackend::cross_entropy(logits, targets, smoothing, ignore, losses, kept, scale);
    });
  }
  void cross_entropy_backward(const Tensor& logits, const Tensor& kept, const Tensor& targets, const Tensor& gloss,
                              double smoothing, int64_t ignore, const Tensor& glogits) override {
    checked(targets, 0, glogits.size(1), glogits, [&] {
      CpuBackend::cross_entropy_backward(logits, kept, targets, gloss, smoothing, ignore, glogits);
    });
  }
  DeviceActivity activity() const override {
    DeviceActivity a;
    a.host_synchronizations = waits;
    a.copies_to_host = device_to_host;
    a.copies_from_host = host_to_device;
    a.deferred_checks = deferred_checks;
    a.async_copies = async_copies;
    a.device_waits = device_waits;
    return a;
  }
  bool supports(Kernel kernel, DType dtype) const override {
    asked.insert(kernel);
    return refused_.count({kernel, dtype}) == 0;
  }
  // holds_16bit_floats = false (the option sixteen_bit off): the device holds no bf16 or f16
  // tensors (as CUDA's by default)
  bool holds(DType dtype) const override { return backend_options.sixteen_bit || !is_16bit_float(dtype); }
  const BackendOptions& options() const override { return backend_options; }
  BackendOptions backend_options{.async = true, .sixteen_bit = true};  // what it emulates
  bool& holds_16bit_floats = backend_options.sixteen_bit;
  void refuse(Kernel kernel, DType dtype) { refused_.insert({kernel, dtype}); }
  void refuse_all_dtypes(Kernel kernel) {
    for (DType d : {DType::f32, DType::f64, DType::i64, DType::bf16, DType::f16}) refuse(kernel, d);
  }

  uint64_t host_to_device = 0, device_to_host = 0, synchronizations = 0;
  uint64_t marks = 0;            // time marks made
  uint64_t waits = 0;            // host synchronisations of every kind
  uint64_t deferred_checks = 0;  // index checks put off to the next wait
  uint64_t async_copies = 0, device_waits = 0;
  uint64_t fail_async_copy = 0;  // the asynchronous copy (counted from 1) that fails; 0: none
  bool synchronous_copies = false;  // the asynchronous copies are the synchronous defaults (a backend without them)
  size_t copies_in_flight() const { return in_flight_.size(); }
  mutable std::set<Kernel> asked;  // the kernels the dispatcher asked supports() for

 private:
  // The host waits for the device: time marks made before become readable, deferred checks are
  // read, and the first that failed is raised.
  // An asynchronous copy: its ticket's event, and the engine's queue entry holding both tensors.
  struct Copy {
    uint64_t number = 0;
    int queries = 0;
    bool done = false;
    std::string error;  // raised once
  };
  struct Flight {
    std::shared_ptr<Copy> copy;
    Tensor from, to;
  };
  CopyTicket issue(const Tensor& from, const Tensor& to) {
    auto c = std::make_shared<Copy>();
    c->number = ++async_copies;
    in_flight_.push_back({c, from, to});
    return {c};
  }
  static char* bytes_of(const Tensor& t) {
    return static_cast<char*>(t.storage()->data()) + t.offset() * static_cast<int64_t>(dtype_size(t.dtype()));
  }
  // The copy engine finishes every copy up to number `last`, in order.
  void complete_through(uint64_t last) {
    while (!in_flight_.empty() && in_flight_.front().copy->number <= last) {
      Flight f = std::move(in_flight_.front());
      in_flight_.pop_front();
      if (f.copy->number == fail_async_copy) f.copy->error = "emulated: an asynchronous copy failed (injected for a test)";
      else std::memcpy(bytes_of(f.to), bytes_of(f.from), f.from.nbytes());
      f.copy->done = true;
    }
  }
  static void raise_failure(Copy& c) {
    if (c.error.empty()) return;
    const std::string message = std::move(c.error);
    c.error.clear();
    throw Error(message);
  }
  void wait() {
    ++waits;
    if (!in_flight_.empty()) complete_through(in_flight_.back().copy->number);
    checks_pending_ = false;
    if (deferred_error_.empty()) return;
    const std::string message = std::move(deferred_error_);
    deferred_error_.clear();
    throw Error(message);
  }
  // Runs an index kernel. Without async its check is read back at once (a wait; a failure raised
  // now). With it, where the host does not know that `ids` lie in [lo, hi), the check is deferred:
  // a failure leaves `cleared` (an output) zero and is raised at the next wait.
  template <class Run>
  void checked(const Tensor& ids, int64_t lo, int64_t hi, const Tensor& cleared, Run&& run) {
    if (!backend_options.async) {
      wait();
      return run();
    }
    if (kernel::indices_known_within(ids, lo, hi)) return run();
    ++deferred_checks;
    checks_pending_ = true;
    try {
      run();
    } catch (const Error& e) {
      if (deferred_error_.empty()) deferred_error_ = e.what();
      if (cleared.defined()) CpuBackend::fill(cleared, 0.0);
    }
  }

  bool checks_pending_ = false;
  std::string deferred_error_;
  memory::Allocator allocator_;
  std::set<std::pair<Kernel, DType>> refused_;
  std::deque<Flight> in_flight_;  // after allocator_: its tensors go first
};

// Registers an emulated device for the life of the object (tensors on it must be gone first).
struct EmulatedDevice {
  explicit EmulatedDevice(int index = 0) : backend(index), device{DeviceType::emulated, index} {
    register_backend(device, &backend);
  }
  ~EmulatedDevice() {
    register_backend(device, nullptr);
    backend.allocator().empty_cache();
  }
  EmulatedDevice(const EmulatedDevice&) = delete;
  EmulatedDevice& operator=(const EmulatedDevice&) = delete;
  EmulatedBackend backend;
  Device device;
};

// One emulated device registered for the whole test program (never unregistered: tensors made
// on it may outlive any scope, e.g. in static tables).
inline Device emulated_device() {
  static EmulatedDevice* shared = new EmulatedDevice(0);
  return shared->device;
}

}  // namespace remat::testing
