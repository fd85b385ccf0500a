// The file an offload store writes saved values to (policy offload:DIR), and the pool that keeps
// it for the next store. The runtime that decides what goes there is offload.cpp.
//
// Note [offload files]. A store writes into one file with no name (O_TMPFILE, or a name unlinked
// at once), so the kernel removes it on every exit, a crash included, and DIR never holds a file
// of ours. Values take page-aligned ranges of it; a freed range is reused by the next value that
// fits. A store's file goes back to a per-directory pool when the store ends, for the next step:
// overwriting pages the file already has is 4-6x faster than writing new ones (measured with dd
// on these machines: 5.0-5.3 GB/s against 0.8-1.2 GB/s), and creating a file per value cost more
// again (ext4's inode search). release_offload_files() closes the pooled files. One worker thread
// runs a store's jobs in order, so a range reused by a new value is written only after every job
// on its previous value has finished.
//
// Reading back. A store's file is mapped whole (MAP_SHARED, address space reserved for
// kMapBytes) for as long as the file lives, so a written value whose pages are still in the page
// cache is handed to the backward pass as a tensor over the mapped pages: no copy, no read job,
// and the pages stay mapped from step to step. mincore() tells whether they are resident; a value
// whose pages the kernel has already dropped is read back by the worker into memory of ours
// (ahead of need, with a read error reported as such), as are values when the mapping cannot be
// had. A mapped value holds its range of the file, and the range its file, until the last tensor
// over it is gone. The allocator counts a mapped value like memory of ours while it is in use.
// Writes stay pwrite(): a full disk is then an error of the write, not a SIGBUS. A short write
// (the disk filled during it) is continued from where it stopped, and the next call's ENOSPC fails
// the job; the value then stays in memory and the scope ends with an error saying so.
//
// The OpenMP runtime is started before the file is mapped. LLVM's runtime, when it starts, looks
// for a registration file of its pid in /dev/shm; one left by a killed process whose pid was
// reused names an address, and the runtime reads that address if it is mapped here. Inside this
// mapping, past the file's end, the read is a SIGBUS (test_offload_openmp_start builds the case).
#include "offload_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "remat/backend.h"
#include "remat/offload.h"
#include "remat/error.h"

