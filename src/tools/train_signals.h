// `remat train`'s stop on SIGINT or SIGTERM (with --state-dir): the step loop stops after the
// step, the state is written, the run exits 130 or 143. Note [stopping on a signal] in
// train_signals.cpp.
//
//   StopSignals signals;                       // before MPI starts its threads
//   ... after each step: if (StopSignals::received() != 0) { write the state; stop }
#pragma once

#include <atomic>
#include <csignal>
#include <cstdint>
#include <thread>

namespace remat::tools::training {

// SIGINT and SIGTERM while it lives: blocked in the computing threads and taken by a thread of
// its own; the first sets a flag (the step loop stops after the step and writes the state), a
// second ends the process at once. Made before MPI starts its threads, which then inherit the
// mask. Note [stopping on a signal].
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  static int received();  // the first signal's number, or 0

 private:
  sigset_t previous_mask_;
  std::atomic<bool> done_{false};
  std::thread waiter_;
};

// The test hook of Note [stopping on a signal]: after step `done`, holds the run until a signal
// arrives (at most a minute) when REMAT_TEST_PAUSE_AFTER_STEP names that step.
void pause_for_test(int64_t done);

}  // namespace remat::tools::training
