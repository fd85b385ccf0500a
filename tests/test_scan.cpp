// remat::scan and remat::while_loop: gradients bitwise equal to the unrolled loop under save-all,
// the count of step evaluations equal to Revolve's optimum, and the memory bound.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint_models.h"
#include "remat/scan.h"
#include "remat/schedule.h"

using namespace remat;
using remat::testing::bitwise_equal;

namespace {

// A nonlinear step with a captured parameter and dropout: h -> tanh(h @ w + b) with dropout.
struct Loop {
  Tensor w, b, h0;
  explicit Loop(DType dtype, int width = 8, int batch = 3) {
    w = randn({width, width}, dtype, RngState{1, 0}, 0.0, 0.4).requires_grad_();
    b = randn({width}, dtype, RngState{2, 0}, 0.0, 0.1).requires_grad_();
    h0 = randn({batch, width}, dtype, RngState{3, 0}).requires_grad_();
  }
  ScanStep step(bool with_dropout) const {
    Tensor w_ = w, b_ = b;
    return [w_, b_, with_dropout](const Tensor& h, int64_t) {
      Tensor y = tanh(add(matmul(h, w_), b_));
      return with_dropout ? dropout(y, 0.1) : y;
    };
  }
  TensorList grads(int64_t n, const ScanOptions& options, bool with_dropout) const {
    manual_seed(99);
    Tensor out = scan(step(with_dropout), h0, n, options);
    return remat::grad({sum(out)}, {w, b, h0});
  }
};

void expect_bitwise(const TensorList& a, const TensorList& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bitwise_equal(a[i], b[i])) << "gradient " << i;
}

}  // namespace

TEST(Scan, RevolveGradientsEqualTheUnrolledLoopBitwise) {
  for (DType dtype : {DType::f32, DType::f64}) {
    Loop loop(dtype);
    for (int64_t n : {1, 2, 7, 30}) {
      TensorList reference = loop.grads(n, {ScanSchedule::store_all, 1}, true);
      for (int s : {1, 2, 3, 5, 40}) {
        SCOPED_TRACE("n=" + std::to_string(n) + " s=" + std::to_string(s));
        expect_bitwise(loop.grads(n, {ScanSchedule::revolve, s}, true), reference);
      }
    }
  }
}

TEST(Scan, ForwardStepCountEqualsRevolvesOptimum) {
  Loop loop(DType::f32);
  for (int64_t n : {1, 5, 17, 64, 100}) {
    for (int s : {1, 2, 3, 4, 8}) {
      loop.grads(n, {ScanSchedule::revolve, s}, false);
      ScanStats stats = last_scan_stats();
      EXPECT_EQ(stats.forward_steps, schedule::revolve_optimal_forward_steps(n, s)) << "n=" << n << " s=" << s;
      EXPECT_EQ(stats.optimal_forward_steps, schedule::revolve_optimal_forward_steps(n, s));
      EXPECT_EQ(stats.recorded_steps, n);
    }
  }
}

TEST(Scan, PeakSavedBytesWithinTheBound) {
  Loop loop(DType::f32, 64, 32);
  const int64_t n = 200;
  // one step's internals, measured: what a recorded step keeps beyond its input
  size_t internals;
  {
    Tensor h = randn({32, 64}, DType::f32, RngState{5, 0});
    size_t before = memory::live_bytes(memory::Tag::saved);
    Tensor y = loop.step(false)(h, 0);
    internals = memory::live_bytes(memory::Tag::saved) - before;
  }
  const size_t state = 32 * 64 * sizeof(float);
  for (int s : {2, 4, 8}) {
    memory::reset_peaks();
    size_t base = memory::live_bytes(memory::Tag::saved);
    Tensor out = scan(loop.step(false), loop.h0, n, {ScanSchedule::revolve, s});
    remat::grad({sum(out)}, {loop.w});
    size_t peak = memory::peak_bytes(memory::Tag::saved) - base;
    EXPECT_LE(peak, (s + 1) * state + internals) << "s=" << s;
  }
  // store-all keeps every step
  memory::reset_peaks();
  size_t base = memory::live_bytes(memory::Tag::saved);
  Tensor out = scan(loop.step(false), loop.h0, n, {ScanSchedule::store_all, 1});
  EXPECT_GE(memory::live_bytes(memory::Tag::saved) - base, n * state);
}

TEST(Scan, WhileLoopOnlineMatchesUnrolledAndStaysWithinTheOnlineBound) {
  Loop loop(DType::f64);
  for (int64_t n : {1, 3, 20, 75}) {
    auto cond = [n](const Tensor&, int64_t t) { return t < n; };
    manual_seed(5);
    Tensor ref_out = while_loop(cond, loop.step(true), loop.h0, {ScanSchedule::store_all, 1});
    TensorList reference = remat::grad({sum(ref_out)}, {loop.w, loop.b, loop.h0});
    for (int s : {1, 2, 4}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " s=" + std::to_string(s));
      manual_seed(5);
      Tensor out = while_loop(cond, loop.step(true), loop.h0, {ScanSchedule::online, s});
      expect_bitwise(remat::grad({sum(out)}, {loop.w, loop.b, loop.h0}), reference);
      ScanStats stats = last_scan_stats();
      EXPECT_EQ(stats.steps, n);
      // online: at most one sweep more than offline Revolve (the n forward steps of the loop itself)
      EXPECT_LE(stats.forward_steps, n + schedule::revolve_optimal_forward_steps(n, s));
    }
  }
}

