// Offloading saved values to files (policy offload:DIR): a background thread writes and reads
// them; the saved-value hooks hand them out. See include/remat/dynamic.h.
//
// Threads. Everything that touches tensor accounting (allocating read buffers, saved references,
// dropping the in-memory copy of a written value) happens on the thread that owns the scope; the
// worker only copies bytes between buffers and files. A job holds the buffer it works on, so a
// value whose SavedTensors are gone while its job runs is simply discarded.
//
// Files. A store writes into one file with no name (O_TMPFILE, or a name unlinked at once), so
// the kernel removes it on every exit, a crash included, and DIR never holds a file of ours.
// Values take page-aligned ranges of it; a freed range is reused by the next value that fits.
// A store's file goes back to a per-directory pool when the store ends, for the next step:
// overwriting pages the file already has is 4-6x faster than writing new ones (measured with dd
// on these machines: 5.0-5.3 GB/s against 0.8-1.2 GB/s), and creating a file per value cost
// more again (ext4's inode search). release_offload_files() closes the pooled files. One worker
// thread runs the jobs in order, so a range reused by a new value is written only after every
// job on its previous value has finished.
//
// Reading back. A store's file is mapped whole (MAP_SHARED, address space reserved for
// kMapBytes) for as long as the file lives, so a written value whose pages are still in the page
// cache is handed to the backward pass as a tensor over the mapped pages: no copy, no read job,
// and the pages stay mapped from step to step. mincore() tells whether they are resident; a value
// whose pages the kernel has already dropped is read back by the worker into memory of ours
// (ahead of need, with a read error reported as such), as are values when the mapping cannot be
// had. A mapped value holds its range of the file, and the range its file, until the last tensor
// over it is gone. The allocator counts a mapped value like memory of ours while it is in use.
// Writes stay pwrite(): a full disk is then an error of the write, not a SIGBUS.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "dynamic_internal.h"
#include "tensor/allocate.h"
#include "remat/backend.h"
#include "remat/dynamic.h"
#include "remat/memory.h"
#include "remat/saved_hooks.h"

