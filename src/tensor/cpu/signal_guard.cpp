// Asynchronous signals held back around oneDNN's kernels (signal_guard.h).
//
// Note [signals and oneDNN's kernels]. oneDNN's float32 GEMM (Debian's libdnnl 2.6, and every
// release before 3.12) has "no-copy" JIT kernels, jit_avx512_common_gemm_f32 on AVX-512 and
// jit_avx_gemm_f32 on AVX/AVX2, chosen by dnnl_sgemm for most of remat's shapes (any product with a
// side under about 1000). Their packing buffer lives on the stack when k is small (k <= 84 on
// AVX-512, 252 on AVX2); for a larger k the kernel points the stack pointer, rsp, at a workspace
// that oneDNN took from the heap, and runs there. A signal delivered to the thread meanwhile has
// its frame written below rsp, that is over the heap in front of the workspace: malloc's headers
// and other objects. The process then aborts ("corrupted size vs. prev_size") or crashes, often
// much later, whatever the handler does, even an empty one. oneDNN fixed it in 3.12 (its kernels
// keep rsp on the stack); OpenBLAS's kernels keep rsp on the stack. Measured on this project's
// machine (AMD Zen 4, AVX-512): a program calling dnnl_sgemm (128 x 128, k = 512) under a 10 kHz
// SIGPROF timer aborted 6 runs of 6, the same with oneDNN limited to AVX2 likewise, k = 64 (the
// stack path) 0 of 6; the kernel's frame size only decides how far the damage reaches.
//
// So no asynchronous signal may be delivered to a thread while it runs such a kernel, whoever
// installed the handler (a program's Ctrl-C handler, a profiler's SIGPROF, remat train's stop):
//   - the calling thread blocks every asynchronous signal for the call and restores its mask
//     after (two system calls a product); a signal sent meanwhile waits, or goes to another
//     thread that does not block it;
//   - oneDNN runs the kernel on OpenMP's worker threads as well, inside its own parallel regions,
//     where nothing can be wrapped: the workers of the calling thread's OpenMP team block the
//     asynchronous signals for good. It is done once per team size, by a parallel region that
//     starts with the calling thread's mask already blocked, so that workers OpenMP creates for it
//     inherit the mask too.
// The synchronous signals a fault raises (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS) and
// SIGABRT stay unblocked: blocking them would turn a crash into a hang or hide it. An alternate
// signal stack (sigaltstack, SA_ONSTACK) would protect only the threads that have one and only the
// handlers installed with SA_ONSTACK: OpenMP's workers have none, and a profiler's handler is not
// ours to install.
#include "tensor/cpu/signal_guard.h"

#include <omp.h>
#include <pthread.h>

#include <initializer_list>

namespace remat::cpu {

namespace {

const sigset_t& asynchronous_signals() {
  static const sigset_t set = [] {
    sigset_t s;
    sigfillset(&s);
    for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS, SIGABRT}) sigdelset(&s, sig);
    return s;
  }();
  return set;
}

// The size of this thread's OpenMP team whose workers block them (each thread that starts
// parallel regions has a team of its own); whether this thread is such a worker (then a guard
// has nothing to do: no system calls on the products a parallel loop runs one per thread).
thread_local int protected_team = 1;
thread_local bool blocked_for_good = false;

void protect_workers() {
  if (omp_in_parallel()) return;  // a worker: its own mask is blocked for the call, oneDNN runs no team here
  const int team = omp_get_max_threads();
  if (team <= protected_team) return;
#pragma omp parallel num_threads(team)
  {
    if (omp_get_thread_num() != 0) {
      pthread_sigmask(SIG_BLOCK, &asynchronous_signals(), nullptr);
      blocked_for_good = true;
    }
  }
  protected_team = team;
}

}  // namespace

SignalsHeldBack::SignalsHeldBack() {
  if (blocked_for_good) return;
  restore_ = pthread_sigmask(SIG_BLOCK, &asynchronous_signals(), &previous_) == 0;
  protect_workers();
}

SignalsHeldBack::~SignalsHeldBack() {
  if (restore_) pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
}

}  // namespace remat::cpu
