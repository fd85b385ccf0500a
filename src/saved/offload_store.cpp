// The offload store (policy offload:DIR): the saved-value hooks of an OffloadScope (offload.cpp)
// hand values to it, and its background thread writes them to a file and reads them back (the
// file and its ranges: offload_file.cpp). The contract is in include/remat/offload.h.
//
// Note [offload threads]. Everything that touches tensor accounting (allocating read buffers, saved
// references, dropping the in-memory copy of a written value) happens on the thread that owns the
// scope; the worker only copies bytes between host buffers and the file. A job holds the buffer it
// works on, so a value whose SavedTensors are gone while its job runs is simply discarded. A value
// smaller than the threshold stays where it is (unless an OffloadGate wants every value), and so
// does one saved while a checkpoint region is re-run in the backward pass (under KEEP+offload:,
// whose regions keep their boundaries in the file: the region's own backward reads the re-run's
// values right away, and writing them would only add a round trip to disk), one saved behind a
// closed OffloadGate (a budget plan writes only the nodes it chose to offload), and a parameter's
// or gradient's storage (the model holds it, so writing it would free nothing); any other is
// written, and its memory copy dropped once the write is done (collect()). The backward pass gets
// it back from the file's mapped pages when they are resident, else from a read job started a few
// nodes ahead by prefetch(), else from a read of its own (Note [offload files]).
#include "offload_store.h"

#include <algorithm>
#include <filesystem>

#include "dynamic_internal.h"
#include "remat/autodiff.h"
#include "remat/backend.h"
#include "remat/memory.h"
#include "tensor/allocate.h"

namespace remat::detail {

namespace {

Tensor fresh_like(DType dtype, int64_t numel) { return Tensor::empty({numel}, dtype); }

}  // namespace

OffloadStore::OffloadStore(const OffloadTarget& options, const OffloadFaults& faults) : options_(options), faults_(faults) {
  namespace fs = std::filesystem;
  std::error_code ec;
  REMAT_CHECK(fs::is_directory(options.directory, ec), "policy offload: '", options.directory,
              "' is not a directory");
  file_ = take_file(options.directory);
  may_yield_ = detail::no_spare_core() && file_->choose_yield();
  worker_ = std::thread([this] { work(); });
}

OffloadStore::~OffloadStore() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  return_file(std::move(file_));
}

PackedValue OffloadStore::pack(const Tensor& whole) {
  collect();
  throw_pending_error();
  auto entry = std::make_shared<OffloadEntry>();
  entry->store = shared_from_this();
  entry->dtype = whole.dtype();
  entry->numel = whole.numel();
  entry->bytes = whole.nbytes();
  entry->home = whole.device();
  // small (unless the gate wants every value), saved by a region's re-run in the backward pass
  // (read at once), behind a closed gate (a budget plan keeps it in memory), or a parameter's or
  // gradient's (writing it would free nothing: the model holds it): stays where it is
  const memory::Tag tag = whole.storage()->tag();
  const OffloadGate::Mode gate = offload_gate;
  const bool small = entry->bytes < options_.threshold_bytes && gate != OffloadGate::Mode::every_value;
  const bool recomputing = autodiff::recompute_depth() > 0;
  if (!recomputing) {  // the forward's plan, if any, caps its backward's read-ahead (to its end)
    if (unpacked_) {  // a new forward
      plan_cap_ = 0;
      read_plan_.reset();
      by_node_.clear();
      reached_node_ = std::numeric_limits<int>::max();
    }
    unpacked_ = false;
    if (offload_cap > 0) plan_cap_ = offload_cap;
    if (offload_reads) read_plan_ = offload_reads;
    entry->plan_node = offload_plan_node;
  }
  if (whole.device().type == DeviceType::cpu)  // a re-run's values under the cap its forward set
    wait_below_cap(tag == memory::Tag::saved ? 0 : entry->bytes, recomputing ? plan_cap_ : offload_cap);
  if (small || recomputing || gate == OffloadGate::Mode::closed || tag == memory::Tag::parameter ||
      tag == memory::Tag::gradient) {
    entry->ram.hold(whole);
    return entry;
  }
  wait_for_room(entry->bytes);
  entry->range = std::make_shared<FileRange>(file_, entry->bytes);
  if (read_plan_ && entry->plan_node >= 0) by_node_[entry->plan_node].push_back(entry);
  if (whole.device().type != DeviceType::cpu) {
    start_copy_to_host(entry, whole);
    return entry;
  }
  entry->ram.hold(whole);
  start_job(entry, OffloadEntry::State::writing);
  return entry;
}