namespace remat {

namespace detail {

namespace {

thread_local int offload_scopes = 0;

Tensor fresh_like(DType dtype, int64_t numel) { return Tensor::empty({numel}, dtype); }

bool write_all(int fd, const char* data, size_t bytes, off_t offset, std::string& error) {
  while (bytes > 0) {
    ssize_t n = ::pwrite(fd, data, bytes, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      error = std::strerror(errno);
      return false;
    }
    data += n;
    offset += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

bool read_all(int fd, char* data, size_t bytes, off_t offset, std::string& error) {
  while (bytes > 0) {
    ssize_t n = ::pread(fd, data, bytes, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      error = std::strerror(errno);
      return false;
    }
    if (n == 0) {
      error = "the file is shorter than expected";
      return false;
    }
    data += n;
    offset += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

constexpr size_t kPage = 4096;
// The address space reserved for a file's mapping (none of it is memory until mapped pages are
// touched); a value beyond it is read back by copy.
constexpr size_t kMapBytes = size_t{1} << 40;

// A file with no name under a directory, which byte ranges of it are in use, and its mapping.
// take() runs on the thread of the store that owns the file; give() on whichever thread drops
// the last tensor over a range, hence the mutex.
class SlotFile {
 public:
  explicit SlotFile(const std::string& directory) : directory_(directory) {
#ifdef O_TMPFILE
    fd_ = ::open(directory.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
#endif
    if (fd_ < 0) {  // no O_TMPFILE on this file system: a name, unlinked at once
      std::string name = (std::filesystem::path(directory) / "remat-offload-XXXXXX").string();
      fd_ = ::mkostemp(name.data(), O_CLOEXEC);
      if (fd_ >= 0) ::unlink(name.c_str());
    }
    if (fd_ < 0)
      throw Error(detail::concat("policy offload: cannot create a file in '", directory, "': ", std::strerror(errno)));
    void* map = ::mmap(nullptr, kMapBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd_, 0);
    map_ = map == MAP_FAILED ? nullptr : static_cast<char*>(map);  // without it, values are read back by copy
  }
  ~SlotFile() {
    if (map_ != nullptr) ::munmap(map_, kMapBytes);
    ::close(fd_);
  }
  SlotFile(const SlotFile&) = delete;
  SlotFile& operator=(const SlotFile&) = delete;

  int fd() const { return fd_; }
  const std::string& directory() const { return directory_; }
  size_t used() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return used_;
  }

  // Where the written range [offset, offset + bytes) is mapped, if every page of it is resident
  // in the page cache (reading it then waits for no disk); null otherwise.
  char* resident(off_t offset, size_t bytes) const {
    const size_t at = static_cast<size_t>(offset);
    if (map_ == nullptr || bytes == 0 || at + bytes > kMapBytes) return nullptr;
    thread_local std::vector<unsigned char> pages;
    pages.resize((bytes + kPage - 1) / kPage);
    if (::mincore(map_ + at, bytes, pages.data()) != 0) return nullptr;
    for (unsigned char p : pages)
      if ((p & 1) == 0) return nullptr;
    return map_ + at;
  }

  // Whether the next scope writing to this file yields a core to its writer (see OffloadStore::
  // end_window): when the worker was busy with I/O for at least kYieldBusy of the last scope's
  // forward pass (the first scope does not). Results are the same either way; only the time
  // differs.
  bool choose_yield() const { return last_busy_ >= kYieldBusy; }
  void record(double busy_fraction) { last_busy_ = busy_fraction; }

  // The offset of a free range of at least `bytes` (the smallest that fits, else at the end).
  off_t take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t size = round_up(bytes);
    used_ += size;
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->second >= size && (best == free_.end() || it->second < best->second)) best = it;
    if (best == free_.end()) {
      const size_t offset = end_;
      end_ += size;
      return static_cast<off_t>(offset);
    }
    const size_t offset = best->first, left = best->second - size;
    free_.erase(best);
    if (left > 0) free_.emplace(offset + size, left);
    return static_cast<off_t>(offset);
  }

  void give(off_t at, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t offset = static_cast<size_t>(at), size = round_up(bytes);
    used_ -= size;
    auto next = free_.lower_bound(offset);
    if (next != free_.end() && next->first == offset + size) {
      size += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto before = std::prev(next);
      if (before->first + before->second == offset) {
        offset = before->first;
        size += before->second;
        free_.erase(before);
      }
    }
    free_.emplace(offset, size);
  }

 private:
  static size_t round_up(size_t bytes) { return (std::max<size_t>(bytes, 1) + kPage - 1) / kPage * kPage; }

  static constexpr double kYieldBusy = 0.25;

  std::string directory_;
  int fd_ = -1;
  char* map_ = nullptr;
  double last_busy_ = 0;  // the worker's I/O time over the forward pass of the last scope that wrote
  mutable std::mutex mutex_;  // guards the ranges
  size_t end_ = 0, used_ = 0;
  std::map<size_t, size_t> free_;  // offset -> bytes
};

// A value's range of a file: given back when the value's entry and every tensor over its mapped
// pages are gone.
struct FileRange {
  FileRange(std::shared_ptr<SlotFile> f, size_t size) : file(std::move(f)), bytes(size), offset(file->take(size)) {}
  ~FileRange() { file->give(offset, bytes); }
  FileRange(const FileRange&) = delete;
  FileRange& operator=(const FileRange&) = delete;
  const std::shared_ptr<SlotFile> file;
  const size_t bytes;
  const off_t offset;
};

// Files of ended stores, one per directory, kept for the next store (the next step).
std::mutex pool_mutex;
std::map<std::string, std::shared_ptr<SlotFile>>& file_pool() {
  static auto* pool = new std::map<std::string, std::shared_ptr<SlotFile>>();  // outlives every store
  return *pool;
}

std::shared_ptr<SlotFile> take_file(const std::string& directory) {
  {
    std::lock_guard<std::mutex> lock(pool_mutex);
    auto& pool = file_pool();
    if (auto it = pool.find(directory); it != pool.end()) {
      std::shared_ptr<SlotFile> file = std::move(it->second);
      pool.erase(it);
      return file;
    }
  }
  return std::make_shared<SlotFile>(directory);
}

void return_file(std::shared_ptr<SlotFile> file) {
  // A range still taken (a tensor over its pages outlived the scope): the file is not pooled; it
  // closes when the last such tensor is gone.
  if (!file || file->used() != 0) return;
  std::lock_guard<std::mutex> lock(pool_mutex);
  auto& slot = file_pool()[file->directory()];
  slot = std::move(file);  // a file already pooled for this directory is closed
}

}  // namespace

}  // namespace detail

void release_offload_files() {
  std::map<std::string, std::shared_ptr<detail::SlotFile>> closing;
  {
    std::lock_guard<std::mutex> lock(detail::pool_mutex);
    closing.swap(detail::file_pool());
  }
}

namespace detail {

bool offload_running() { return offload_scopes > 0; }

class OffloadStore;

// What the worker reports about one job (guarded by the store's mutex); shared by the entry and
// the job, so that the worker never holds an entry (whose end belongs to the scope's thread).
struct JobStatus {
  bool done = false;
  bool ok = false;
};

struct OffloadEntry {
  enum class State { memory, writing, on_disk, reading };
  std::shared_ptr<OffloadStore> store;
  DType dtype = DType::f32;
  int64_t numel = 0;
  size_t bytes = 0;
  std::shared_ptr<FileRange> range;  // its range of the store's file, if it has one
  // owned by the scope's thread
  State state = State::memory;
  std::shared_ptr<JobStatus> job;  // the job in flight, if any
  Tensor ram;                      // the value in memory, if it is
  bool counted = false;            // ram holds a saved reference
  ~OffloadEntry();
};

class OffloadStore : public std::enable_shared_from_this<OffloadStore> {
 public:
  explicit OffloadStore(const OffloadOptions& options) : options_(options) {
    namespace fs = std::filesystem;
    std::error_code ec;
    REMAT_CHECK(fs::is_directory(options.directory, ec), "policy offload: '", options.directory,
                "' is not a directory");
    file_ = take_file(options.directory);
    may_yield_ = detail::no_spare_core() && file_->choose_yield();
    worker_ = std::thread([this] { work(); });
  }

