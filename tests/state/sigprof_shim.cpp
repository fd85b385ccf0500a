// A profiler's signals in a program that does not know about them: preloaded into `remat train`
// (LD_PRELOAD) by tests/state/run.sh, it installs a SIGPROF handler that counts and a 1 kHz
// ITIMER_PROF timer as the program starts, as gperftools' CPU profiler does, and prints the count
// to stderr as the program ends.
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace {

std::atomic<long> taken{0};

extern "C" void on_sigprof(int) { taken.fetch_add(1, std::memory_order_relaxed); }

struct Profiler {
  Profiler() {
    struct sigaction action {};
    action.sa_handler = on_sigprof;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGPROF, &action, nullptr);
    const long usec = std::getenv("REMAT_TEST_SIGPROF_USEC") ? std::atol(std::getenv("REMAT_TEST_SIGPROF_USEC")) : 1000;
    itimerval every{{0, usec}, {0, usec}};
    setitimer(ITIMER_PROF, &every, nullptr);
  }
  ~Profiler() {
    itimerval off{};
    setitimer(ITIMER_PROF, &off, nullptr);
    std::fprintf(stderr, "sigprof shim: %ld SIGPROF taken\n", taken.load());
  }
} profiler;

}  // namespace
