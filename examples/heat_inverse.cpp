// heat_inverse: recover the initial temperature of a rod from its final temperature.
//
// The 1-D heat equation u_t = (k(u) u_x)_x, k(u) = 1 + u^2/2, on 256 cells (explicit finite
// differences, zero boundary values, r = dt/dx^2 = 0.3) is run for --steps steps through remat::scan with Revolve
// checkpointing (--snapshots slots), so the backward pass keeps a fixed number of states however
// long the simulation. Gradient descent on the initial condition reduces the misfit between the
// simulated and the observed final state. One gradient is also computed with every step stored
// (where memory allows) and compared bit for bit.
//
//   heat_inverse --steps 10000 --snapshots 16 --iterations 3 --json
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "remat/remat.h"
#include "remat/scan.h"

using namespace remat;

namespace {

constexpr int64_t kCells = 256;
constexpr double kR = 0.3;  // dt / dx^2; stable while r * max k(u) <= 0.5

// One explicit step of u_t = (k(u) u_x)_x with conductivity k(u) = 1 + u^2 / 2 (a nonlinear heat
// equation: the backward pass needs each step's state) and zero temperature outside the rod:
//   F_{i+1/2} = k((u_i + u_{i+1}) / 2) (u_{i+1} - u_i),   u_i += r (F_{i+1/2} - F_{i-1/2}).
Tensor heat_step(const Tensor& u) {
  Tensor zero = zeros({1}, u.dtype());
  Tensor padded = concat({zero, u, zero}, 0);             // [cells + 2]
  Tensor lo = padded.slice(0, 0, kCells + 1), hi = padded.slice(0, 1, kCells + 2);
  Tensor mid = mul_scalar(add(lo, hi), 0.5);                // [cells + 1]
  Tensor k = add_scalar(mul_scalar(square(mid), 0.5), 1.0);
  Tensor flux = mul(k, sub(hi, lo));
  Tensor divergence = sub(flux.slice(0, 1, kCells + 1), flux.slice(0, 0, kCells));
  return add(u, mul_scalar(divergence, kR));
}

Tensor true_initial_condition() {
  std::vector<double> v(kCells);
  for (int64_t i = 0; i < kCells; ++i) {
    double x = (static_cast<double>(i) + 0.5) / kCells;
    v[static_cast<size_t>(i)] = std::exp(-std::pow((x - 0.3) / 0.05, 2)) + 0.6 * std::exp(-std::pow((x - 0.7) / 0.08, 2)) +
                                (x > 0.45 && x < 0.55 ? 0.5 : 0.0);
  }
  return from_vector(v, {kCells}, DType::f64);
}

double norm(const Tensor& t) { return std::sqrt(sum(square(t)).item()); }

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.shape() == cb.shape() && std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 10000, iterations = 20;
  int snapshots = 16;
  double lr = 1.0;
  bool json = false;
  int64_t store_all_limit = 200000;
  CLI::App app{"heat_inverse: recover a rod's initial temperature through a checkpointed 1-D heat solver"};
  app.add_option("--steps", steps, "time steps")->capture_default_str();
  app.add_option("--snapshots", snapshots, "Revolve snapshot slots")->capture_default_str();
  app.add_option("--iterations", iterations, "gradient-descent iterations")->capture_default_str();
  app.add_option("--lr", lr, "gradient-descent step size")->capture_default_str();
  app.add_option("--store-all-limit", store_all_limit, "run the store-all comparison only up to this many steps")
      ->capture_default_str();
  app.add_flag("--json", json, "print one JSON object with the results as the last line");
  CLI11_PARSE(app, argc, argv);
  if (steps < 1 || snapshots < 1 || iterations < 0) {
    std::fprintf(stderr, "heat_inverse: --steps and --snapshots must be >= 1, --iterations >= 0\n");
    return 2;
  }
  try {
    auto t0 = std::chrono::steady_clock::now();
    auto step = [](const Tensor& u, int64_t) { return heat_step(u); };
    const ScanOptions revolve{ScanSchedule::revolve, snapshots};

    Tensor observed;
    {
      NoGradGuard no_grad;
      observed = scan(step, true_initial_condition(), steps, {ScanSchedule::store_all, 1});
    }
    // one step's internals: what a recorded step keeps beyond its input
    size_t step_internal_bytes;
    {
      Tensor u = zeros({kCells}, DType::f64).requires_grad_();
      size_t before = memory::live_bytes(memory::Tag::saved);
      Tensor v = heat_step(u);
      step_internal_bytes = memory::live_bytes(memory::Tag::saved) - before;
    }
    const size_t state_bytes = kCells * sizeof(double);

    Tensor u0 = zeros({kCells}, DType::f64);
    auto misfit_and_grad = [&](const Tensor& guess, const ScanOptions& options, size_t* peak_saved) {
      Tensor g = guess.detach().requires_grad_();
      memory::reset_peaks();
      size_t base = memory::live_bytes(memory::Tag::saved);
      Tensor final_state = scan(step, g, steps, options);
      Tensor residual = sub(final_state, observed);
      Tensor loss = mul_scalar(sum(square(residual)), 0.5);
      Tensor grad = remat::grad({loss}, {g})[0];
      if (peak_saved) *peak_saved = memory::peak_bytes(memory::Tag::saved) - base;
      return std::make_pair(norm(residual.detach()), grad);
    };

    size_t peak_saved = 0;
    auto [initial_residual, grad] = misfit_and_grad(u0, revolve, &peak_saved);
    ScanStats stats = last_scan_stats();
    double residual = initial_residual;
    std::printf("heat_inverse: %lld cells, %lld steps, %d snapshots; initial residual %.6e\n",
                static_cast<long long>(kCells), static_cast<long long>(steps), snapshots, initial_residual);
    for (int64_t it = 1; it <= iterations; ++it) {
      {
        NoGradGuard no_grad;
        u0 = sub(u0, mul_scalar(grad, lr));
      }
      auto result = misfit_and_grad(u0, revolve, &peak_saved);
      residual = result.first;
      grad = result.second;
      std::printf("  iteration %lld/%lld: residual %.6e (%.3fx the initial)\n", static_cast<long long>(it),
                  static_cast<long long>(iterations), residual, residual / initial_residual);
      std::fflush(stdout);
    }
    stats = last_scan_stats();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    // the same gradient with every step stored, timed against one checkpointed gradient
    bool compared = steps <= store_all_limit;
    bool equal = false;
    size_t store_all_peak = 0;
    double revolve_seconds = 0, store_all_seconds = 0;
    if (compared) {
      auto r0 = std::chrono::steady_clock::now();
      auto checkpointed = misfit_and_grad(u0, revolve, nullptr);
      revolve_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count();
      auto s0 = std::chrono::steady_clock::now();
      auto stored = misfit_and_grad(u0, {ScanSchedule::store_all, 1}, &store_all_peak);
      store_all_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
      equal = bitwise_equal(checkpointed.second, stored.second);
    }
    const size_t bound = static_cast<size_t>(snapshots + 1) * state_bytes + step_internal_bytes;
    std::printf("report\n");
    std::printf("  residual: %.6e -> %.6e (%.4fx) after %lld iterations\n", initial_residual, residual,
                residual / initial_residual, static_cast<long long>(iterations));
    std::printf("  forward steps per gradient: %lld (Revolve optimum %lld), recorded steps %lld\n",
                static_cast<long long>(stats.forward_steps), static_cast<long long>(stats.optimal_forward_steps),
                static_cast<long long>(stats.recorded_steps));
    std::printf("  peak saved bytes: %zu (bound (s+1)*state + internals = %zu); store-all: %zu (%.1fx)\n", peak_saved,
                bound, store_all_peak, peak_saved ? static_cast<double>(store_all_peak) / peak_saved : 0.0);
    if (compared)
      std::printf("  one gradient: revolve %.3f s, store-all %.3f s (%.2fx); bitwise equal: %s\n", revolve_seconds,
                  store_all_seconds, revolve_seconds / store_all_seconds, equal ? "yes" : "NO");
    if (json) {
      std::printf(
          "{\"steps\": %lld, \"snapshots\": %d, \"forward_steps\": %lld, \"optimal_forward_steps\": %lld, "
          "\"recorded_steps\": %lld, \"state_bytes\": %zu, \"step_internal_bytes\": %zu, \"peak_saved_bytes\": %zu, "
          "\"peak_saved_bound\": %zu, \"store_all_peak_saved_bytes\": %zu, \"grad_equal_to_store_all\": %s, "
          "\"initial_residual\": %.9e, \"final_residual\": %.9e, \"iterations\": %lld, \"gradient_seconds_revolve\": %.6f, "
          "\"gradient_seconds_store_all\": %.6f, \"seconds\": %.3f}\n",
          static_cast<long long>(steps), snapshots, static_cast<long long>(stats.forward_steps),
          static_cast<long long>(stats.optimal_forward_steps), static_cast<long long>(stats.recorded_steps), state_bytes,
          step_internal_bytes, peak_saved, bound, store_all_peak, compared ? (equal ? "true" : "false") : "null",
          initial_residual, residual, static_cast<long long>(iterations), revolve_seconds, store_all_seconds, seconds);
    }
    return compared && !equal ? 1 : 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "heat_inverse: error: %s\n", e.what());
    return 1;
  }
}