  ~OffloadStore() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
    return_file(std::move(file_));
  }

  // ---- saved-value hooks (the scope's thread)
  PackedValue pack(const Tensor& whole) {
    collect();
    throw_pending_error();
    auto entry = std::make_shared<OffloadEntry>();
    entry->store = shared_from_this();
    entry->dtype = whole.dtype();
    entry->numel = whole.numel();
    entry->bytes = whole.nbytes();
    entry->ram = whole;
    hold(*entry);
    if (entry->bytes < options_.threshold_bytes) return entry;  // small: stays in memory
    wait_for_room(entry->bytes);
    entry->range = std::make_shared<FileRange>(file_, entry->bytes);
    start_job(entry, OffloadEntry::State::writing);
    return entry;
  }

  Tensor unpack(const std::shared_ptr<OffloadEntry>& entry) {
    end_window();  // the backward pass has begun (once; see the yielding rule below)
    collect();
    if (entry->state == OffloadEntry::State::reading) wait_done(*entry);
    throw_pending_error();
    if (entry->ram.defined()) return entry->ram;
    auto& c = dynamic_counters();
    if (map_resident(*entry)) {  // not prefetched, but its pages are in memory
      c.bytes_read_on_demand += entry->bytes;
      return entry->ram;
    }
    // on disk and not prefetched: read now
    const auto start = std::chrono::steady_clock::now();
    Tensor buffer = fresh_like(entry->dtype, entry->numel);
    std::string error;
    const bool ok =
        read_all(file_->fd(), static_cast<char*>(buffer.raw_data()), entry->bytes, entry->range->offset, error);
    REMAT_CHECK(ok, "policy offload: reading a saved value of ", memory::format_bytes(static_cast<double>(entry->bytes)),
                " back from ", where(entry->range->offset), " failed: ", error);
    c.bytes_read_on_demand += entry->bytes;
    c.stall_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    entry->ram = buffer;
    hold(*entry);
    return entry->ram;
  }

  void wait_for_writes() {
    std::vector<std::shared_ptr<OffloadEntry>> writing;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& weak : watched_)
        if (auto e = weak.lock(); e && e->job && e->state == OffloadEntry::State::writing) writing.push_back(e);
    }
    for (const auto& e : writing) wait_done(*e);
    collect();
    throw_pending_error();
  }

