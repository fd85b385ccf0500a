// The candidate harness (harness.h): each case run on its device, checked, timed, reported.
#include "candidates/harness.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "remat/backend.h"
#include "remat/error.h"

namespace remat::candidates {

const char* status_name(Status status) {
  switch (status) {
    case Status::passed: return "passed";
    case Status::failed: return "FAILED";
    case Status::not_applicable: return "not applicable";
    case Status::error: return "ERROR";
  }
  return "?";
}

namespace {

// The bytes of a host copy of t, element by element.
struct HostCopy {
  Tensor t;
  const unsigned char* bytes = nullptr;
  size_t element = 0;
};
HostCopy host_copy(const Tensor& t) {
  HostCopy h;
  h.t = t.device() == kCpu ? t.contiguous() : t.to(kCpu).contiguous();
  h.element = dtype_size(h.t.dtype());
  h.bytes = static_cast<const unsigned char*>(h.t.raw_data());
  return h;
}

std::string describe(const Tensor& t) { return detail::concat(dtype_name(t.dtype()), " ", shape_str(t.shape())); }

// Compares output `k`; false on the first structural mismatch (recorded in outcome.detail).
bool agree_one(const Tensor& library, const Tensor& candidate, size_t k, const Agreement& agreement, Outcome& outcome) {
  if (library.dtype() != candidate.dtype() || library.shape() != candidate.shape()) {
    outcome.detail = detail::concat("output ", k, ": the library gave ", describe(library), ", the candidate ",
                                    describe(candidate));
    return false;
  }
  const HostCopy a = host_copy(library), b = host_copy(candidate);
  const std::vector<double> av = a.t.to_vector(), bv = b.t.to_vector();
  bool ok = true;
  for (size_t i = 0; i < av.size(); ++i) {
    ++outcome.compared;
    const double x = av[i], y = bv[i];
    if (std::isfinite(x) && std::isfinite(y)) {
      const double diff = std::fabs(x - y);
      outcome.max_abs_diff = std::max(outcome.max_abs_diff, diff);
      if (x != 0) outcome.max_rel_diff = std::max(outcome.max_rel_diff, diff / std::fabs(x));
    }
    bool same;
    if (agreement.bitwise) {
      same = std::memcmp(a.bytes + i * a.element, b.bytes + i * b.element, a.element) == 0;
    } else if (std::isnan(x) || std::isnan(y)) {
      same = std::isnan(x) && std::isnan(y);
    } else if (std::isinf(x) || std::isinf(y)) {
      same = x == y;
    } else {
      same = std::fabs(x - y) <= agreement.atol + agreement.rtol * std::fabs(x);
    }
    if (same) continue;
    if (ok && outcome.detail.empty())
      outcome.detail = detail::concat("output ", k, " element ", i, ": library ", x, ", candidate ", y,
                                      agreement.bitwise ? " (bits differ)" : "");
    ++outcome.mismatched;
    ok = false;
  }
  return ok;
}

// The host's seconds per call of `f`, `repeats` calls between two waits for the device, after
// `warmup` calls.
double seconds_per_call(Backend& device, const std::function<TensorList()>& f, int warmup, int repeats) {
  for (int i = 0; i < warmup; ++i) (void)f();
  device.synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) (void)f();
  device.synchronize();
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / std::max(1, repeats);
}

// `side`'s outputs, run after trial.reset, copied to the host.
TensorList checked_call(const Trial& trial, const std::function<TensorList()>& side) {
  if (trial.reset) trial.reset();
  TensorList host;
  for (const Tensor& t : side()) host.push_back(t.to(kCpu).clone());
  return host;
}

Outcome run_case(const Candidate& candidate, const Case& c, const RunOptions& options) {
  Outcome o;
  o.candidate = candidate.name, o.case_name = c.name;
  try {
    const Trial trial = c.make();
    const TensorList library = checked_call(trial, trial.run_library);
    const TensorList first = checked_call(trial, trial.run_candidate);
    if (first.empty()) {
      o.status = Status::not_applicable;
      o.detail = "the candidate does not take this problem";
      return o;
    }
    const TensorList second = checked_call(trial, trial.run_candidate);
    Outcome repeat;
    if (!agree(first, second, Agreement::bits(), repeat)) {
      o.status = Status::failed;
      o.detail = "the candidate does not repeat its bits: " + repeat.detail;
      return o;
    }
    o.status = agree(library, first, c.agreement ? *c.agreement : candidate.agreement, o) ? Status::passed : Status::failed;
    if (o.status == Status::passed && c.timed) {
      Backend& device = backend(options.device);
      o.timed = true;
      o.library_seconds = seconds_per_call(device, trial.run_library, options.warmup, options.repeats);
      o.candidate_seconds = seconds_per_call(device, trial.run_candidate, options.warmup, options.repeats);
    }
  } catch (const std::exception& e) {
    o.status = Status::error;
    o.detail = e.what();
  }
  return o;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

std::string milliseconds(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", seconds * 1e3);
  return buf;
}

// The text as a JSON string (quotes, backslashes and control characters escaped).
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (const char ch : text) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

}  // namespace

bool agree(const TensorList& library, const TensorList& candidate, const Agreement& agreement, Outcome& outcome) {
  if (library.size() != candidate.size()) {
    outcome.detail = detail::concat("the library gave ", library.size(), " outputs, the candidate ", candidate.size());
    return false;
  }
  bool ok = true;
  for (size_t k = 0; k < library.size(); ++k) ok = agree_one(library[k], candidate[k], k, agreement, outcome) && ok;
  return ok;
}

std::vector<Outcome> run(const std::vector<Candidate>& candidates, const RunOptions& options) {
  for (const std::string& name : options.only)
    REMAT_CHECK(std::any_of(candidates.begin(), candidates.end(), [&](const Candidate& c) { return c.name == name; }),
                "candidate harness: no candidate named '", name, "'");
  std::vector<Outcome> outcomes;
  for (const Candidate& c : candidates) {
    if (!options.only.empty() && std::find(options.only.begin(), options.only.end(), c.name) == options.only.end())
      continue;
    for (const Case& k : c.cases) outcomes.push_back(run_case(c, k, options));
  }
  return outcomes;
}

bool passed(const std::string& candidate, const std::vector<Outcome>& outcomes) {
  bool any = false;
  for (const Outcome& o : outcomes) {
    if (o.candidate != candidate) continue;
    if (o.status == Status::failed || o.status == Status::error) return false;
    any = any || o.status == Status::passed;
  }
  return any;
}

std::string markdown(const std::vector<Candidate>& candidates, const std::vector<Outcome>& outcomes) {
  std::ostringstream out;
  out << "| candidate | case | status | elements | max abs diff | max rel diff | library | candidate | speed-up |\n"
      << "|---|---|---|---|---|---|---|---|---|\n";
  for (const Outcome& o : outcomes) {
    out << "| " << o.candidate << " | " << o.case_name << " | " << status_name(o.status) << " | " << o.compared << " | "
        << number(o.max_abs_diff) << " | " << number(o.max_rel_diff) << " | ";
    if (o.timed)
      out << milliseconds(o.library_seconds) << " | " << milliseconds(o.candidate_seconds) << " | "
          << number(o.library_seconds / o.candidate_seconds) << "x |\n";
    else
      out << "- | - | - |\n";
  }
  out << "\n";
  for (const Candidate& c : candidates) {
    if (std::none_of(outcomes.begin(), outcomes.end(), [&](const Outcome& o) { return o.candidate == c.name; }))
      continue;
    out << "- " << c.name << " (" << c.replaces << "): " << (passed(c.name, outcomes) ? "passed" : "not passed")
        << "; agreement: "
        << (c.agreement.bitwise ? std::string("bitwise")
                                : detail::concat("|diff| <= ", c.agreement.atol, " + ", c.agreement.rtol,
                                                 " |library's| (", c.agreement.reason, ")"))
        << "\n";
    for (const Outcome& o : outcomes)
      if (o.candidate == c.name && !o.detail.empty()) out << "  - " << o.case_name << ": " << o.detail << "\n";
  }
  return out.str();
}

std::string json_lines(const std::vector<Outcome>& outcomes) {
  std::ostringstream out;
  for (const Outcome& o : outcomes) {
    out << "{\"candidate\": " << quoted(o.candidate) << ", \"case\": " << quoted(o.case_name)
        << ", \"status\": " << quoted(status_name(o.status)) << ", \"detail\": " << quoted(o.detail)
        << ", \"compared\": " << o.compared << ", \"mismatched\": " << o.mismatched
        << ", \"max_abs_diff\": " << o.max_abs_diff << ", \"max_rel_diff\": " << o.max_rel_diff
        << ", \"timed\": " << (o.timed ? "true" : "false") << ", \"library_seconds\": " << o.library_seconds
        << ", \"candidate_seconds\": " << o.candidate_seconds << "}\n";
  }
  return out.str();
}

}  // namespace remat::candidates
