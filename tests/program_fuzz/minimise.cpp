#include "minimise.h"

#include <algorithm>
#include <functional>

#include "run.h"

namespace remat::program_fuzz {

Verdict verdict_of(const Program& program, const std::string& policy) {
  const MatrixResult m = run_program_matrix(program, std::vector<std::string>{policy});
  return m.pairs.back().verdict;
}

namespace {

// Drops statement `idx` of module `m`: its registers' readers read its first argument instead.
void remove_stmt(ModuleSpec& m, size_t idx) {
  int start = m.n_in;
  for (size_t i = 0; i < idx; ++i) start += m.body[i].outs;
  const Stmt gone = m.body[idx];
  const int end = start + gone.outs;
  const int replacement = gone.args.empty() ? std::max(0, start - 1) : gone.args[0];
  auto remap = [&](int& r) {
    if (r >= start && r < end) r = replacement;
    else if (r >= end) r -= gone.outs;
  };
  m.body.erase(m.body.begin() + static_cast<long>(idx));
  for (size_t i = idx; i < m.body.size(); ++i)
    for (int& a : m.body[i].args) remap(a);
  for (int& r : m.returns) remap(r);
}

// Drops child slot `slot` of module `m`: calls of it become tanh of their first argument.
void remove_child(ModuleSpec& m, int slot) {
  m.children.erase(m.children.begin() + slot);
  auto fix = [&](int& c) {
    if (c == slot) c = -1;
    else if (c > slot) --c;
  };
  for (Stmt& s : m.body) {
    if (s.op != Op::call && s.op != Op::route && s.op != Op::set_cond) continue;
    fix(s.child);
    fix(s.child2);
  }
}

struct Shrinker {
  Judge judge;
  std::string cause;
  int max_runs;
  MinimiseResult best;

  // Keeps `candidate` if it is well formed and still fails the same way.
  bool attempt(Program candidate) {
    if (best.runs >= max_runs || !check(candidate)) return false;
    ++best.runs;
    const Verdict v = judge(candidate);
    if (cause_of(v) != cause) return false;
    best.program = std::move(candidate);
    best.verdict = v;
    return true;
  }

  bool driver_pass() {
    bool any = false;
    const Program& p = best.program;
    for (int steps = 1; steps < p.driver.steps; ++steps) {
      Program c = best.program;
      c.driver.steps = steps;
      c.driver.batch.resize(steps);
      if (attempt(c)) {
        any = true;
        break;
      }
    }
    const std::vector<std::function<void(Driver&)>> edits = {
        [](Driver& d) { d.backward = BackwardKind::plain; },   [](Driver& d) { d.optimizer = 0; },
        [](Driver& d) { d.aux_loss = false; },                  [](Driver& d) { d.input_requires_grad = false; },
        [](Driver& d) { d.bf16 = false; },                      [](Driver& d) { d.change_scale = false; },
        [](Driver& d) { d.batch.assign(d.batch.size(), d.batch[0]); }};
    for (const auto& edit : edits) {
      Program c = best.program;
      edit(c.driver);
      if (c.driver.backward != best.program.driver.backward || c.driver.optimizer != best.program.driver.optimizer ||
          c.driver.aux_loss != best.program.driver.aux_loss || c.driver.bf16 != best.program.driver.bf16 ||
          c.driver.input_requires_grad != best.program.driver.input_requires_grad ||
          c.driver.change_scale != best.program.driver.change_scale || c.driver.batch != best.program.driver.batch)
        any |= attempt(c);
    }
    if (best.program.width > 2) {
      Program c = best.program;
      c.width = 2;
      any |= attempt(c);
    }
    return any;
  }

  bool module_pass() {
    bool any = false;
    for (size_t mi = 0; mi < best.program.modules.size(); ++mi) {
      // children: dropped, or a prog child replaced by a plain tanh layer (less depth)
      for (int slot = static_cast<int>(best.program.modules[mi].children.size()) - 1; slot >= 0; --slot) {
        Program c = best.program;
        remove_child(c.modules[mi], slot);
        if (attempt(c)) {
          any = true;
          continue;
        }
        const int child = best.program.modules[mi].children[slot];
        if (best.program.modules[child].kind == ModuleKind::tanh) continue;
        c = best.program;
        ModuleSpec& m = c.modules[child];
        m = ModuleSpec{};
        m.kind = ModuleKind::tanh;
        any |= attempt(c);
      }
      // statements: runs of them first (half the body, a quarter, ...), then one by one
      for (size_t chunk = best.program.modules[mi].body.size() / 2; chunk >= 1; chunk /= 2) {
        for (size_t end = best.program.modules[mi].body.size(); end >= chunk; end -= chunk) {
          if (end > best.program.modules[mi].body.size()) continue;
          Program c = best.program;
          for (size_t k = 0; k < chunk; ++k) remove_stmt(c.modules[mi], end - 1 - k);
          any |= attempt(c);
          if (end < 2 * chunk) break;
        }
        if (chunk == 1) break;
      }
      const ModuleSpec m = best.program.modules[mi];  // a copy: attempt() may replace best.program
      if (m.returns.size() > 1) {
        Program c = best.program;
        c.modules[mi].returns.resize(1);
        any |= attempt(c);
      }
      if (m.tie_to >= 0 || m.role != Role::automatic || !m.own_policy.empty()) {
        Program c = best.program;
        c.modules[mi].tie_to = -1;
        c.modules[mi].role = Role::automatic;
        c.modules[mi].own_policy.clear();
        any |= attempt(c);
      }
      for (size_t i = 0; i < best.program.modules[mi].body.size(); ++i) {
        if (!best.program.modules[mi].body[i].no_grad) continue;
        Program c = best.program;
        c.modules[mi].body[i].no_grad = false;
        any |= attempt(c);
      }
    }
    return any;
  }
};

}  // namespace

MinimiseResult minimise(const Program& program, const std::string& policy, const Verdict& target, int max_runs) {
  return minimise_with([&policy](const Program& p) { return verdict_of(p, policy); }, program, target, max_runs);
}

MinimiseResult minimise_with(const Judge& judge, const Program& program, const Verdict& target, int max_runs) {
  Shrinker s{judge, cause_of(target), max_runs, {}};
  s.best.program = program;
  s.best.verdict = judge(program);
  s.best.runs = 1;
  if (cause_of(s.best.verdict) != s.cause) return s.best;
  while (s.best.runs < max_runs) {
    const bool changed = s.driver_pass() | s.module_pass();
    if (!changed) break;
  }
  return s.best;
}

}  // namespace remat::program_fuzz
