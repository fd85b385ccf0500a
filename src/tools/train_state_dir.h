// `remat train`'s --state-dir and --save, checked before the first step so that no run is lost at
// its end, and no directory traps the next run (Note [a state directory that cannot trap] in
// train_state_dir.cpp).
//
//   StateDirectoryLock lock = check_writable(o, dp);  // before anything is read or built
//   Loaded l = load(o, device);
//   Optimization opt(o, dp, *l.model);
//   check_room(o, dp, l);                             // the disks have room for a state and --save
#pragma once

#include <cstdint>
#include <string>

#include "commands.h"
#include "data_parallel.h"
#include "train_load.h"

namespace remat::tools::training {

// The lock of a --state-dir (its file "lock", with the holder's pid, host and start): one run at a
// time. flock(2): the kernel releases it when the process ends, however it ends. Empty (locking
// nothing) when default-constructed.
class StateDirectoryLock {
 public:
  StateDirectoryLock() = default;
  // A UsageError naming the other process (pid, host, start) when it holds the lock.
  explicit StateDirectoryLock(const std::string& directory);
  ~StateDirectoryLock();
  StateDirectoryLock(StateDirectoryLock&& other) noexcept;
  StateDirectoryLock& operator=(StateDirectoryLock&& other) noexcept;
  StateDirectoryLock(const StateDirectoryLock&) = delete;
  StateDirectoryLock& operator=(const StateDirectoryLock&) = delete;

 private:
  int fd_ = -1;
};

// Before anything is read or built: a UsageError when --save or --state-dir cannot be written to;
// the --state-dir locked (rank 0's lock; the other ranks' is empty), and refused when it holds a
// step directory that is not a complete state, or states newer than the one resumed.
StateDirectoryLock check_writable(const TrainOptions& o, const DataParallel& dp);

// Before the first step, on rank 0: a UsageError unless the --state-dir's disk has room for one
// state beside the newest kept one, and --save's for the weights.
void check_room(const TrainOptions& o, const DataParallel& dp, const Loaded& l);

// About the bytes of one training state of this run: the model's tensors, AdamW's two moments per
// parameter and the files' headers.
uint64_t state_bytes_estimate(const Loaded& l);
// The bytes free for this user on the disk that holds `path`; the sum of the files' sizes under a
// directory.
uint64_t free_bytes(const std::string& path);
uint64_t directory_bytes(const std::string& path);
// A remat::Error unless the disk of `directory` has `needed` bytes free: called before each state
// is written, after the older kept state was removed.
void check_room_for_state(const std::string& directory, uint64_t needed);

}  // namespace remat::tools::training