// A later node of a planned forward saves a value an earlier one packed (a region keeps as its
// input the output the stage before saved): the value goes with the later node, which the
// backward reaches first, so the reads planned at the earlier one do not start before its re-run.
void OffloadStore::saved_again(OffloadEntry& entry) {
  if (autodiff::recompute_depth() > 0 || entry.plan_node < 0) return;
  entry.plan_node = std::max(entry.plan_node, offload_plan_node);
}

Tensor OffloadStore::unpack(const std::shared_ptr<OffloadEntry>& entry) {
  end_window();  // the backward pass has begun (once; see the yielding rule below)
  unpacked_ = true;
  collect();
  if (entry->plan_node >= 0) reached(entry->plan_node);
  if (entry->state == OffloadEntry::State::copying) return entry->on_device.value;  // still on its device
  if (!entry->on_home.defined()) {
    if (entry->state == OffloadEntry::State::reading) wait_done(*entry);
    if (!entry->ram.defined() && entry->home.type == DeviceType::cpu) wait_below_cap(entry->bytes, plan_cap_);
    throw_pending_error();
    read_back(*entry);
    if (entry->ram.value.device() == entry->home) return entry->ram.value;
    start_copy_home(*entry);
  }
  finish_copy_home(*entry);
  return entry->on_home.value;
}

// Puts the value in entry.ram: as it is, from the file's mapped pages, or read now.
void OffloadStore::read_back(OffloadEntry& entry) {
  if (entry.ram.defined()) return;
  auto& c = dynamic_counters();
  if (map_resident(entry)) {  // not prefetched, but its pages are in memory
    c.bytes_read_on_demand += entry.bytes;
    return;
  }
  // on disk and not prefetched: read now
  const auto start = std::chrono::steady_clock::now();
  Tensor buffer = fresh_like(entry.dtype, entry.numel);
  std::string error;
  const bool ok =
      read_all(file_->fd(), static_cast<char*>(buffer.raw_data()), entry.bytes, entry.range->offset, error);
  REMAT_CHECK(ok, "policy offload: reading a saved value of ", memory::format_bytes(static_cast<double>(entry.bytes)),
              " back from ", where(entry.range->offset), " failed: ", error);
  c.bytes_read_on_demand += entry.bytes;
  c.stall_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  entry.ram.hold(buffer);
}

void OffloadStore::wait_for_writes() {
  std::vector<std::shared_ptr<OffloadEntry>> writing;
  for (const auto& e : copying_)
    if (auto entry = e.lock(); entry && entry->state == OffloadEntry::State::copying) poll_copy(*entry, true);
  collect();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& weak : watched_)
      if (auto e = weak.lock(); e && e->job && e->state == OffloadEntry::State::writing) writing.push_back(e);
  }
  for (const auto& e : writing) wait_done(*e);
  collect();
  throw_pending_error();
}

// Note [reads ahead of a plan's nodes]. Under a budget plan's cap the engine's read-ahead (a few
// nodes early) is off (Note [writes behind a plan's peak]); the plan says instead, for each
// offloaded node, from which of the nodes before it in the backward its values may be read
// (schedule::ReadAhead: from there on its bytes fit within the predicted peak). Each value
// packed in a planned forward carries its node (OffloadPlanNode); the first unpack of a node's
// value is the backward reaching that node, and the reads the plan starts there begin, in
// order, on the one worker (or the values are mapped, where their pages are resident). A read
// that would lift the saved bytes above the cap at that moment waits for its node instead.
void OffloadStore::reached(int node) {
  if (!read_plan_ || node >= reached_node_) return;
  const int from = std::min(reached_node_ - 1, static_cast<int>(read_plan_->size()) - 1);
  reached_node_ = node;
  for (int m = from; m >= node; --m)
    for (int offloaded : (*read_plan_)[static_cast<size_t>(m)]) {
      auto it = by_node_.find(offloaded);
      if (it == by_node_.end()) continue;
      for (const auto& weak : it->second)
        if (auto e = weak.lock()) fetch_ahead(e, true);
      by_node_.erase(it);
    }
}

