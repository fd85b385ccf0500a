// Internal: asynchronous signals held back while oneDNN's kernels run, in the calling thread and,
// for good, in its OpenMP workers. Note [signals and oneDNN's kernels] in signal_guard.cpp.
//
//   {
//     SignalsHeldBack held;                 // a signal sent now is delivered when `held` ends
//     dnnl_sgemm('N', 'N', m, n, k, ...);  // (or to a thread that runs no oneDNN kernel)
//   }
#pragma once

#include <csignal>

namespace remat::cpu {

class SignalsHeldBack {
 public:
  SignalsHeldBack();
  ~SignalsHeldBack();
  SignalsHeldBack(const SignalsHeldBack&) = delete;
  SignalsHeldBack& operator=(const SignalsHeldBack&) = delete;

 private:
  sigset_t previous_;
  bool restore_ = false;
};

}  // namespace remat::cpu
