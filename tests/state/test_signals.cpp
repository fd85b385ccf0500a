// Signals during remat's matrix products corrupt nothing (Note [signals and oneDNN's kernels] in
// src/tensor/cpu/signal_guard.cpp): a program with a handler of its own, under a profiler-like
// SIGPROF timer or a stream of signals sent with kill() (which the kernel may deliver to any
// thread, OpenMP's workers included), runs forward and backward products whose k takes oneDNN's
// kernels onto a heap workspace, and gets the bits of the same products run without signals. On a
// library that lets the signals in, these tests end in heap corruption (abort or crash).
#include <gtest/gtest.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "remat/autodiff.h"
#include "remat/checkpoint.h"
#include "remat/ops.h"
#include "remat/random.h"

using namespace remat;

namespace {

std::atomic<int64_t> handled{0};
extern "C" void count_signal(int) { handled.fetch_add(1, std::memory_order_relaxed); }

// A forward and backward of products of [64, 512] x [512, 96] (k = 512: oneDNN's heap-workspace
// path on AVX-512 and on AVX2) and their transposes; the gradients' and the output's bytes.
std::vector<float> products(int repeats) {
  std::vector<float> out;
  for (int r = 0; r < repeats; ++r) {
    Tensor x = randn({64, 512}, DType::f32, RngState{7, 0});
    Tensor w = randn({512, 96}, DType::f32, RngState{8, 0});
    x.requires_grad_();
    w.requires_grad_();
    Tensor y = backward([&] { return sum(square(matmul(x, w))); }, GradOptions{Policy::save_all()});
    if (r + 1 == repeats) {
      out = x.grad().contiguous().to_vector_as<float>();
      const std::vector<float> gw = w.grad().contiguous().to_vector_as<float>();
      out.insert(out.end(), gw.begin(), gw.end());
      out.push_back(static_cast<float>(y.item()));
    }
  }
  return out;
}

void start_workers() {
  // the OpenMP workers exist, with the signals unblocked, before remat's first product: what a
  // program that used OpenMP first has
#pragma omp parallel num_threads(std::max(2, omp_get_max_threads()))
  { (void)omp_get_thread_num(); }
}

void install(int sig) {
  struct sigaction action {};
  action.sa_handler = count_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ASSERT_EQ(sigaction(sig, &action, nullptr), 0);
}

}  // namespace

TEST(Signals, AProfilersTimerDuringProductsCorruptsNothing) {
  start_workers();
  const std::vector<float> quiet = products(2);
  install(SIGPROF);
  handled = 0;
  itimerval every{{0, 200}, {0, 200}};  // 5 kHz of CPU time
  ASSERT_EQ(setitimer(ITIMER_PROF, &every, nullptr), 0);
  const std::vector<float> loud = products(150);
  itimerval off{};
  setitimer(ITIMER_PROF, &off, nullptr);
  EXPECT_GT(handled.load(), 10) << "the timer hardly fired: the test proves little";
  ASSERT_EQ(quiet.size(), loud.size());
  EXPECT_EQ(std::memcmp(quiet.data(), loud.data(), quiet.size() * sizeof(float)), 0);
  // the heap is whole: allocations of every size still work after the storm
  for (int i = 0; i < 1000; ++i) {
    std::vector<char> v(static_cast<size_t>(64 + 97 * i));
    v.front() = v.back() = 1;
  }
}

TEST(Signals, SignalsSentToTheProcessDuringProductsCorruptNothing) {
  start_workers();
  const std::vector<float> quiet = products(2);
  install(SIGUSR1);
  handled = 0;
  // the sender blocks SIGUSR1 itself, so the kernel delivers it to one of the computing threads
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  std::atomic<bool> stop{false};
  std::thread sender([&] {
    pthread_sigmask(SIG_BLOCK, &usr1, nullptr);
    while (!stop.load()) {
      kill(getpid(), SIGUSR1);
      std::this_thread::sleep_for(std::chrono::microseconds(150));
    }
  });
  const std::vector<float> loud = products(150);
  stop = true;
  sender.join();
  EXPECT_GT(handled.load(), 10);
  ASSERT_EQ(quiet.size(), loud.size());
  EXPECT_EQ(std::memcmp(quiet.data(), loud.data(), quiet.size() * sizeof(float)), 0);
}