namespace remat {

namespace detail {

namespace {

constexpr size_t kPage = 4096;
// The address space reserved for a file's mapping (none of it is memory until mapped pages are
// touched); a value beyond it is read back by copy.
constexpr size_t kMapBytes = size_t{1} << 40;

size_t round_up(size_t bytes) { return (std::max<size_t>(bytes, 1) + kPage - 1) / kPage * kPage; }

// Files of ended stores, one per directory, kept for the next store (the next step).
std::mutex pool_mutex;
std::map<std::string, std::shared_ptr<SlotFile>>& file_pool() {
  static auto* pool = new std::map<std::string, std::shared_ptr<SlotFile>>();  // outlives every store
  return *pool;
}

}  // namespace

bool write_all(int fd, const char* data, size_t bytes, off_t offset, std::string& error) {
  while (bytes > 0) {
    ssize_t n = ::pwrite(fd, data, bytes, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      error = std::strerror(errno);
      return false;
    }
    if (n == 0) {  // no progress: never loop forever (a full disk answers ENOSPC on the next call)
      error = "the write made no progress";
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

SlotFile::SlotFile(const std::string& directory) : directory_(directory) {
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
  (void)num_threads();  // starts the OpenMP runtime (see the Note)
  void* map = ::mmap(nullptr, kMapBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd_, 0);
  map_ = map == MAP_FAILED ? nullptr : static_cast<char*>(map);  // without it, values are read back by copy
}

SlotFile::~SlotFile() {
  if (map_ != nullptr) ::munmap(map_, kMapBytes);
  ::close(fd_);
}

char* SlotFile::resident(off_t offset, size_t bytes) const {
  const size_t at = static_cast<size_t>(offset);
  if (map_ == nullptr || bytes == 0 || at + bytes > kMapBytes) return nullptr;
  thread_local std::vector<unsigned char> pages;
  pages.resize((bytes + kPage - 1) / kPage);
  if (::mincore(map_ + at, bytes, pages.data()) != 0) return nullptr;
  for (unsigned char p : pages)
    if ((p & 1) == 0) return nullptr;
  return map_ + at;
}

off_t SlotFile::take(size_t bytes) {
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

void SlotFile::give(off_t at, size_t bytes) {
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

}  // namespace detail

void release_offload_files() {
  std::map<std::string, std::shared_ptr<detail::SlotFile>> closing;
  {
    std::lock_guard<std::mutex> lock(detail::pool_mutex);
    closing.swap(detail::file_pool());
  }
}

}  // namespace remat

namespace remat {

// Note [measuring the offload target]. What a plan (budget:...+offload:DIR) charges per offloaded
// byte: one write of the value and one read back, through a file of the same kind the store uses,
// timed once per directory and process in both of the ways the store's bytes may go. Into the page
// cache: written and not flushed, then read back while resident. To the disk: written up to
// fdatasync, the pages dropped (POSIX_FADV_DONTNEED), read back from the disk. The store writes
// behind the forward pass and never flushes, and its reads hand back resident pages without a copy
// (offload.cpp): so while the host's memory holds what a step offloads, the kernel keeps the pages
// and a byte costs the page cache's price; where memory is short, the reason to offload in the
// first place, the kernel writes the pages back and drops them, and a byte costs the disk's.
// offload_price takes the page cache's where a step's bytes are at most a tenth of the host's
// available memory: the kernel's default dirty_background_ratio, the dirty share from which it
// starts writing pages back. (A bench that caps only the allocator, with the host's memory to
// spare, runs offload:DIR at the page cache's speed; priced at the disk's, a plan recomputed
// instead and lost to it.) The store's worker writes while the step computes: on a device, on a
// host core the step leaves free, so the plan hides a write behind the forward compute after its
// node and a read ahead of its own. On the CPU with the step's threads on every core
// (offload_copies_share_the_cores) the worker takes its time from the step's: the plan charges
// every transfer in full. (On the 2-core build machine, priced at the page cache's and hidden,
// a 64-layer MLP's plan offloaded every record and ran 4 % slower than recomputing.)
// dynamic:+offload: charges the disk's: its runtime cannot know a step's volume before it runs. A
// file system that ignores the advice (tmpfs) measures its own speed.
OffloadBandwidth offload_bandwidth(const std::string& directory) {
  static std::mutex mutex;
  static std::map<std::string, OffloadBandwidth> measured;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = measured.find(directory); it != measured.end()) return it->second;
  constexpr size_t kPiece = size_t{1} << 20, kPieces = 32;
  detail::SlotFile file(directory);
  std::vector<char> buffer(kPiece);
  for (size_t i = 0; i < kPiece; ++i) buffer[i] = static_cast<char>(i * 131);
  std::string error;
  const auto fail = [&](const char* what, const std::string& why) {
    throw Error(detail::concat("offload bandwidth: ", what, " a file in '", directory, "' failed: ", why));
  };
  // a store's file is reused from scope to scope, so its writes land on blocks the file already
  // has: the first pass gives the file its blocks, untimed
  const auto timed = [&](bool write, bool flush) {
    const auto start = std::chrono::steady_clock::now();
    for (size_t k = 0; k < kPieces; ++k) {
      const off_t at = static_cast<off_t>(k * kPiece);
      const bool ok = write ? detail::write_all(file.fd(), buffer.data(), kPiece, at, error)
                            : detail::read_all(file.fd(), buffer.data(), kPiece, at, error);
      if (!ok) fail(write ? "writing to" : "reading from", error);
    }
    if (flush && ::fdatasync(file.fd()) != 0) fail("flushing", std::strerror(errno));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return static_cast<double>(kPiece * kPieces) / std::max(seconds, 1e-9);
  };
  OffloadBandwidth bandwidth;
  timed(true, true);
  bandwidth.cached_write_bytes_per_second = timed(true, false);
  bandwidth.cached_read_bytes_per_second = timed(false, false);
  bandwidth.write_bytes_per_second = timed(true, true);
  ::posix_fadvise(file.fd(), 0, static_cast<off_t>(kPiece * kPieces), POSIX_FADV_DONTNEED);  // advice: may do nothing
  bandwidth.read_bytes_per_second = timed(false, false);
  measured[directory] = bandwidth;
  return bandwidth;
}

bool offload_copies_share_the_cores(Device device) {
  const unsigned cores = std::thread::hardware_concurrency();
  return device.type == DeviceType::cpu && (cores == 0 || num_threads() >= static_cast<int>(cores));
}

OffloadPrice offload_price(const OffloadBandwidth& bandwidth, size_t step_bytes, size_t available_bytes) {
  OffloadPrice price;
  price.page_cache = step_bytes <= available_bytes / 10;
  price.write_bytes_per_second = price.page_cache ? bandwidth.cached_write_bytes_per_second : bandwidth.write_bytes_per_second;
  price.read_bytes_per_second = price.page_cache ? bandwidth.cached_read_bytes_per_second : bandwidth.read_bytes_per_second;
  return price;
}

}  // namespace remat