TEST(Scan, ParameterOnlyGradientsWhenTheInitialStateIsConstant) {
  Loop loop(DType::f64);
  Tensor h0 = loop.h0.detach();
  Tensor ref = scan(loop.step(false), h0, 12, {ScanSchedule::store_all, 1});
  Tensor reference = remat::grad({sum(ref)}, {loop.w})[0];
  Tensor out = scan(loop.step(false), h0, 12, {ScanSchedule::revolve, 3});
  EXPECT_TRUE(bitwise_equal(remat::grad({sum(out)}, {loop.w})[0], reference));
}

// A second backward pass through a loop under revolve or online: the error a freed graph gives
// (it returned 0 silently before), and with retain_graph an error too; store_all, the loop as
// written, runs again with the same gradient.
TEST(Scan, ASecondBackwardIsAnErrorUnderRevolveAndOnline) {
  Loop loop(DType::f64);
  auto run = [&](ScanSchedule schedule) {
    return schedule == ScanSchedule::online
               ? while_loop([](const Tensor&, int64_t t) { return t < 12; }, loop.step(false), loop.h0, {schedule, 3})
               : scan(loop.step(false), loop.h0, 12, {schedule, 3});
  };
  for (ScanSchedule schedule : {ScanSchedule::revolve, ScanSchedule::online}) {
    SCOPED_TRACE(schedule == ScanSchedule::online ? "online" : "revolve");
    Tensor loss = sum(run(schedule));
    const TensorList first = remat::grad({loss}, {loop.w});
    try {
      remat::grad({loss}, {loop.w});
      ADD_FAILURE() << "a second backward pass gave a gradient";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("already freed"), std::string::npos) << e.what();
    }
    Tensor retained = sum(run(schedule));
    expect_bitwise(remat::grad({retained}, {loop.w}, {}, /*retain_graph=*/true), first);
    try {
      remat::grad({retained}, {loop.w}, {}, true);
      ADD_FAILURE() << "a second backward pass with retain_graph gave a gradient";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("store_all"), std::string::npos) << e.what();
    }
  }
  Tensor kept = sum(run(ScanSchedule::store_all));
  const TensorList once = remat::grad({kept}, {loop.w}, {}, true);
  expect_bitwise(remat::grad({kept}, {loop.w}), once);
}

TEST(Scan, BadArgumentsAreErrors) {
  Loop loop(DType::f32);
  EXPECT_THROW(scan(loop.step(false), loop.h0, -1), Error);
  EXPECT_THROW(scan(loop.step(false), loop.h0, 4, {ScanSchedule::revolve, 0}), Error);
  EXPECT_THROW(scan(loop.step(false), loop.h0, 4, {ScanSchedule::online, 2}), Error);
  auto bad = [](const Tensor& h, int64_t) { return h.reshape({-1}); };
  EXPECT_THROW(scan(bad, loop.h0, 4, {ScanSchedule::revolve, 2}), Error);
}

// ---- a loop checks what it recomputes (Note [a loop checks what it recomputes], scan.cpp)

