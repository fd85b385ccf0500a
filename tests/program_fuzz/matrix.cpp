#include "matrix.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>

namespace remat::program_fuzz {

const std::vector<std::string>& policy_names() {
  static const std::vector<std::string> names = {
      "every-layer",  "every-k:2", "every-k:3",           "selective:matmul", "budget:large",
      "budget:small", "budget:medium", "budget:auto",     "dynamic",          "offload",
      "every-layer+offload", "budget+offload", "every-k:2+offload"};
  return names;
}

bool is_budget_policy(const std::string& name) { return name.rfind("budget", 0) == 0 || name.rfind("dynamic", 0) == 0; }

std::string policy_text(const std::string& name, const Sizes& s, const std::string& dir) {
  const std::string offload = "offload:" + dir + ",threshold=0";
  auto bytes = [](size_t b) { return std::to_string(std::max<size_t>(b, 1)); };
  if (name == "budget:small") return "budget:" + bytes(s.small);
  if (name == "budget:medium") return "budget:" + bytes(s.medium);
  if (name == "budget:large") return "budget:" + bytes(s.large);
  if (name == "dynamic") return "dynamic:" + bytes(s.dynamic);
  if (name == "offload") return offload;
  if (name == "every-layer+offload") return "every-layer+" + offload;
  if (name == "budget+offload") return "budget:" + bytes(s.medium) + "+" + offload;
  if (name == "every-k:2+offload") return "every-k:2+" + offload;
  std::string text = name;
  const size_t at = text.find("DIR");
  if (at != std::string::npos) text.replace(at, 3, dir);
  return text;
}

const std::string& scratch_directory() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/remat-program-fuzz.XXXXXX";
    if (!mkdtemp(pattern.data())) return std::string("/tmp");
    static const pid_t owner = getpid();
    static std::string remove_at_exit = pattern;
    std::atexit([] {
      if (getpid() == owner) {
        std::error_code ignored;
        std::filesystem::remove_all(remove_at_exit, ignored);
      }
    });
    return pattern;
  }();
  return dir;
}

namespace {

void record_error(Recorder& r, const std::string& type, const std::string& message) {
  ErrorRecord e;
  e.step = r.current_step();
  e.phase = r.current_phase();
  e.phase_seq = r.phase_seq();
  e.type = type;
  e.message = message;
  r.record().error = e;
}

Record run(const std::string& text, const Body& body, bool read_feasible) {
  Record record;
  Recorder r(record);
  set_warning_handler([&record](const std::string& m) { record.warnings.push_back(m); });
  try {
    r.phase("policy");
    ScopedPolicy scoped(Policy::parse(text));
    body(r);
    r.end_step();
  } catch (const OutOfMemory& e) {
    record_error(r, "remat::Error", e.what());
  } catch (const Error& e) {
    record_error(r, "remat::Error", e.what());
  } catch (const std::exception& e) {
    record_error(r, "std::exception", e.what());
  } catch (...) {
    record_error(r, "unknown", "an exception that is not a std::exception");
  }
  if (read_feasible && r.model()) {
    try {
      if (const auto range = r.model()->planner()->feasible_range()) {
        record.smallest_budget = range->smallest_budget_bytes;
        record.planned_save_all_peak = range->save_all_peak_bytes;
      }
    } catch (const std::exception&) {
    }
  }
  set_warning_handler(nullptr);
  return record;
}

// The smallest budget an infeasible budget's error names ("... smallest feasible budget ...: N
// bytes"), or 0.
size_t named_smallest_budget(const Record& r) {
  if (!r.error) return 0;
  const std::string& m = r.error->message;
  const size_t at = m.find("smallest feasible budget");
  if (at == std::string::npos) return 0;
  const size_t bytes = m.find(" bytes", at);
  if (bytes == std::string::npos) return 0;
  size_t begin = bytes;
  while (begin > at && std::isdigit(static_cast<unsigned char>(m[begin - 1]))) --begin;
  return begin < bytes ? std::stoull(m.substr(begin, bytes - begin)) : 0;
}

}  // namespace

