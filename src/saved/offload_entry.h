// Internal to src/saved/: one offloaded value (OffloadEntry) as the offload store (offload_store.cpp)
// keeps it, and the copies of a device value between its device and host memory
// (offload_device.cpp, Note [offload of device values]).
#pragma once

#include <memory>
#include <string>

#include "offload_file.h"
#include "remat/backend.h"
#include "remat/tensor.h"

namespace remat::detail {

class OffloadStore;

// What the worker reports about one job (guarded by the store's mutex); shared by the entry and
// the job, so that the worker never holds an entry (whose end belongs to the scope's thread).
struct JobStatus {
  bool done = false;
  bool ok = false;
};

// A tensor an entry keeps, holding a saved reference on its storage (the allocator then counts
// it as saved, on its device) unless the storage is a parameter's or a gradient's.
struct HeldTensor {
  Tensor value;
  bool counted = false;
  bool defined() const { return value.defined(); }
  void hold(Tensor t) {
    drop();
    value = std::move(t);
    const memory::Tag tag = value.storage()->tag();
    if (tag == memory::Tag::other || tag == memory::Tag::saved) {
      value.storage()->add_saved_reference();
      counted = true;
    }
  }
  void drop() {
    if (counted) value.storage()->remove_saved_reference();
    counted = false;
    value = Tensor();
  }
};

struct OffloadEntry {
  // copying: a device value's copy to host memory is in flight (Note [offload of device values])
  enum class State { memory, copying, writing, on_disk, reading };
  std::shared_ptr<OffloadStore> store;
  DType dtype = DType::f32;
  int64_t numel = 0;
  size_t bytes = 0;
  Device home = kCpu;                // where the value was saved (Note [offload of device values])
  std::shared_ptr<FileRange> range;  // its range of the store's file, if it has one
  // owned by the scope's thread
  State state = State::memory;
  std::shared_ptr<JobStatus> job;  // the job in flight, if any
  HeldTensor ram;                  // the value in host memory (or, kept where it is, on home)
  HeldTensor on_home;              // a device value copied back to its device (or being copied)
  HeldTensor on_device;            // a device value, held while its copy to host memory runs
  CopyTicket copy;                 // that copy, or the copy back to home, in flight
  bool upload_when_read = false;   // prefetched for its device: copy it there once read
  int plan_node = -1;              // the budget plan's top-level node that packed it (OffloadPlanNode)
  ~OffloadEntry();
};

// ---- a device value's copies (offload_device.cpp; the scope's thread)
// Starts copying `whole` (on entry.home) to host memory: entry.ram is the host buffer, entry.on_device
// holds the device value until the copy is done; the state is `copying`.
void start_copy_out(OffloadEntry& entry, const Tensor& whole);
// Whether that copy is over (waiting for it with `wait`). Once it is, the device value is let go;
// if it failed, the value stays on its device (entry.ram, state `memory`) and `error` says why.
bool poll_copy_out(OffloadEntry& entry, bool wait, std::string& error);
// Starts copying entry.ram (host memory) into a fresh tensor on entry.home (entry.on_home).
void start_copy_home(OffloadEntry& entry);
// The device's later work waits for that copy; the host copy is dropped. A failed copy raises
// here, its host copy kept.
void finish_copy_home(OffloadEntry& entry);

}  // namespace remat::detail