  void prefetch(const std::shared_ptr<OffloadEntry>& entry) {
    collect();
    if (entry->ram.defined() || entry->state != OffloadEntry::State::on_disk) return;
    if (map_resident(*entry)) {
      dynamic_counters().bytes_prefetched += entry->bytes;
      return;
    }
    if (options_.ram_bytes > 0 && in_flight_ + entry->bytes > options_.ram_bytes) return;  // read on demand
    entry->ram = fresh_like(entry->dtype, entry->numel);
    hold(*entry);
    start_job(entry, OffloadEntry::State::reading);
    dynamic_counters().bytes_prefetched += entry->bytes;
  }

  void release_entry(OffloadEntry& entry) {
    if (entry.counted) {
      entry.ram.storage()->remove_saved_reference();
      entry.counted = false;
    }
    entry.ram = Tensor();
    if (entry.job) {
      in_flight_ -= entry.bytes;
      entry.job.reset();
    }
    // The range goes back to the file once no tensor over its mapped pages is left either. A job
    // still on it finishes before any job of the next value given it (one worker, in order).
    entry.range.reset();
  }

  // The scope ends: its thread stops yielding a core, and no later job makes it yield again.
  void close_scope() {
    collect();
    end_window();
    stop_yielding();
    may_yield_ = false;
  }