Record run_under(const std::string& text, const Body& body) { return run(text, body, false); }

std::string describe(const PairResult& p) {
  return p.policy + " (" + p.text + "): " + verdict_name(p.verdict.kind) +
         (p.verdict.rule.empty() ? "" : " [" + p.verdict.rule + "]") + (p.verdict.detail.empty() ? "" : ": ") +
         p.verdict.detail;
}

MatrixResult run_matrix(const Body& body, const MatrixOptions& options) {
  MatrixResult m;
  const std::string dir = options.offload_dir.empty() ? scratch_directory() : options.offload_dir;
  if (options.on_start) options.on_start("save-all");
  m.save_all = run("save-all", body, false);
  const size_t peak = m.save_all.peak_saved();
  m.sizes.large = std::max<size_t>(peak, 1);
  m.sizes.dynamic = std::max<size_t>(peak / 2, 1);
  m.sizes.small = std::max<size_t>(peak / 4, 1);
  m.sizes.medium = std::max<size_t>(peak / 2, 1);
  // budget:large first: its planner's feasible range sizes budget:small and budget:medium (run
  // for that alone when it is not asked for, so that a pair's budget never depends on the list).
  std::vector<std::string> order = options.policies;
  std::stable_partition(order.begin(), order.end(), [](const std::string& n) { return n == "budget:large"; });
  const bool sized_by_large = std::any_of(order.begin(), order.end(), [](const std::string& n) {
    return n == "budget:small" || n == "budget:medium" || n == "budget+offload";
  });
  const bool large_asked = !order.empty() && order[0] == "budget:large";
  if (sized_by_large && !large_asked) order.insert(order.begin(), "budget:large");
  for (const std::string& name : order) {
    const bool sizing_only = name == "budget:large" && sized_by_large && !large_asked;
    PairResult pair;
    pair.policy = name;
    pair.text = policy_text(name, m.sizes, dir);
    if (options.on_start) options.on_start(name);
    pair.record = run(pair.text, body, name == "budget:large");
    // dynamic: and budget:small raise to the smallest budget their error names, as a user would
    // (dynamic_feasible_range does so too); a second refusal stands.
    // (A dynamic: error names a lower bound from the part of the step run so far: a few tries.)
    for (int retry = 0; retry < 4 && (name == "dynamic" || name == "budget:small"); ++retry) {
      const size_t smallest = named_smallest_budget(pair.record);
      if (smallest == 0 || smallest <= (name == "dynamic" ? m.sizes.dynamic : m.sizes.small)) break;
      {
        (name == "dynamic" ? m.sizes.dynamic : m.sizes.small) = smallest;
        pair.text = policy_text(name, m.sizes, dir);
        if (options.on_start) options.on_start(name);
        pair.record = run(pair.text, body, false);
      }
    }
    if (name == "budget:large" && pair.record.smallest_budget > 0) {
      const size_t lo = pair.record.smallest_budget;
      const size_t hi = std::max(pair.record.planned_save_all_peak, lo);
      m.sizes.small = lo;
      m.sizes.medium = lo + (hi - lo) / 2;
    }
    ClassifyContext c;
    c.broken_rules = options.broken_rules;
    c.budget_policy = is_budget_policy(name) || name == "budget+offload";
    try {
      const Policy policy = Policy::parse(pair.text);
      c.check_budget = policy.keep.kind == Keep::Kind::budget;
      c.fixed_budget = policy.keep.budget_auto ? 0 : policy.keep.budget_bytes;
    } catch (const Error&) {
    }
    pair.verdict = classify(m.save_all, pair.record, c);
    if (sizing_only) continue;
    if (options.on_pair) options.on_pair(pair);
    m.pairs.push_back(std::move(pair));
  }
  return m;
}

}  // namespace remat::program_fuzz