namespace {

// A loop whose step reads `*scale` (a captured scalar) and bumps `*counter` each time it runs.
struct ImpureLoop {
  Loop loop{DType::f64};
  ScanStep step(const double* scale, const int* counter_scale, int* counter) const {
    Tensor w = loop.w, b = loop.b;
    return [w, b, scale, counter_scale, counter](const Tensor& h, int64_t) {
      const double bump = 1.0 + 1e-3 * static_cast<double>(*counter_scale) * static_cast<double>((*counter)++);
      return tanh(mul_scalar(add(matmul(h, w), b), *scale * bump));
    };
  }
  // The gradients of sum(loop(h0)) under `options` (a while_loop for the online schedule), with
  // `between` run between the loop and the backward pass; or the error.
  std::string grads(const ScanOptions& options, const std::function<void()>& between, const double* scale,
                    const int* counter_scale, int* counter, TensorList& out) const {
    const int64_t n = 40;
    Tensor last = options.schedule == ScanSchedule::online
                      ? while_loop([n](const Tensor&, int64_t t) { return t < n; }, step(scale, counter_scale, counter),
                                   loop.h0, options)
                      : scan(step(scale, counter_scale, counter), loop.h0, n, options);
    between();
    try {
      out = remat::grad({sum(last)}, {loop.w, loop.b, loop.h0});
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

}  // namespace

TEST(ScanCheck, AScalarChangedAfterTheLoopIsAnErrorNamingTheStepUnderRevolveAndOnline) {
  ImpureLoop impure;
  int counter = 0;
  const int no_counter = 0;
  double scale = 0.9;
  TensorList store_all;
  ASSERT_EQ(impure.grads({ScanSchedule::store_all, 1}, [&] { scale = 1.3; }, &scale, &no_counter, &counter, store_all), "");
  for (const ScanOptions& options : {ScanOptions{ScanSchedule::revolve, 3}, ScanOptions{ScanSchedule::revolve, 1},
                                     ScanOptions{ScanSchedule::online, 4}}) {
    scale = 0.9;
    TensorList got;
    const std::string error = impure.grads(options, [&] { scale = 1.3; }, &scale, &no_counter, &counter, got);
    const std::string loop = options.schedule == ScanSchedule::online ? "while_loop" : "scan";
    EXPECT_NE(error.find(loop + ", step "), std::string::npos) << error;
    EXPECT_NE(error.find("first run"), std::string::npos) << error;
    EXPECT_NE(error.find("captured"), std::string::npos) << error;
    // unchanged, the same loop gives store_all's gradients
    scale = 0.9;
    ASSERT_EQ(impure.grads(options, [] {}, &scale, &no_counter, &counter, got), "");
    expect_bitwise(got, store_all);
  }
}

TEST(ScanCheck, AnImpureCounterIsAnError) {
  ImpureLoop impure;
  const double scale = 1.0;
  const int counting = 1;
  for (const ScanOptions& options : {ScanOptions{ScanSchedule::revolve, 4}, ScanOptions{ScanSchedule::online, 2}}) {
    int counter = 0;
    TensorList got;
    const std::string error = impure.grads(options, [] {}, &scale, &counting, &counter, got);
    EXPECT_NE(error.find(", step "), std::string::npos) << "no error, or another: '" << error << "'";
  }
}

// The other two impurities of the layer-level tests: a private generator, and dropout switched off
// (train to eval) between the loop and the backward pass.
TEST(ScanCheck, APrivateGeneratorAndDropoutSwitchedOffAreErrors) {
  Loop loop(DType::f32);
  for (const ScanOptions& options : {ScanOptions{ScanSchedule::revolve, 3}, ScanOptions{ScanSchedule::online, 3}}) {
    auto run = [&](const ScanStep& step, const std::function<void()>& between) -> std::string {
      Tensor out = options.schedule == ScanSchedule::online
                       ? while_loop([](const Tensor&, int64_t t) { return t < 25; }, step, loop.h0, options)
                       : scan(step, loop.h0, 25, options);
      between();
      try {
        remat::grad({sum(out)}, {loop.w});
      } catch (const Error& e) {
        return e.what();
      }
      return "";
    };
    std::mt19937 private_rng(4);
    Tensor w = loop.w;
    const std::string generator = run(
        [w, &private_rng](const Tensor& h, int64_t) {
          return tanh(add_scalar(matmul(h, w), static_cast<double>(private_rng() % 100) / 100.0));
        },
        [] {});
    EXPECT_NE(generator.find(", step "), std::string::npos) << "no error, or another: '" << generator << "'";
    bool training = true;
    const std::string switched = run(
        [w, &training](const Tensor& h, int64_t) { return dropout(tanh(matmul(h, w)), 0.3, training); },
        [&training] { training = false; });
    EXPECT_NE(switched.find(", step "), std::string::npos) << "no error, or another: '" << switched << "'";
  }
}

// Without the check the difference would pass silently: it is the check that catches it.
TEST(ScanCheck, TurnedOffTheChangedScalarGoesUnnoticed) {
  ImpureLoop impure;
  int counter = 0;
  const int no_counter = 0;
  double scale = 0.9;
  TensorList store_all, got;
  ASSERT_EQ(impure.grads({ScanSchedule::store_all, 1}, [&] { scale = 1.3; }, &scale, &no_counter, &counter, store_all), "");
  set_recomputation_check(false);
  scale = 0.9;
  const std::string error = impure.grads({ScanSchedule::revolve, 3}, [&] { scale = 1.3; }, &scale, &no_counter, &counter, got);
  set_recomputation_check(true);
  ASSERT_EQ(error, "");
  bool all_equal = true;
  for (size_t i = 0; i < got.size(); ++i) all_equal = all_equal && bitwise_equal(got[i], store_all[i]);
  EXPECT_FALSE(all_equal);
}

// A backward pass that ran a recomputing loop under a recomputing policy (the default every-layer)
// and met no layer: the loop did recompute, so no warning that nothing was (it would be false).
TEST(ScanCheck, ABackwardThatRanALoopGivesNoFalseWarning) {
  std::vector<std::string> warnings;
  set_warning_handler([&warnings](const std::string& w) { warnings.push_back(w); });
  std::thread([] {  // a thread of its own: the warning is given once per thread
    Loop loop(DType::f32);
    for (const ScanOptions& options : {ScanOptions{ScanSchedule::revolve, 2}, ScanOptions{ScanSchedule::online, 2}}) {
      Tensor out = options.schedule == ScanSchedule::online
                       ? while_loop([](const Tensor&, int64_t t) { return t < 9; }, loop.step(false), loop.h0, options)
                       : scan(loop.step(false), loop.h0, 9, options);
      sum(out).backward();
    }
  }).join();
  set_warning_handler(nullptr);
  EXPECT_TRUE(warnings.empty()) << warnings.front();
}
