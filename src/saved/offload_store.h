// Internal to src/saved/: the offload store, which the hooks of an OffloadScope (offload.cpp) hand
// saved values to, and whose worker writes them to a file and reads them back (offload_store.cpp),
// and the settings of the gates it reads at each pack.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "offload_entry.h"
#include "offload_file.h"
#include "remat/offload.h"
#include "remat/saved_hooks.h"

namespace remat::detail {

// Set on the scope's thread by an OffloadGate and an OffloadPlanNode (offload.cpp).
extern thread_local OffloadGate::Mode offload_gate;
extern thread_local size_t offload_cap;  // on the CPU allocator's saved bytes; 0: none
extern thread_local std::shared_ptr<const OffloadReadPlan> offload_reads;  // the plan's reads ahead
extern thread_local int offload_plan_node;

class OffloadStore : public std::enable_shared_from_this<OffloadStore> {
 public:
  OffloadStore(const OffloadTarget& options, const OffloadFaults& faults);
  ~OffloadStore();

  // ---- saved-value hooks (the scope's thread)
  PackedValue pack(const Tensor& whole);
  void saved_again(OffloadEntry& entry);
  Tensor unpack(const std::shared_ptr<OffloadEntry>& entry);
  void read_back(OffloadEntry& entry);
  void wait_for_writes();
  void reached(int node);
  void prefetch(const std::shared_ptr<OffloadEntry>& entry) { fetch_ahead(entry, false); }
  void fetch_ahead(const std::shared_ptr<OffloadEntry>& entry, bool planned);
  void release_entry(OffloadEntry& entry);
  void close_scope();
  void collect();

 private:
  struct Job {
    bool write;
    off_t offset;
    size_t bytes;
    Tensor buffer;  // what is written, or where it is read into
    std::shared_ptr<JobStatus> status;
  };
  void start_job(const std::shared_ptr<OffloadEntry>& entry, OffloadEntry::State state);
  bool map_resident(OffloadEntry& entry);
  void start_copy_to_host(const std::shared_ptr<OffloadEntry>& entry, const Tensor& whole);
  bool poll_copy(OffloadEntry& entry, bool wait);
  void throw_pending_error();
  void wait_for_room(size_t bytes);
  void wait_below_cap(size_t adding, size_t cap);
  void wait_done(OffloadEntry& entry);
  void work();
  void end_window();
  void stop_yielding();
  std::string where(off_t offset) const;
  OffloadTarget options_;
  OffloadFaults faults_;
  std::shared_ptr<SlotFile> file_;
  const std::thread::id owner_ = std::this_thread::get_id();  // the scope's thread
  const std::chrono::steady_clock::time_point opened_ = std::chrono::steady_clock::now();
  // the scope's thread only
  bool may_yield_ = false, yielding_ = false, started_jobs_ = false;
  bool window_ended_ = false;  // the forward's writing window is over (see end_window)
  size_t in_flight_ = 0;  // the scope's thread only
  size_t plan_cap_ = 0;   // the cap of the last forward's plan (offload_cap at its packs); 0: none
  std::shared_ptr<const OffloadReadPlan> read_plan_;  // its reads ahead (offload_reads at its packs)
  std::map<int, std::vector<std::weak_ptr<OffloadEntry>>> by_node_;  // its written values by node
  int reached_node_ = std::numeric_limits<int>::max();  // the lowest node its backward reached
  bool unpacked_ = false;  // a value was unpacked since the last pack outside a recomputation
  std::mutex mutex_;
  std::condition_variable cv_, done_cv_;
  std::deque<Job> jobs_;
  std::vector<std::weak_ptr<OffloadEntry>> watched_;
  std::vector<std::weak_ptr<OffloadEntry>> copying_;  // copies to host memory in flight (scope's thread)
  size_t written_ = 0;
  std::atomic<double> busy_seconds_{0};
  std::string pending_error_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace remat::detail