// planned: a read the plan starts (Note [reads ahead of a plan's nodes]); else the engine's.
void OffloadStore::fetch_ahead(const std::shared_ptr<OffloadEntry>& entry, bool planned) {
  collect();
  if (entry->on_home.defined() || entry->state == OffloadEntry::State::copying) return;
  const bool for_device = entry->home.type != DeviceType::cpu;
  if (entry->ram.defined()) {  // in host memory: a device value goes on to its device
    if (for_device && entry->state != OffloadEntry::State::reading && entry->ram.value.device() != entry->home)
      start_copy_home(*entry);
    return;
  }
  if (entry->state != OffloadEntry::State::on_disk) return;
  if (plan_cap_ > 0 && !for_device) {  // Note [writes behind a plan's peak]
    if (!planned || memory::live_bytes(memory::Tag::saved) + entry->bytes > plan_cap_) return;
  }
  if (map_resident(*entry)) {
    dynamic_counters().bytes_prefetched += entry->bytes;
    if (for_device) start_copy_home(*entry);
    return;
  }
  if (options_.ram_bytes > 0 && in_flight_ + entry->bytes > options_.ram_bytes) return;  // read on demand
  entry->ram.hold(fresh_like(entry->dtype, entry->numel));
  entry->upload_when_read = for_device;
  start_job(entry, OffloadEntry::State::reading);
  dynamic_counters().bytes_prefetched += entry->bytes;
}

void OffloadStore::release_entry(OffloadEntry& entry) {
  if (entry.state == OffloadEntry::State::copying) in_flight_ -= entry.bytes;
  entry.ram.drop();
  entry.on_home.drop();
  entry.on_device.drop();
  entry.copy = {};  // the backend keeps a copy's tensors until it is done
  if (entry.job) {
    in_flight_ -= entry.bytes;
    entry.job.reset();
  }
  // The range goes back to the file once no tensor over its mapped pages is left either. A job
  // still on it finishes before any job of the next value given it (one worker, in order).
  entry.range.reset();
}

// The scope ends: its thread stops yielding a core, and no later job makes it yield again.
void OffloadStore::close_scope() {
  collect();
  end_window();
  stop_yielding();
  may_yield_ = false;
}

// Notes finished copies to host memory (which start their writes) and finished jobs: drops the
// memory copies of written values.
void OffloadStore::collect() {
  for (auto it = copying_.begin(); it != copying_.end();) {
    std::shared_ptr<OffloadEntry> e = it->lock();
    if (e && e->state == OffloadEntry::State::copying && !poll_copy(*e, false)) {
      ++it;
      continue;
    }
    it = copying_.erase(it);
  }
  std::vector<std::pair<std::shared_ptr<OffloadEntry>, bool>> finished;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = watched_.begin(); it != watched_.end();) {
      std::shared_ptr<OffloadEntry> e = it->lock();
      if (!e || !e->job) {
        it = watched_.erase(it);
        continue;
      }
      if (e->job->done) {
        finished.emplace_back(e, e->job->ok);
        it = watched_.erase(it);
        continue;
      }
      ++it;
    }
  }
  for (auto& [e, ok] : finished) {
    in_flight_ -= e->bytes;
    e->job.reset();
    if (e->state == OffloadEntry::State::writing) {
      if (!ok) {
        e->state = OffloadEntry::State::memory;  // the write failed: it stays in memory, nothing lost
        continue;
      }
      e->state = OffloadEntry::State::on_disk;
      e->ram.drop();
      ++dynamic_counters().offloaded;
      dynamic_counters().bytes_offloaded += e->bytes;
    } else if (e->state == OffloadEntry::State::reading) {
      e->state = OffloadEntry::State::on_disk;  // and in memory again (ram holds it)
      if (!ok) e->ram.drop();  // read again on demand, with its error
      if (ok && e->upload_when_read && !e->on_home.defined()) start_copy_home(*e);
      e->upload_when_read = false;
    }
  }
}

void OffloadStore::start_job(const std::shared_ptr<OffloadEntry>& entry, OffloadEntry::State state) {
  entry->state = state;
  entry->job = std::make_shared<JobStatus>();
  in_flight_ += entry->bytes;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(
        {state == OffloadEntry::State::writing, entry->range->offset, entry->bytes, entry->ram.value, entry->job});
    watched_.push_back(entry);
  }
  cv_.notify_all();
  started_jobs_ = true;
  const bool wanted = !window_ended_ || state == OffloadEntry::State::reading;
  if (may_yield_ && wanted && !yielding_ && std::this_thread::get_id() == owner_) {
    detail::yield_core(true);
    yielding_ = true;
  }
}

