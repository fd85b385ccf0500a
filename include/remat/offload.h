// remat/offload.h - kept values written to files and read back for the backward pass
// (offload:DIR, KEEP+offload:DIR, and a budget plan's offloaded nodes).
//
//   // offload:DIR keeps everything; values of at least 1 MiB (threshold=) go to a file in DIR, and
//   // with ram= no more than 2 MiB of them are in flight (being written) at once
//   Tensor loss = remat::backward([&] { return model.loss(x, y); }, {Policy::parse("offload:" + dir + ",ram=2MiB")});
//
//   // or as a scope of its own, here with a threshold of 64 KiB; the backward pass may begin before
//   // the writes end (it then reads the values still in memory): here it waits for them
//   { remat::OffloadScope scope({dir, 64 << 10}); Tensor l = f(x); scope.wait_for_writes(); l.backward(); }
//
// Contract. While a scope is alive on a thread, every saved value of at least `threshold_bytes`
// is written by a background thread to one nameless file in `directory` and dropped from memory
// once written; smaller ones stay. The backward pass gets each value back (ahead of need where it
// can) with the bits it had: gradients are bitwise equal to save-all's. A value saved on a device
// is copied to host memory first, freeing its device memory, and comes back to its device.
// `ram_bytes` bounds the values in flight (written or read but not yet dropped; the forward waits,
// counted as stall). The file never shows in the directory, on any exit path; it is kept for the
// next scope on the directory until release_offload_files(). An unusable directory or a failed
// write (a full disk) is a remat::Error at the next saved value or read, and nothing is lost: the
// value stays in memory. The allocator counts values in flight and values handed back while the
// backward pass uses them, not the kernel's page cache; mapped pages that a failing disk cannot
// read give SIGBUS, as any mapped file. How: the Notes of src/saved/offload_store.cpp and
// src/saved/offload_file.cpp. Counters: DynamicCounters (remat/counters.h).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace remat {

// Where kept values go when they are not kept in memory: one target, for every policy that
// offloads (remat/policy.h prints it as "offload:DIR,threshold=N[,ram=N]").
struct OffloadTarget {
  std::string directory;
  size_t threshold_bytes = size_t{1} << 20;  // smaller saved values stay in memory
  size_t ram_bytes = 0;                      // bound on values in flight (0: none)
  std::string to_string() const;             // "offload:DIR,threshold=N[,ram=N]"
  bool operator==(const OffloadTarget&) const = default;
};

// For tests: a disk that fills up, or a slow one.
struct OffloadFaults {
  size_t fail_after_bytes = 0;      // writes fail (as on a full disk) once this many bytes were written; 0: never
  double write_delay_seconds = 0;   // each write takes at least this long; 0: as long as it takes
};

// Offloading of saved values for the lifetime of the scope (this thread).
class OffloadScope {
 public:
  explicit OffloadScope(const OffloadTarget& target, const OffloadFaults& faults = {});
  ~OffloadScope();
  OffloadScope(const OffloadScope&) = delete;
  OffloadScope& operator=(const OffloadScope&) = delete;

