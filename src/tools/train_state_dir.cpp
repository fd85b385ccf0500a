// `remat train`'s --state-dir and --save checks (train_state_dir.h).
//
// Note [a state directory that cannot trap]. Every way a --state-dir could stop a run late, or
// send the user round in a circle, is found before the first step and named with what to do:
//   - a second run on the same directory: the first holds its lock (the file "lock": flock(2) on
//     it, released by the kernel when the process ends, so a killed run leaves no stale lock; the
//     file says the holder's pid, host and start, for the message);
//   - a step-NNNNNNNN directory that is not a complete state (no state.json: a copy or a hand cut
//     it short; remat's own writes go through step-N.partial and a rename): the run would later
//     need its name for a state of its own. It is refused, named, with the command that moves it
//     away; remat does not delete what it did not write;
//   - states newer than the one resumed (states are never overwritten): named, with the choices;
//   - room: a state needs the space of one state beside the newest one kept. The keeper removes
//     the older of the two kept states before it writes the next (so one complete state remains
//     at every moment, and two are kept between writes), and checks the free space first, so a
//     full disk is an error before the write, not a partial state; here, before step 1, the same
//     check with the states that will be removed counted as free; and --save's weights likewise.
#include "train_state_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "io/atomic_file.h"
#include "train_report.h"
#include "usage.h"
#include "remat/nn/training_state.h"

namespace remat::tools::training {

namespace {

namespace fs = std::filesystem;

constexpr const char* kLockName = "lock";
constexpr uint64_t kHeaderAllowance = 16 * 1024;  // state.json, a filesystem's rounding of the files

// A UsageError unless a file can be created in `directory` (made if absent, with its parents, when `make`).
void check_directory(const std::string& option, const std::string& directory, bool make) {
  std::error_code ec;
  if (make) fs::create_directories(directory, ec);
  REMAT_USAGE_CHECK(!ec, "train ", option, ": cannot create the directory ", directory, ": ", ec.message());
  REMAT_USAGE_CHECK(fs::is_directory(directory, ec), "train ", option, ": ", directory, " is not a directory");
  try {
    io::AtomicFile probe((fs::path(directory) / ".remat-write-check").string(), "write check");
    probe.write("x", 1);
  } catch (const Error& e) {
    throw UsageError(detail::concat("train ", option, ": cannot write in ", directory, " (", e.what(),
                                    "); nothing was trained"));
  }
}

// The step-NNNNNNNN entries of `directory` (not .partial ones), complete states or not, by name.
struct StepEntries {
  std::map<std::string, fs::path> complete, incomplete;
};
StepEntries step_entries(const std::string& directory) {
  StepEntries e;
  std::error_code ec;
  for (fs::directory_iterator it(directory, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("step-", 0) != 0 || name.size() < 13 || name.find_first_not_of("0123456789", 5) != std::string::npos)
      continue;
    std::error_code e2;
    (fs::is_regular_file(it->path() / "state.json", e2) ? e.complete : e.incomplete)[name] = it->path();
  }
  return e;
}

std::string holder_of(int fd) {
  char text[512] = {};
  const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
  std::string s(text, n > 0 ? static_cast<size_t>(n) : 0);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  std::string joined;
  for (char c : s) joined += c == '\n' ? std::string(", ") : std::string(1, c);
  return joined.empty() ? "a process that has not yet said which" : joined;
}

std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "?";
  return host;
}

std::string now_text() {
  const std::time_t t = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return text;
}

void check_state_directory(const TrainOptions& o) {
  const StepEntries e = step_entries(o.state_dir);
  if (!e.incomplete.empty()) {
    std::string names, moves;
    for (const auto& [name, path] : e.incomplete) {
      names += detail::concat(names.empty() ? "" : ", ", path.string());
      moves += detail::concat(moves.empty() ? "" : "; ", "mv ", path.string(), " ", path.string(), ".damaged");
    }
    throw UsageError(detail::concat("train --state-dir ", o.state_dir, ": ", names, e.incomplete.size() > 1 ? " are" : " is",
                                    " not a complete training state (no state.json: it was copied or damaged, since remat "
                                    "writes a state under step-N.partial and renames it whole), and the run would need "
                                    "that name for a state of its own; nothing was trained. Move it away (", moves,
                                    ") or remove it, then run again"));
  }
  if (e.complete.empty()) return;
  const fs::path newest = e.complete.rbegin()->second;
  std::error_code ec;
  if (!o.resume_state.empty() && fs::equivalent(newest, o.resume_state, ec)) return;
  if (o.resume_state.empty())
    throw UsageError(detail::concat("train --state-dir ", o.state_dir, ": the directory holds the states of a run (the "
                                    "newest: ", newest.string(), "); continue that run with --resume ", o.state_dir,
                                    ", or pass another --state-dir"));
  std::string newer;
  for (auto it = e.complete.rbegin(); it != e.complete.rend() && !fs::equivalent(it->second, o.resume_state, ec); ++it)
    newer += detail::concat(newer.empty() ? "" : " ", it->second.string());
  throw UsageError(detail::concat("train --resume ", o.resume_state, ": ", o.state_dir, " holds states newer than it (",
                                  newer, "), and states are never overwritten; nothing was trained. Continue from the "
                                  "newest with --resume ", o.state_dir, ", or keep this one's continuation elsewhere "
                                  "(--state-dir ANOTHER), or move the newer ones away"));
}

}  // namespace

// ---- the lock