// Makes entry.ram a tensor over the value's mapped pages if they are all in memory.
bool OffloadStore::map_resident(OffloadEntry& entry) {
  char* pages = file_->resident(entry.range->offset, entry.bytes);
  if (pages == nullptr) return false;
  entry.ram.hold(detail::external_tensor(pages, {entry.numel}, entry.dtype, memory::Tag::other, kCpu,
                                         [range = entry.range] {}));
  dynamic_counters().bytes_mapped += entry.bytes;
  return true;
}

// A device value's copy to host memory (Note [offload of device values] in offload_device.cpp).
void OffloadStore::start_copy_to_host(const std::shared_ptr<OffloadEntry>& entry, const Tensor& whole) {
  start_copy_out(*entry, whole);
  in_flight_ += entry->bytes;
  copying_.push_back(entry);
  if (!entry->copy.pending()) poll_copy(*entry, false);
}

// Whether entry's copy to host memory is over (waiting for it with `wait`); once it is, its
// write starts, or, if it failed, the value stays on its device and the error is pending.
bool OffloadStore::poll_copy(OffloadEntry& entry, bool wait) {
  std::string error;
  if (!poll_copy_out(entry, wait, error)) return false;
  in_flight_ -= entry.bytes;
  if (!error.empty()) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pending_error_.empty()) pending_error_ = std::move(error);
    return true;
  }
  for (const auto& weak : copying_)
    if (auto e = weak.lock(); e.get() == &entry) {
      start_job(e, OffloadEntry::State::writing);
      break;
    }
  return true;
}

void OffloadStore::throw_pending_error() {
  std::string error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error.swap(pending_error_);
  }
  if (!error.empty()) throw Error(error);
}

void OffloadStore::wait_for_room(size_t bytes) {
  if (options_.ram_bytes == 0) return;
  const auto start = std::chrono::steady_clock::now();
  bool waited = false;
  while (in_flight_ > 0 && in_flight_ + bytes > options_.ram_bytes) {
    waited = true;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      done_cv_.wait_for(lock, std::chrono::milliseconds(2));
    }
    collect();
    throw_pending_error();
  }
  if (waited)
    dynamic_counters().stall_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Note [writes behind a plan's peak]. A budget plan counts an offloaded node's bytes as gone
// once the node's forward is over. Waiting there for its writes would hold the next node's
// compute behind the disk; instead the plan's scope caps the saved bytes at the plan's
// predicted peak (OffloadGate), and a value about to be kept or written that would lift them
// above it first waits for the oldest writes in flight, whose memory copies are then dropped,
// until it fits or nothing is in flight (what is left is the plan's own, which the plan
// counted; where that is still above the cap, the plan's model did not hold, and the counters say
// by how much: DynamicCounters::bytes_over_plan). A value a re-run saves in the backward pass, and
// a value read back when its node needs it, wait the same way under the cap the forward set. So
// the writes run behind the nodes that follow, and the measured saved peak stays within the
// prediction whenever the plan's model holds. The cap counts host memory only: a device value's
// host copy does not occupy the device (Note [offload of device values] in offload_device.cpp).
// The backward of a planned step reads ahead only where its plan says: a value read (or mapped)
// a few nodes early is counted during what runs between, which may be a region's re-run at the
// plan's peak (a GPT's record read back during the next block's re-run lifted the measured peak
// 2.4 % above the prediction), so the engine's read-ahead is off and the plan's reads start
// where its peak leaves room (Note [reads ahead of a plan's nodes]); a value the plan reads at
// its node is read when its node runs: mapped pages when resident, else a read.
void OffloadStore::wait_below_cap(size_t adding, size_t cap) {
  if (cap == 0) return;
  while (memory::live_bytes(memory::Tag::saved) + adding > cap) {
    std::shared_ptr<OffloadEntry> oldest;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& weak : watched_)
        if (auto e = weak.lock(); e && e->job && e->state == OffloadEntry::State::writing) {
          oldest = std::move(e);
          break;
        }
    }
    if (!oldest) {  // nothing left to wait for: what is over the cap is over the plan's prediction
      const size_t over = memory::live_bytes(memory::Tag::saved) + adding - cap;
      dynamic_counters().bytes_over_plan = std::max(dynamic_counters().bytes_over_plan, over);
      return;
    }
    wait_done(*oldest);
    throw_pending_error();
  }
}