  // Blocks until every write started so far is on disk (their memory copies are then dropped,
  // and the backward pass reads them back, ahead of need where it can). Rethrows a failed write.
  void wait_for_writes();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Closes the files that ended offload scopes kept for the next ones.
void release_offload_files();

// How fast a directory takes saved values and gives them back, through the page cache and from
// the disk: 32 MiB written in 1 MiB pieces to a nameless file there (a first pass untimed), timed
// into the page cache (not flushed) and read back from it; then written again up to fdatasync, its
// pages dropped, and read back from the disk. Measured once per directory and process; a
// directory that cannot be written is a remat::Error naming it.
struct OffloadBandwidth {
  double write_bytes_per_second = 0;         // to the disk, up to fdatasync
  double read_bytes_per_second = 0;          // from the disk, its pages dropped first
  double cached_write_bytes_per_second = 0;  // into the page cache, not flushed
  double cached_read_bytes_per_second = 0;   // out of it, its pages resident
  double seconds_per_byte() const { return 1.0 / write_bytes_per_second + 1.0 / read_bytes_per_second; }
};
OffloadBandwidth offload_bandwidth(const std::string& directory);

// What a budget plan with an offload target charges a byte it offloads (Note [measuring the
// offload target] in src/saved/offload_file.cpp): the page cache's bandwidths where what a step
// may offload, `step_bytes`, is at most a tenth of `available_bytes` (the host's available
// memory, device_memory of the CPU: the cgroup's room included), so that the kernel keeps the
// pages and does not start writing them back; else the disk's, what a value costs when memory is
// short. dynamic:+offload: charges the disk's (no step's volume is known before it runs).
//   const size_t available = device_memory(parse_device("cpu")).free_bytes;
//   const OffloadPrice price = offload_price(offload_bandwidth(dir), size_t{64} << 20, available);
//   // price.page_cache: 64 MiB is at most a tenth of `available`; price.seconds_per_byte(): a
//   // byte written and read back
struct OffloadPrice {
  double write_bytes_per_second = 0, read_bytes_per_second = 0;
  bool page_cache = false;  // priced at the page cache's bandwidths, else at the disk's
  double write_seconds_per_byte() const { return 1.0 / write_bytes_per_second; }
  double seconds_per_byte() const { return 1.0 / write_bytes_per_second + 1.0 / read_bytes_per_second; }
};
OffloadPrice offload_price(const OffloadBandwidth& bandwidth, size_t step_bytes, size_t available_bytes);

// How fast a device's saved values go to host memory and come back, through the host copies its
// backend offers offloaded values (Backend::host_buffer, copy_to_host_async, copy_from_host_async,
// wait_copy: pinned memory on CUDA): 8 MiB each way, one round trip to warm up, then the best of
// three. A budget plan on that device adds it to each offloaded byte's cost, the copy home to the
// write (a device value is copied home before it is written) and the copy back to the read.
// Measured once per device and process; the CPU's values need no copy (0 seconds a byte).
struct HostCopyBandwidth {
  double to_host_bytes_per_second = 0, from_host_bytes_per_second = 0;  // 0: no copy (the CPU)
  double to_host_seconds_per_byte() const { return to_host_bytes_per_second > 0 ? 1.0 / to_host_bytes_per_second : 0; }
  double from_host_seconds_per_byte() const {
    return from_host_bytes_per_second > 0 ? 1.0 / from_host_bytes_per_second : 0;
  }
};
struct Device;
HostCopyBandwidth host_copy_bandwidth(Device device);

// Whether the offload store's copies run on a core the step computes on: `device` is the CPU and
// the step's threads (num_threads()) take every core the host has. A budget plan then charges
// each transfer in full, none of it hidden behind the compute (Note [measuring the offload
// target]); on a device the host's cores are free for them.
bool offload_copies_share_the_cores(Device device);

namespace detail {
bool offload_running();  // an OffloadScope is alive on this thread
// Which values an offload store writes while a gate is alive on this thread (gates nest): none
// (closed), those of at least the threshold (the default, with no gate), or every one (a node a
// budget plan offloads: the plan counts all of its bytes as gone; call.cpp). A gate may also set
// a cap on the CPU allocator's saved bytes (0: none; the one-argument form keeps the enclosing
// gate's): before the store keeps or writes a value that would lift the saved bytes above it,
// it waits for its writes in flight, oldest first, until the value fits or none is left. A budget
// plan caps its scope at its predicted peak, so that offloaded nodes' writes overlap the nodes
// after them (Note [writes behind a plan's peak] in src/saved/offload_store.cpp).
// The reads ahead of a budget plan: reads_after[m] lists the offloaded top-level nodes (by their
// first stage) whose values the store starts reading back once the backward pass reaches node m
// (the plan's ReadAhead starts; Note [reads ahead of a plan's nodes] in src/saved/offload_store.cpp).
using OffloadReadPlan = std::vector<std::vector<int>>;
class OffloadGate {
 public:
  enum class Mode { closed, threshold, every_value };
  explicit OffloadGate(Mode mode);
  OffloadGate(Mode mode, size_t saved_cap_bytes, std::shared_ptr<const OffloadReadPlan> reads = nullptr);
  ~OffloadGate();
  OffloadGate(const OffloadGate&) = delete;
  OffloadGate& operator=(const OffloadGate&) = delete;

 private:
  Mode previous_;
  size_t previous_cap_;
  std::shared_ptr<const OffloadReadPlan> previous_reads_;
};
// While alive on this thread, the values packed outside a recomputation belong to the plan's
// top-level node whose first stage is `node` (the key of OffloadReadPlan).
class OffloadPlanNode {
 public:
  explicit OffloadPlanNode(int node);
  ~OffloadPlanNode();
  OffloadPlanNode(const OffloadPlanNode&) = delete;
  OffloadPlanNode& operator=(const OffloadPlanNode&) = delete;

 private:
  int previous_;
};
}  // namespace detail

}  // namespace remat
