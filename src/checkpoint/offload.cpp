// Offloading saved values to files (policy offload:DIR): a background thread writes and reads
// them; the saved-value hooks hand them out. See include/remat/dynamic.h.
//
// Threads. Everything that touches tensor accounting (allocating read buffers, saved references,
// dropping the in-memory copy of a written value) happens on the thread that owns the scope; the
// worker only copies bytes between buffers and files. A job holds the buffer it works on, so a
// value whose SavedTensors are gone while its job runs is simply discarded (and its file removed).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>

#include "dynamic_internal.h"
#include "remat/dynamic.h"
#include "remat/memory.h"
#include "remat/saved_hooks.h"

namespace remat {

namespace detail {

namespace {

thread_local int offload_scopes = 0;
std::atomic<uint64_t> store_counter{0};

Tensor fresh_like(DType dtype, int64_t numel) { return Tensor::empty({numel}, dtype); }

bool write_all(int fd, const char* data, size_t bytes, std::string& error) {
  while (bytes > 0) {
    ssize_t n = ::write(fd, data, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      error = std::strerror(errno);
      return false;
    }
    data += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

bool read_all(int fd, char* data, size_t bytes, std::string& error) {
  while (bytes > 0) {
    ssize_t n = ::read(fd, data, bytes);
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
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

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
  std::string path;
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
    folder_ = (fs::path(options.directory) /
               ("remat-offload-" + std::to_string(::getpid()) + "-" + std::to_string(store_counter.fetch_add(1))))
                  .string();
    if (::mkdir(folder_.c_str(), 0700) != 0)
      throw Error(detail::concat("policy offload: cannot create a folder in '", options.directory, "': ",
                                 std::strerror(errno)));
    worker_ = std::thread([this] { work(); });
  }

  ~OffloadStore() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
    std::error_code ec;
    std::filesystem::remove_all(folder_, ec);  // files of jobs that outlived their values
  }

  const std::string& folder() const { return folder_; }

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
    entry->path = folder_ + "/" + std::to_string(next_file_++) + ".bin";
    start_job(entry, OffloadEntry::State::writing);
    return entry;
  }

  Tensor unpack(const std::shared_ptr<OffloadEntry>& entry) {
    collect();
    if (entry->state == OffloadEntry::State::reading) wait_done(*entry);
    throw_pending_error();
    if (entry->ram.defined()) return entry->ram;
    // on disk and not prefetched: read now
    const auto start = std::chrono::steady_clock::now();
    Tensor buffer = fresh_like(entry->dtype, entry->numel);
    int fd = ::open(entry->path.c_str(), O_RDONLY | O_CLOEXEC);
    std::string error = fd < 0 ? std::string(std::strerror(errno)) : std::string();
    bool ok = fd >= 0 && read_all(fd, static_cast<char*>(buffer.raw_data()), entry->bytes, error);
    if (fd >= 0) ::close(fd);
    REMAT_CHECK(ok, "policy offload: reading a saved value of ", memory::format_bytes(static_cast<double>(entry->bytes)),
                " back from ", entry->path, " failed: ", error);
    auto& c = dynamic_counters();
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
    if (!entry.path.empty()) ::unlink(entry.path.c_str());  // a job still writing it removes it when done
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
    std::string path;
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
      jobs_.push_back({state == OffloadEntry::State::writing, entry->path, entry->bytes, entry->ram, entry->job});
      watched_.push_back(entry);
    }
    cv_.notify_all();
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
        int fd = job.write ? ::open(job.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)
                           : ::open(job.path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
          error = std::strerror(errno);
        } else {
          ok = job.write ? write_all(fd, static_cast<const char*>(job.buffer.raw_data()), job.bytes, error)
                         : read_all(fd, static_cast<char*>(job.buffer.raw_data()), job.bytes, error);
          if (::close(fd) != 0 && ok) {
            ok = false;
            error = std::strerror(errno);
          }
        }
      }
      job.buffer = Tensor();
      lock.lock();
      job.status->done = true;
      job.status->ok = ok;
      if (job.write && ok) written_ += job.bytes;
      if (job.status.use_count() == 1) {
        if (job.write) ::unlink(job.path.c_str());  // written (or partly) for a value that is gone
      } else if (!ok && !abandoned) {
        pending_error_ = detail::concat("policy offload: ", job.write ? "writing " : "reading ",
                                        memory::format_bytes(static_cast<double>(job.bytes)),
                                        job.write ? " to " : " from ", job.path, " failed: ", error,
                                        job.write ? " (the value stays in memory; nothing was lost)" : "");
      }
      done_cv_.notify_all();
    }
  }

  OffloadOptions options_;
  std::string folder_;
  uint64_t next_file_ = 0;
  size_t in_flight_ = 0;  // the scope's thread only
  std::mutex mutex_;
  std::condition_variable cv_, done_cv_;
  std::deque<Job> jobs_;
  std::vector<std::weak_ptr<OffloadEntry>> watched_;
  size_t written_ = 0;
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
  if (state_->store) state_->store->collect();
}

}  // namespace remat
