// `remat train`'s stop signals (train_signals.h).
//
// Note [stopping on a signal]. SIGINT and SIGTERM are blocked in every thread that computes (the
// main thread, its OpenMP workers, and the threads MPI and OpenMP start later, which inherit the
// mask) and taken by one thread of their own with sigwait: no handler ever runs on a computing
// thread's stack. That matters: oneDNN's GEMM kernels run with the stack pointer in the heap
// (Note [signals and oneDNN's kernels] in src/tensor/cpu/signal_guard.cpp), and a handler
// delivered there wrote its frame over malloc's data, which crashed 5 of 30 signalled runs. An
// alternate signal stack was the other way: it protects only the threads that have one, and
// OpenMP's workers, which run the same kernels, have none. The threads started before the mask
// could be set (OpenBLAS starts its pool when the library loads) may still take the signal: they
// find a handler that does what the waiting thread does, and they run no oneDNN kernel. The first
// signal only records its number; a second ends the process at once with the signal's default
// action. The step loop reads the number after each step (and again after a state write, so a
// signal during the write stops the run on that state); under mpirun the ranks agree on it (an
// all-gather per step), so every rank stops after the same step and writes its part of one state.
// The run then exits with 128 + the signal's number (130 for SIGINT, 143 for SIGTERM), as a shell
// reports a process ended by it. A test hook, REMAT_TEST_PAUSE_AFTER_STEP=N, holds the run after
// step N (its JSON line written) until a signal arrives, at most a minute, for tests that need a
// stop after exactly that step; tests/state/run.sh signals also runs at random times, during the
// steps' compute.
#include "train_signals.h"

#include <omp.h>
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "remat/remat.h"

namespace remat::tools::training {

namespace {

std::atomic<int> stop_signal{0};

// The first stop signal is recorded; a second ends the process at once, as the signal's default
// action does (the caller has it unblocked: the waiting thread unblocks it first).
void take_stop_signal(int sig) {
  int none = 0;
  if (stop_signal.compare_exchange_strong(none, sig)) return;
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

// For the threads that were running before the signals could be blocked (OpenBLAS starts its
// pool when the library loads, before main): they run no oneDNN kernel. Async-signal-safe.
extern "C" void on_stop_signal(int sig) { take_stop_signal(sig); }

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

struct sigaction previous_int, previous_term;

}  // namespace

StopSignals::StopSignals() {
  stop_signal = 0;
  const sigset_t set = stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, &previous_mask_);
  // the OpenMP workers that exist already (those started later inherit this thread's mask)
  const int team = std::max(omp_get_max_threads(), num_threads());
#pragma omp parallel num_threads(team)
  {
    if (omp_get_thread_num() != 0) pthread_sigmask(SIG_BLOCK, &set, nullptr);
  }
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, &previous_int);
  sigaction(SIGTERM, &action, &previous_term);
  waiter_ = std::thread([this, set] {
    while (!done_.load()) {
      const timespec tick{0, 50 * 1000 * 1000};
      const int sig = sigtimedwait(&set, nullptr, &tick);
      if (sig <= 0) continue;
      if (stop_signal.load() != 0) {  // the second: this thread ends the process
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, sig);
        pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
      }
      take_stop_signal(sig);
    }
  });
}

StopSignals::~StopSignals() {
  done_ = true;
  waiter_.join();
  sigaction(SIGINT, &previous_int, nullptr);
  sigaction(SIGTERM, &previous_term, nullptr);
  pthread_sigmask(SIG_SETMASK, &previous_mask_, nullptr);
}

int StopSignals::received() { return stop_signal.load(); }

// Note [stopping on a signal]: the test hook.
void pause_for_test(int64_t done) {
  static const int64_t pause_at = [] {
    const char* text = std::getenv("REMAT_TEST_PAUSE_AFTER_STEP");
    return text == nullptr ? int64_t{-1} : static_cast<int64_t>(std::strtoll(text, nullptr, 10));
  }();
  if (done != pause_at) return;
  for (int i = 0; i < 6000 && StopSignals::received() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

}  // namespace remat::tools::training