  // Notes finished jobs: drops the memory copies of written values.
  void collect() {
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
        if (e->counted) {
          e->ram.storage()->remove_saved_reference();
          e->counted = false;
        }
        e->ram = Tensor();
        ++dynamic_counters().offloaded;
        dynamic_counters().bytes_offloaded += e->bytes;
      } else if (e->state == OffloadEntry::State::reading) {
        e->state = OffloadEntry::State::on_disk;  // and in memory again (ram holds it)
        if (!ok) {
          if (e->counted) e->ram.storage()->remove_saved_reference();
          e->counted = false;
          e->ram = Tensor();  // read again on demand, with its error
        }
      }
    }
  }

 private:
  struct Job {
    bool write;
    off_t offset;
    size_t bytes;
    Tensor buffer;  // what is written, or where it is read into
    std::shared_ptr<JobStatus> status;
  };

  void start_job(const std::shared_ptr<OffloadEntry>& entry, OffloadEntry::State state) {
    entry->state = state;
    entry->job = std::make_shared<JobStatus>();
    in_flight_ += entry->bytes;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back({state == OffloadEntry::State::writing, entry->range->offset, entry->bytes, entry->ram, entry->job});
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
  bool map_resident(OffloadEntry& entry) {
    char* pages = file_->resident(entry.range->offset, entry.bytes);
    if (pages == nullptr) return false;
    entry.ram = detail::external_tensor(pages, {entry.numel}, entry.dtype, memory::Tag::other, kCpu,
                                        [range = entry.range] {});
    hold(entry);
    dynamic_counters().bytes_mapped += entry.bytes;
    return true;
  }

  void hold(OffloadEntry& entry) {
    if (!entry.counted && (entry.ram.storage()->tag() == memory::Tag::other ||
                           entry.ram.storage()->tag() == memory::Tag::saved)) {
      entry.ram.storage()->add_saved_reference();
      entry.counted = true;
    }
  }

  void throw_pending_error() {
    std::string error;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      error.swap(pending_error_);
    }
    if (!error.empty()) throw Error(error);
  }

  void wait_for_room(size_t bytes) {
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

  void wait_done(OffloadEntry& entry) {
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

  void work() {
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
      const bool inject = job.write && options_.fail_after_bytes > 0 && written_ + job.bytes > options_.fail_after_bytes;
      lock.unlock();
      std::string error;
      bool ok = false;
      if (abandoned) {
        error = "abandoned";
      } else if (inject) {
        error = "No space left on device (injected for a test)";
      } else {
        const auto io_start = std::chrono::steady_clock::now();
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

  // On a machine with no spare core, the scope's thread may run its parallel kernels on one
  // thread fewer while the worker has writing to do, leaving a core to it (a preempted kernel
  // thread would hold its whole parallel region at the barrier). The writing is the forward
  // pass's: reads back are mapped pages with nothing to copy, so the window closes at the first
  // unpack (the backward pass begins) and the backward keeps every thread; only a read job (a
  // value whose pages the kernel dropped) yields again. Whether yielding pays depends on how
  // busy the worker is, so it follows the previous scope on the same file: its worker's I/O
  // time over the window's wall time, at least 25 % (SlotFile::choose_yield). Measured on 2
  // cores, offload step over save-all step with their steps taken in turn (bench_dynamic):
  // - the heat solver (memory-bound kernels, 10 % of saved bytes resident): the worker is busy
  //   65-82 % of the forward; 1.43-1.64x without yielding, 1.18-1.27x always yielding,
  //   1.05-1.12x under the rule (with the turn-taking steps);
  // - the default GPT (threshold 64 KiB): 1.14-1.15x without yielding, 1.22x always yielding,
  //   1.07-1.15x under the rule.
  // Before reads were mapped, the window ran to the end of the scope (the worker read back
  // during the backward pass); yielding only while the worker had jobs, or choosing by trying
  // both ways, did worse. Results do not change: kernels whose results depend on the thread
  // count keep all threads (see detail::yield_core).
  void end_window() {
    if (window_ended_) return;
    window_ended_ = true;
    if (started_jobs_) {
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - opened_).count();
      if (wall > 0) file_->record(busy_seconds_.load() / wall);
    }
    stop_yielding();
  }

  void stop_yielding() {
    if (!yielding_) return;
    detail::yield_core(false);
    yielding_ = false;
  }

  std::string where(off_t offset) const {
    return detail::concat("the offload file in '", options_.directory, "' (at byte ", static_cast<long long>(offset), ")");
  }

  OffloadOptions options_;
  std::shared_ptr<SlotFile> file_;
  const std::thread::id owner_ = std::this_thread::get_id();  // the scope's thread
  const std::chrono::steady_clock::time_point opened_ = std::chrono::steady_clock::now();
  // the scope's thread only
  bool may_yield_ = false, yielding_ = false, started_jobs_ = false;
  bool window_ended_ = false;  // the forward's writing window is over (see end_window)
  size_t in_flight_ = 0;  // the scope's thread only
  std::mutex mutex_;
  std::condition_variable cv_, done_cv_;
  std::deque<Job> jobs_;
  std::vector<std::weak_ptr<OffloadEntry>> watched_;
  size_t written_ = 0;
  std::atomic<double> busy_seconds_{0};
  std::string pending_error_;
  bool stop_ = false;
  std::thread worker_;
};

OffloadEntry::~OffloadEntry() {
  if (store) store->release_entry(*this);
}

}  // namespace detail

struct OffloadScope::State {
  std::shared_ptr<detail::OffloadStore> store;
  std::unique_ptr<ScopedSavedTensorHooks> hooks;
};

OffloadScope::OffloadScope(const OffloadOptions& options) : state_(std::make_unique<State>()) {
  REMAT_CHECK(options.directory.find('\0') == std::string::npos, "offload: the directory contains a NUL byte");
  state_->store = std::make_shared<detail::OffloadStore>(options);
  std::shared_ptr<detail::OffloadStore> store = state_->store;
  SavedTensorHooks hooks;
  hooks.pack = [store](const Tensor& storage) -> PackedValue { return store->pack(storage); };
  hooks.unpack = [](const PackedValue& packed) {
    auto entry = std::static_pointer_cast<detail::OffloadEntry>(packed);
    return entry->store->unpack(entry);
  };
  hooks.prefetch = [](const PackedValue& packed) {
    auto entry = std::static_pointer_cast<detail::OffloadEntry>(packed);
    entry->store->prefetch(entry);
  };
  state_->hooks = std::make_unique<ScopedSavedTensorHooks>(std::move(hooks));
  ++detail::offload_scopes;
}

void OffloadScope::wait_for_writes() { state_->store->wait_for_writes(); }

OffloadScope::~OffloadScope() {
  --detail::offload_scopes;
  state_->hooks.reset();
  if (state_->store) state_->store->close_scope();
}

}  // namespace remat