StateDirectoryLock::StateDirectoryLock(const std::string& directory) {
  const std::string path = (fs::path(directory) / kLockName).string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  REMAT_USAGE_CHECK(fd_ >= 0, "train --state-dir ", directory, ": cannot open its lock ", path, ": ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    const std::string holder = holder_of(fd_);
    ::close(fd_);
    fd_ = -1;
    REMAT_USAGE_CHECK(error != EWOULDBLOCK, "train --state-dir ", directory, ": another run is using it (", holder,
                      "); nothing was trained. Wait for it to end, stop it (SIGINT or SIGTERM: it writes its state and "
                      "exits; then continue with --resume ", directory, "), or pass another --state-dir");
    // a file system without locks (some network ones): the run goes on, unprotected, and says so
    std::fprintf(stderr, "remat train: warning: cannot lock %s (%s): a second run on %s would not be refused\n",
                 path.c_str(), std::strerror(error), directory.c_str());
    return;
  }
  const std::string text = detail::concat("pid ", ::getpid(), "\nhost ", host_name(), "\nsince ", now_text(), "\n");
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    // the lock holds without its text; only a second run's message would lack the pid
  }
}

StateDirectoryLock::~StateDirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

StateDirectoryLock::StateDirectoryLock(StateDirectoryLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

StateDirectoryLock& StateDirectoryLock::operator=(StateDirectoryLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

// ---- before anything is read

StateDirectoryLock check_writable(const TrainOptions& o, const DataParallel& dp) {
  StateDirectoryLock lock;
  if (!o.state_dir.empty()) {
    check_directory("--state-dir", o.state_dir, true);
    if (dp.rank == 0) lock = StateDirectoryLock(o.state_dir);
    check_state_directory(o);
  }
  if (!o.save.empty() && dp.rank == 0) {
    std::error_code ec;
    const fs::path save(o.save);
    if (o.format == "hf-gpt2" && fs::is_directory(save, ec)) {
      check_directory("--save", o.save, false);
    } else {
      const fs::path parent = save.has_parent_path() ? save.parent_path() : fs::path(".");
      REMAT_USAGE_CHECK(fs::is_directory(parent, ec), "train --save ", o.save, ": the directory ", parent.string(),
                        " does not exist; nothing was trained");
      check_directory("--save", parent.string(), false);
    }
  }
  return lock;
}

// ---- room

uint64_t free_bytes(const std::string& path) {
  struct statvfs s {};
  if (::statvfs(path.c_str(), &s) != 0) return UINT64_MAX;  // unknown: the write itself will tell
  return static_cast<uint64_t>(s.f_bavail) * static_cast<uint64_t>(s.f_frsize);
}

uint64_t directory_bytes(const std::string& path) {
  uint64_t total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e2;
    if (it->is_regular_file(e2)) total += static_cast<uint64_t>(it->file_size(e2));
  }
  return total;
}

uint64_t state_bytes_estimate(const Loaded& l) {
  uint64_t parameters = 0, tensors = 0, count = 0;
  for (const auto& [name, p] : l.model->named_parameters()) {
    parameters += p.nbytes();
    ++count;
  }
  for (const auto& [name, b] : l.model->named_buffers()) tensors += b.nbytes();
  // the model's tensors, AdamW's exp_avg and exp_avg_sq (float32, one each per parameter), headers
  return parameters + tensors + 2 * parameters + 3 * 256 * count + kHeaderAllowance;
}

void check_room_for_state(const std::string& directory, uint64_t needed) {
  const uint64_t free = free_bytes(directory);
  if (free >= needed) return;
  throw Error(detail::concat("not written: a state takes about ", needed, " bytes (", bytes_text(needed),
                             ") and the disk of ", directory, " has ", free, " (", bytes_text(free), ") free"));
}

void check_room(const TrainOptions& o, const DataParallel& dp, const Loaded& l) {
  if (dp.rank != 0) return;
  if (!o.state_dir.empty()) {
    const StepEntries e = step_entries(o.state_dir);
    uint64_t removed = 0;  // every state but the newest is removed before the first write
    if (e.complete.size() > 1)
      for (auto it = e.complete.begin(); std::next(it) != e.complete.end(); ++it) removed += directory_bytes(it->second.string());
    const uint64_t needed = state_bytes_estimate(l), free = free_bytes(o.state_dir);
    REMAT_USAGE_CHECK(free == UINT64_MAX || free + removed >= needed, "train --state-dir ", o.state_dir, ": a training "
                      "state of this run takes about ", needed, " bytes (", bytes_text(needed), "), and its disk has ",
                      free, " (", bytes_text(free), ") free", removed > 0 ? detail::concat(" (", removed, " more once "
                      "the older states are removed)") : "", "; nothing was trained. Free space or pass a --state-dir "
                      "on another disk (it needs room for two states: the newest kept and the next)");
  }
  if (!o.save.empty()) {
    uint64_t needed = kHeaderAllowance;
    const DType dtype = save_dtype(o);
    for (const auto& [name, p] : l.model->named_parameters()) needed += static_cast<uint64_t>(p.numel()) * dtype_size(dtype);
    const fs::path save(o.save);
    std::error_code ec;
    const std::string where = o.format == "hf-gpt2" && fs::is_directory(save, ec) ? o.save
                              : save.has_parent_path()                            ? save.parent_path().string()
                                                                                  : ".";
    const uint64_t free = free_bytes(where);
    REMAT_USAGE_CHECK(free >= needed, "train --save ", o.save, ": the weights take about ", needed, " bytes (",
                      bytes_text(needed), ") and the disk of ", where, " has ", free, " (", bytes_text(free),
                      ") free; nothing was trained. Free space or --save to another disk");
  }
}

}  // namespace remat::tools::training
