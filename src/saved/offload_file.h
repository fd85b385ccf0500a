// Internal: the nameless, mapped file an offload store writes saved values to, its byte ranges,
// and the per-directory pool of files kept between scopes. See Note [offload files] in
// offload_file.cpp.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace remat::detail {

// Whole-buffer pwrite / pread, retried on EINTR; false with `error` set on failure.
bool write_all(int fd, const char* data, size_t bytes, off_t offset, std::string& error);
bool read_all(int fd, char* data, size_t bytes, off_t offset, std::string& error);

// A file with no name under a directory, which byte ranges of it are in use, and its mapping.
// take() runs on the thread of the store that owns the file; give() on whichever thread drops
// the last tensor over a range, hence the mutex.
class SlotFile {
 public:
  explicit SlotFile(const std::string& directory);
  ~SlotFile();
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
  char* resident(off_t offset, size_t bytes) const;

  // Whether the next scope writing to this file yields a core to its writer (Note [yielding a
  // core to the writer] in offload_store.cpp): when the worker was busy with I/O for at least
  // kYieldBusy of the last scope's forward pass (the first scope does not). Results are the same
  // either way; only the time differs.
  bool choose_yield() const { return last_busy_ >= kYieldBusy; }
  void record(double busy_fraction) { last_busy_ = busy_fraction; }

  // The offset of a free range of at least `bytes` (the smallest that fits, else at the end).
  off_t take(size_t bytes);
  void give(off_t at, size_t bytes);

 private:
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

// The pooled file of `directory` if there is one, else a new file there (a remat::Error naming
// the directory when it cannot be created).
std::shared_ptr<SlotFile> take_file(const std::string& directory);
// Keeps an ended store's file for the next store on its directory (unless a range of it is still
// taken: it then closes when the last tensor over its pages is gone).
void return_file(std::shared_ptr<SlotFile> file);

}  // namespace remat::detail
