#include "classify.h"

#include <algorithm>
#include <cctype>

namespace remat::program_fuzz {

const char* verdict_name(VerdictKind kind) {
  static const char* names[] = {"ok", "refused", "wrong", "missing error", "extra error", "crash", "budget"};
  return names[static_cast<int>(kind)];
}

const char* rule_name(Rule rule) {
  switch (rule) {
    case Rule::deterministic: return "deterministic";
    case Rule::buffer_write: return "buffer written while recomputing";
    case Rule::thread: return "value made on another thread";
    case Rule::in_place: return "written in place";
  }
  return "?";
}

// Note [accepted refusals]: a refusal is accepted only when its message names a rule AND the
// program breaks that rule (the generator knows which it breaks: Program::broken_rules). A
// message naming "a region's function must be deterministic" for a program whose code is
// deterministic is a false reason, an extra error. The phrases are what a message must contain;
// the lead mirrors this list in docs/checkpointing.md.
const std::vector<AcceptedRule>& accepted_rules() {
  static const std::vector<AcceptedRule> rules = {
      // What a recomputation runs again (an op's forward) read state that changed between its first
      // run and its recomputation (a C++ scalar member the program changes between forward and
      // backward), or a value the program wrote in place (the write is not recorded, so no
      // recomputation repeats it).
      {"deterministic", true, {Rule::deterministic, Rule::in_place}, {"not a pure function of its inputs"}},
      // A value the forward pass read was written in place (copy_) before the backward pass.
      {"written in place", true, {Rule::in_place}, {"modified in place", "written in place"}},
      // The policy's own budget is below the smallest feasible one (budget: and dynamic:).
      {"budget below the smallest feasible", false, {}, {"smallest feasible budget"}},
  };
  return rules;
}

std::string error_kind(const ErrorRecord& e) {
  const std::string& m = e.message;
  if (e.type != "remat::Error") return e.type;
  if (m.find("in place") != std::string::npos || m.find("in-place") != std::string::npos) return "in place";
  if (m.find("already freed") != std::string::npos || m.find("retain_graph") != std::string::npos)
    return "graph already freed";
  if (m.find("does not require grad") != std::string::npos) return "does not require grad";
  if (m.find("smallest feasible budget") != std::string::npos) return "infeasible budget";
  if (m.find("out of memory") != std::string::npos) return "out of memory";
  return "other";
}

namespace {

Verdict make(VerdictKind kind, std::string detail, std::string rule = "") {
  return Verdict{kind, std::move(rule), std::move(detail)};
}

std::string where(const ErrorRecord& e) { return "step " + std::to_string(e.step) + " " + e.phase; }

// The policy raised where save-all did not: accepted only naming a rule the program breaks.
Verdict refusal_or_extra(const ErrorRecord& e, const ClassifyContext& c) {
  // Where save-all did not raise, a message saying it does is false whatever rule it names.
  if (e.message.find("save-all raises") != std::string::npos)
    return make(VerdictKind::extra_error, "false claim (save-all did not raise): " + where(e) + ": " + e.message);
  std::string named;
  for (const AcceptedRule& r : accepted_rules()) {
    const bool says = std::any_of(r.phrases.begin(), r.phrases.end(),
                                  [&](const char* p) { return e.message.find(p) != std::string::npos; });
    if (!says) continue;
    const bool breaks =
        r.program_rule ? std::any_of(r.rules.begin(), r.rules.end(),
                                     [&](Rule rule) {
                                       return std::find(c.broken_rules.begin(), c.broken_rules.end(), rule) !=
                                              c.broken_rules.end();
                                     })
                       : c.budget_policy;
    if (breaks) return make(VerdictKind::refused, where(e) + ": " + e.message, r.name);
    named = r.name;
  }
  std::string detail = where(e) + ": " + e.message;
  if (!named.empty()) detail = "false reason (names '" + named + "', which the program does not break): " + detail;
  return make(VerdictKind::extra_error, detail);
}

Verdict budget_check(const Record& got, const ClassifyContext& c) {
  if (!c.check_budget) return make(VerdictKind::ok, "");
  for (const StepMemory& s : got.steps) {
    const size_t budget = c.fixed_budget ? c.fixed_budget : s.planned_budget;
    // reported: a warning naming the budget, or a counter saying by how much it was passed
    if (budget == 0 || s.peak_saved <= budget || s.warned || s.bytes_over_plan > 0 || s.budget_over > 0) continue;
    return make(VerdictKind::budget, "step " + std::to_string(s.step) + (s.profiling ? " (profiling)" : " (planned)") +
                                         ": peak saved " + std::to_string(s.peak_saved) + " B > budget " +
                                         std::to_string(budget) + " B, no warning, bytes_over_plan 0, budget counter 0");
  }
  return make(VerdictKind::ok, "");
}

}  // namespace

Verdict classify(const Record& ref, const Record& got, const ClassifyContext& c) {
  if (got.error && (got.error->type != "remat::Error" || got.error->message.find("internal error") != std::string::npos))
    return make(VerdictKind::crash, where(*got.error) + ": " + got.error->type + ": " + got.error->message);
  const size_t common = std::min(ref.obs.size(), got.obs.size());
  for (size_t i = 0; i < common; ++i) {
    const Observation& a = ref.obs[i];
    const Observation& b = got.obs[i];
    if (a.label != b.label)
      return make(VerdictKind::wrong, "the program took another path: observation " + std::to_string(i) + " is " +
                                          b.label + ", save-all's " + a.label);
    if (a.bits != b.bits)
      return make(VerdictKind::wrong, a.label + ": " + b.shown + ", save-all " + a.shown);
  }
  const auto& re = ref.error;
  const auto& ge = got.error;
  if (!re && !ge) {
    if (ref.obs.size() != got.obs.size())
      return make(VerdictKind::wrong, "observations: " + std::to_string(got.obs.size()) + ", save-all " +
                                          std::to_string(ref.obs.size()));
    return budget_check(got, c);
  }
  if (re && !ge) return make(VerdictKind::missing_error, "save-all raised at " + where(*re) + ": " + re->message);
  if (!re && ge) return refusal_or_extra(*ge, c);
  if (ge->phase_seq < re->phase_seq || got.obs.size() < ref.obs.size()) return refusal_or_extra(*ge, c);
  if (ge->phase_seq > re->phase_seq || got.obs.size() > ref.obs.size())
    return make(VerdictKind::missing_error, "save-all raised at " + where(*re) + ": " + re->message +
                                                "; the policy went on to " + where(*ge) + ": " + ge->message);
  if (error_kind(*re) != error_kind(*ge)) {
    const Verdict refusal = refusal_or_extra(*ge, c);
    if (refusal.kind == VerdictKind::refused) return refusal;
    return make(VerdictKind::wrong, "another error at " + where(*ge) + ": " + ge->message + "; save-all: " +
                                        re->message);
  }
  return budget_check(got, c);
}

std::string cause_of(const Verdict& v) {
  std::string d = v.detail;
  const VerdictKind k = v.kind;
  if (k == VerdictKind::wrong) {
    const bool undefined = d.find("undefined") != std::string::npos;
    const bool flag = d.find(": true") != std::string::npos || d.find(": false") != std::string::npos;
    d = d.substr(0, d.find(':'));
    if (d.rfind("another error", 0) == 0 || d.rfind("the program took", 0) == 0 || d.rfind("observations", 0) == 0)
      d = v.detail.substr(0, 40);
    else if (d.size() > 1 && d[0] == 's' && d.find('.') != std::string::npos) d = d.substr(d.find('.') + 1);
    if (undefined) d += " (undefined on one side)";
    else if (!flag) d += " (values)";
  } else if (k == VerdictKind::missing_error) {
    const size_t colon = d.find(": ", d.find("raised at"));
    ErrorRecord e;
    e.type = "remat::Error";
    e.message = colon == std::string::npos ? d : d.substr(colon + 2);
    d = "save-all: " + error_kind(e);
  } else if (k == VerdictKind::extra_error) {
    const size_t step = d.find("step ");
    std::string what = step == std::string::npos ? d : d.substr(std::min(d.size(), d.find(": ", step) + 2));
    if (what.rfind("checkpoint region '", 0) == 0 && what.find("': ") != std::string::npos)
      what = what.substr(what.find("': ") + 3);
    what = what.substr(0, std::min(what.find(';'), std::min(what.find('('), size_t{70})));
    d = (d.rfind("false claim", 0) == 0 ? "false claim: " : d.rfind("false reason", 0) == 0 ? "false reason: " : "") + what;
  } else if (k == VerdictKind::budget) {
    d = d.find("(profiling)") != std::string::npos ? "profiling step" : "planned step";
  } else {
    d = d.substr(0, 60);
  }
  for (char& c : d)
    if (std::isdigit(static_cast<unsigned char>(c))) c = 'N';
  return std::string(verdict_name(k)) + " | " + d;
}

}  // namespace remat::program_fuzz
