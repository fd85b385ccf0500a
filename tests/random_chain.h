// A random heterogeneous chain for the planner tests and bench/bench_planner.cpp: forward times
// 0.5..4, backward times 0.5..4 times the forward, boundaries 100..2000 bytes, records
// 200..8000 bytes.
#pragma once

#include <random>

#include "remat/schedule.h"

inline remat::schedule::ChainCosts random_chain(int stages, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> time(0.5, 4.0);
  std::uniform_int_distribution<size_t> boundary(100, 2000), saved(200, 8000);
  remat::schedule::ChainCosts c;
  for (int i = 0; i < stages; ++i) {
    const double forward = time(rng);
    c.forward_time.push_back(forward);
    c.backward_time.push_back(forward * time(rng));
    c.boundary_bytes.push_back(boundary(rng));
    c.saved_bytes.push_back(saved(rng));
  }
  c.boundary_bytes.push_back(boundary(rng));
  return c;
}
