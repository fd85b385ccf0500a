// Files written whole or not at all (atomic_file.h).
//
// Note [atomic files]. A file is written under a temporary name in its own directory
// (NAME.tmp-PID-N), flushed with fsync, renamed over NAME, and the directory flushed too: a reader,
// or a crash or power loss at any instant, finds the old file or the new one, never part of one,
// and a failed write (a full disk: ENOSPC, a short write, EIO) leaves the old file untouched and
// no temporary behind. Two test hooks, read once from the environment, let tests reach these
// paths without filling a real disk: REMAT_TEST_FAIL_WRITES_AFTER=N makes every write fail with
// ENOSPC once the process has written N bytes through this class (a disk that fills up), and
// REMAT_TEST_WRITE_DELAY_MS=T sleeps T milliseconds before each commit (a slow disk: a kill then
// lands in the middle of a write).
#include "atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <thread>

#include "remat/error.h"

namespace remat::io {

namespace {

// A whole number from the environment variable `name`, or `fallback` when unset or malformed.
uint64_t env_number(const char* name, uint64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 10);
  return errno != 0 || *end != '\0' ? fallback : static_cast<uint64_t>(v);
}

struct TestHooks {
  uint64_t fail_after_bytes = env_number("REMAT_TEST_FAIL_WRITES_AFTER", std::numeric_limits<uint64_t>::max());
  uint64_t delay_ms = env_number("REMAT_TEST_WRITE_DELAY_MS", 0);
  std::atomic<uint64_t> written{0};
};

TestHooks& hooks() {
  static TestHooks h;
  return h;
}

std::string temporary_name(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return detail::concat(path, ".tmp-", ::getpid(), "-", counter.fetch_add(1));
}

}  // namespace

AtomicFile::AtomicFile(const std::string& path, const std::string& who)
    : path_(path), temp_(temporary_name(path)), who_(who) {
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw Error(detail::concat(who_, ": cannot create ", temp_, ": ", std::strerror(errno)));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!temp_.empty()) ::unlink(temp_.c_str());
}

void AtomicFile::fail(const std::string& what, int error) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temp_.c_str());
  temp_.clear();
  throw Error(detail::concat(who_, ": ", what, " ", path_, " failed: ", std::strerror(error),
                                    error == ENOSPC ? " (the disk is full; the file was left as it was)" : ""));
}

void AtomicFile::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  TestHooks& h = hooks();
  while (bytes > 0) {
    size_t allowed = bytes;
    if (h.fail_after_bytes != std::numeric_limits<uint64_t>::max()) {
      const uint64_t done = h.written.load();
      if (done >= h.fail_after_bytes) fail("writing", ENOSPC);
      allowed = static_cast<size_t>(std::min<uint64_t>(bytes, h.fail_after_bytes - done));  // then a short write
    }
    const ssize_t n = ::write(fd_, p, allowed);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("writing", errno);
    if (n == 0) fail("writing", EIO);  // no progress: never loop forever
    h.written += static_cast<uint64_t>(n);
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  if (hooks().delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(hooks().delay_ms));
  if (::fsync(fd_) != 0) fail("flushing", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    fd_ = -1;
    fail("closing", errno);
  }
  if (::rename(temp_.c_str(), path_.c_str()) != 0) fail("renaming the new file over", errno);
  temp_.clear();
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  sync_directory(parent.empty() ? "." : parent.string(), who_);
}

void write_file_atomically(const std::string& path, const std::string& text, const std::string& who) {
  AtomicFile file(path, who);
  file.write(text.data(), text.size());
  file.commit();
}

void sync_directory(const std::string& directory, const std::string& who) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw Error(detail::concat(who, ": cannot open the directory ", directory, ": ", std::strerror(errno)));
  const int r = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  // some file systems cannot flush a directory (EINVAL): their renames are as durable as they get
  if (r != 0 && error != EINVAL)
    throw Error(detail::concat(who, ": flushing the directory ", directory, " failed: ", std::strerror(error)));
}

}  // namespace remat::io