void OffloadStore::wait_done(OffloadEntry& entry) {
  if (!entry.job) return;
  const auto start = std::chrono::steady_clock::now();
  {
    std::unique_lock<std::mutex> lock(mutex_);
    std::shared_ptr<JobStatus> status = entry.job;
    done_cv_.wait(lock, [&] { return status->done; });
  }
  dynamic_counters().stall_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  collect();
}

void OffloadStore::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) {
      if (stop_) return;
      continue;
    }
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    const bool abandoned = job.status.use_count() == 1;  // its value is gone
    const bool inject = job.write && faults_.fail_after_bytes > 0 && written_ + job.bytes > faults_.fail_after_bytes;
    lock.unlock();
    std::string error;
    bool ok = false;
    if (abandoned) {
      error = "abandoned";
    } else if (inject) {
      error = "No space left on device (injected for a test)";
    } else {
      const auto io_start = std::chrono::steady_clock::now();
      if (job.write && faults_.write_delay_seconds > 0)
        std::this_thread::sleep_for(std::chrono::duration<double>(faults_.write_delay_seconds));
      ok = job.write ? write_all(file_->fd(), static_cast<const char*>(job.buffer.raw_data()), job.bytes, job.offset, error)
                     : read_all(file_->fd(), static_cast<char*>(job.buffer.raw_data()), job.bytes, job.offset, error);
      busy_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - io_start).count();
    }
    job.buffer = Tensor();
    lock.lock();
    job.status->done = true;
    job.status->ok = ok;
    if (job.write && ok) written_ += job.bytes;
    if (job.status.use_count() > 1 && !ok && !abandoned) {
      pending_error_ = detail::concat("policy offload: ", job.write ? "writing " : "reading ",
                                      memory::format_bytes(static_cast<double>(job.bytes)),
                                      job.write ? " to " : " from ", where(job.offset), " failed: ", error,
                                      job.write ? " (the value stays in memory; nothing was lost)" : "");
    }
    done_cv_.notify_all();
  }
}

// Note [yielding a core to the writer]. On a machine with no spare core, the scope's thread
// may run its parallel kernels on one thread fewer while the worker has writing to do, leaving
// a core to it (a preempted kernel thread would hold its whole parallel region at the
// barrier). The writing is the forward pass's: reads back are mapped pages with nothing to
// copy, so the window closes at the first unpack (the backward pass begins) and the backward
// keeps every thread; only a read job (a value whose pages the kernel dropped) yields again.
// Whether yielding pays depends on how busy the worker is, so it follows the previous scope on
// the same file: its worker's I/O time over the window's wall time, at least 25 %
// (SlotFile::choose_yield). Measured on 2 cores, offload step over save-all step with their
// steps taken in turn (bench_dynamic):
// - the heat solver (memory-bound kernels, 10 % of saved bytes resident): the worker is busy
//   65-82 % of the forward; 1.43-1.64x without yielding, 1.18-1.27x always yielding,
//   1.05-1.12x under the rule (with the turn-taking steps);
// - the default GPT (threshold 64 KiB): 1.14-1.15x without yielding, 1.22x always yielding,
//   1.07-1.15x under the rule.
// Before reads were mapped, the window ran to the end of the scope (the worker read back
// during the backward pass); yielding only while the worker had jobs, or choosing by trying
// both ways, did worse. Results do not change: kernels whose results depend on the thread
// count keep all threads (see detail::yield_core).
void OffloadStore::end_window() {
  if (window_ended_) return;
  window_ended_ = true;
  if (started_jobs_) {
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - opened_).count();
    if (wall > 0) file_->record(busy_seconds_.load() / wall);
  }
  stop_yielding();
}

void OffloadStore::stop_yielding() {
  if (!yielding_) return;
  detail::yield_core(false);
  yielding_ = false;
}

std::string OffloadStore::where(off_t offset) const {
  return detail::concat("the offload file in '", options_.directory, "' (at byte ", static_cast<long long>(offset), ")");
}

}  // namespace remat::detail
