// The candidate harness: kernels that have not passed a device check, each run beside the kernel
// the library runs for its kernel-list row, checked against it and timed (the lab of llm.c's
// dev/cuda/, whose winners alone live in the library). Plain C++ over remat's public interface:
// a candidate is a pair of closures on a device, so this logic runs, and is tested, on the
// emulated device without a GPU (tests/test_device_candidates.cpp); the CUDA candidates are
// registered by cuda_candidates.cpp and run by the remat_candidates program on a GPU.
//
//   Candidate c{.name = "exp_twice", .replaces = "unary", .what = "exp", .agreement = Agreement::bits()};
//   c.cases.push_back({"4 x 8", true, [device] {
//     Tensor x = randn({4, 8}, DType::f32, RngState{1, 0}).to(device);
//     return Trial{[x] { return TensorList{exp(x)}; }, [x] { return TensorList{exp(x)}; }};
//   }});
//   std::vector<Outcome> outcomes = run({c}, {.device = device});
//   std::printf("%s", markdown(outcomes).c_str());
//
// For each case, on its device: the inputs are made once; the library's kernel runs once and the
// candidate twice, their outputs copied to the host; the candidate must repeat its own bits (a kernel whose
// result depends on timing could not serve a recomputation) and agree with the library's outputs
// as its Agreement says; a timed case then runs each side `warmup` times and `repeats` times more
// between two waits for the device and reports the seconds per call of both.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "remat/tensor.h"

namespace remat::candidates {

// How a candidate's outputs must match the library kernel's: the same bits, or each element
// within atol + rtol * |library's| (NaN where the library's is NaN, infinities equal), with the
// reason the bits may differ (another summation order, another precision).
struct Agreement {
  bool bitwise = true;
  double atol = 0, rtol = 0;
  std::string reason;
  static Agreement bits() { return {}; }
  static Agreement within(double atol, double rtol, std::string reason) { return {false, atol, rtol, std::move(reason)}; }
};

// One problem both sides run. Each returns its outputs, which the harness copies to the host at
// once (a side may update tensors in place and return them; `reset`, when given, restores such
// state before each checked call). run_candidate returns an empty list when the candidate does not
// take the problem (its shape, dtype or device); the case is then reported as not applicable.
struct Trial {
  std::function<TensorList()> run_library;
  std::function<TensorList()> run_candidate;
  std::function<void()> reset;
};

struct Case {
  std::string name;             // "GPT-2 small, f32: 8 x 12 x 1024 x 64"
  bool timed = false;           // a shape worth timing (the production shape)
  std::function<Trial()> make;  // makes the inputs on the device, once
  std::optional<Agreement> agreement = std::nullopt;  // the case's own, else the candidate's
};

struct Candidate {
  std::string name;      // "attention_tc"
  std::string replaces;  // the kernel-list row(s) and the library's kernel: "attention (attention.cu)"
  std::string what;      // one line
  Agreement agreement;
  std::vector<Case> cases;
};

enum class Status { passed, failed, not_applicable, error };
const char* status_name(Status status);

struct Outcome {
  std::string candidate, case_name;
  Status status = Status::error;
  std::string detail;                 // the first mismatch, the error, or why not applicable
  uint64_t compared = 0;              // elements compared
  uint64_t mismatched = 0;            // elements outside the agreement
  double max_abs_diff = 0, max_rel_diff = 0;  // over finite elements, candidate vs library
  bool timed = false;
  double library_seconds = 0, candidate_seconds = 0;  // per call, timed cases that passed
};

struct RunOptions {
  Device device;
  int warmup = 2, repeats = 10;
  std::vector<std::string> only;  // candidate names; empty: every one
};

// Runs every case of every candidate (in order); never throws for a candidate's failure or error
// (they are outcomes), only for options that name no candidate.
std::vector<Outcome> run(const std::vector<Candidate>& candidates, const RunOptions& options);

// A markdown table, one row per case: candidate, case, status, elements, max differences, the
// library's and the candidate's time per call, speed-up (library / candidate); then one line per
// candidate: passed (every case passed or not applicable, at least one passed) or not.
std::string markdown(const std::vector<Candidate>& candidates, const std::vector<Outcome>& outcomes);
// One JSON object per outcome, a line each (scripts/cuda-report.py reads them).
std::string json_lines(const std::vector<Outcome>& outcomes);
// Whether every case of `candidate` passed or was not applicable, and at least one passed.
bool passed(const std::string& candidate, const std::vector<Outcome>& outcomes);

// Compares two lists of outputs (on any devices) under `agreement`; fills the counts, differences
// and first mismatch of `outcome` and returns whether they agree. Exposed for the harness's tests.
bool agree(const TensorList& library, const TensorList& candidate, const Agreement& agreement, Outcome& outcome);

}  // namespace remat::candidates
