// Issue 54, "Also": a global Tensor still holding history at exit (a use-after-free at exit), and
// a user layer's registered buffer updated in forward_impl (written again in every
// recomputation unless the layer skips it while is_recomputing()).
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "never_silent.h"

using namespace remat;
using namespace remat::never_silent;

namespace {

Tensor mse(const Tensor& a) { return mean(square(a)); }

class Chain3 : public nn::Module {
 public:
  Chain3() {
    for (int i = 0; i < 3; ++i) layers.push_back(register_module("l" + std::to_string(i), std::make_shared<Block>()));
  }
  Tensor forward_impl(const Tensor& x) override {
    Tensor h = x;
    for (auto& l : layers) h = l->forward(h);
    return h;
  }
  std::vector<std::shared_ptr<Block>> layers;
};

// A global Tensor, destroyed after main returns, with everything the library destroys then.
Tensor global_loss;

// Valgrind where it is installed, but not over a sanitizer build (AddressSanitizer sees the same
// invalid access in the plain child run).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

bool have_valgrind() { return !kSanitized && std::system("valgrind --version > /dev/null 2>&1") == 0; }

// Runs this test binary's child test (below) under `policy`, under valgrind where it is
// installed: its exit status.
// glibc's loader reads a string of an $ORIGIN rpath with a wide strncmp when a library is opened
// at run time (the CUDA build's driver probe): valgrind reports it; it is not remat's.
std::string loader_suppressions() {
  const std::string path = program_fuzz::scratch_directory() + "/loader.supp";
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return "";
  std::fputs("{\n  loader-rpath-strncmp\n  Memcheck:Addr8\n  fun:strncmp\n  fun:is_dst\n}\n", f);
  std::fclose(f);
  return " --suppressions=" + path;
}

int run_child(const std::string& policy, bool valgrind) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return -1;
  self[n] = '\0';
  const std::string command = (valgrind ? "valgrind -q --error-exitcode=99 --leak-check=no" + loader_suppressions() + " "
                                        : std::string()) +
                              "'" + self + "' --gtest_also_run_disabled_tests "
                              "--gtest_filter=NeverSilentExit.DISABLED_ChildKeepsAGlobalTensor > /dev/null 2>&1";
  setenv("REMAT_NEVER_SILENT_POLICY", policy.c_str(), 1);
  const int status = std::system(command.c_str());
  unsetenv("REMAT_NEVER_SILENT_POLICY");
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

// Run only as the child of the test below: keeps a loss with its whole history in a global
// Tensor and returns, so that the history is destroyed at exit.
TEST(NeverSilentExit, DISABLED_ChildKeepsAGlobalTensor) {
  const char* policy = std::getenv("REMAT_NEVER_SILENT_POLICY");
  ASSERT_NE(policy, nullptr);
  auto model = std::make_shared<Chain3>();
  ScopedPolicy scoped(program_fuzz::policy_text(policy, {4096, 8192, 16384, 8192}, program_fuzz::scratch_directory()));
  // a step whose graph is dropped without a backward pass, as a program that evaluates does
  mse(model->forward(randn({3, kWidth}, DType::f32, RngState{1, 0})));
  global_loss = mse(model->forward(randn({3, kWidth}, DType::f32, RngState{2, 0})));
}

TEST(NeverSilentExit, AGlobalTensorHoldingHistoryAtExitIsNoUseAfterFree) {
  const bool valgrind = have_valgrind();
  for (const std::string policy : {"save-all", "every-layer", "every-k:2", "budget:auto", "dynamic", "offload"}) {
    EXPECT_EQ(run_child(policy, false), 0) << policy;
    if (valgrind && policy == "every-layer")  // (about 20 s; the ASan build sees it in every run)
      EXPECT_EQ(run_child(policy, true), 0) << policy << " under valgrind (99: valgrind found an invalid access)";
  }
}

namespace {

// A layer that counts its calls in a registered buffer, in forward_impl; `guarded` skips the
// write while recomputing (the guide's rule 4), else it is written in every recomputation.
class Counting : public nn::Module {
 public:
  explicit Counting(bool guarded) : guarded_(guarded) {
    fc = register_module("fc", std::make_shared<nn::Linear>(kWidth, kWidth));
    calls = register_buffer("calls", zeros({1}));
    level = register_buffer("level", zeros({kWidth}));
  }
  Tensor forward_impl(const Tensor& x) override {
    if (!guarded_ || !is_recomputing()) {
      NoGradGuard no_grad;
      calls.copy_(add_scalar(calls, 1.0));
      level.copy_(add(mul_scalar(level, 0.9), mean(x.detach(), {0})));
    }
    return tanh(fc->forward(x));
  }
  std::shared_ptr<nn::Linear> fc;
  Tensor calls, level;

 private:
  bool guarded_;
};

class CountingModel : public nn::Module {
 public:
  explicit CountingModel(bool guarded) {
    for (int i = 0; i < 3; ++i)
      layers.push_back(register_module("l" + std::to_string(i), std::make_shared<Counting>(guarded)));
  }
  Tensor forward_impl(const Tensor& x) override {
    Tensor h = x;
    for (auto& l : layers) h = l->forward(h);
    return h;
  }
  std::vector<std::shared_ptr<Counting>> layers;
};

Body counting_body(bool guarded) {
  return [guarded](Recorder& rec) {
    auto model = std::make_shared<CountingModel>(guarded);
    train(
        rec, model, {}, [&](Recorder&, const Tensor& x, int) { return mse(model->forward(x)); },
        [&](Recorder& r, const Tensor& loss, int) {
          loss.backward();
          for (const auto& [name, t] : model->named_buffers()) r.value("buffer." + name, t, false);
        });
  };
}

}  // namespace

// A layer that writes its registered buffers in forward_impl without the is_recomputing() guard: a
// recomputation runs the layer's ops, never its forward_impl, so the buffers are written once per
// step under every policy, as under save-all (nothing is written during a recomputation).
TEST(NeverSilentState, ABufferWrittenInForwardIsWrittenOncePerStepUnderEveryPolicy) {
  expect_matches_save_all(counting_body(false));
}

TEST(NeverSilentState, ABufferWrittenOnlyOutsideRecomputationMatchesSaveAll) {
  expect_matches_save_all(counting_body(true));
}
