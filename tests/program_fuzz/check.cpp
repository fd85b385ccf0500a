// check(): makes a program well formed and derives what each statement defines. The generator
// calls it once; the minimiser after every edit, so an edit never needs to fix references itself.
#include <functional>

#include "program.h"

namespace remat::program_fuzz {

namespace {

ShapeClass merge(ShapeClass a, ShapeClass b) {
  if (a == b) return a;
  return ShapeClass::full;  // full with anything, and row with col, broadcast to [B, W]
}

bool owns_weights(const ModuleSpec& m) { return m.kind == ModuleKind::prog || m.kind == ModuleKind::linear; }

struct Checker {
  Program& p;
  std::vector<int> state;  // 0 unvisited, 1 in progress, 2 done

  bool module(int index, bool must_return_full) {
    if (state[index] == 1) return false;  // a cycle
    if (state[index] == 2) return true;
    state[index] = 1;
    ModuleSpec& m = p.modules[index];
    for (size_t i = 0; i < m.children.size(); ++i) {
      int& c = m.children[i];
      if (c <= 0 || c >= static_cast<int>(p.modules.size())) c = -1;
    }
    std::erase(m.children, -1);
    const bool seq = m.kind == ModuleKind::sequential;
    for (int c : m.children)
      if (!module(c, seq)) return false;
    if (m.tie_to >= 0 && (m.tie_to >= static_cast<int>(p.modules.size()) || m.tie_to == index ||
                          !owns_weights(p.modules[m.tie_to]) || m.kind != ModuleKind::prog))
      m.tie_to = -1;
    if (m.kind == ModuleKind::prog) {
      if (seq || must_return_full) m.n_in = 1;
      body(index, must_return_full);
    } else {
      m.n_out = 1;
      m.out_classes = {ShapeClass::full};
    }
    state[index] = 2;
    return true;
  }

  int arity(const ModuleSpec& child) const { return child.kind == ModuleKind::prog ? child.n_in : 1; }

  void body(int index, bool must_return_full) {
    ModuleSpec& m = p.modules[index];
    std::vector<ShapeClass> cls(m.n_in, ShapeClass::full);
    auto valid = [&](int r) { return r >= 0 && r < static_cast<int>(cls.size()); };
    auto full_arg = [&](int& r) {
      if (!valid(r) || cls[r] != ShapeClass::full) r = 0;
    };
    const int n_children = static_cast<int>(m.children.size());
    for (Stmt& s : m.body) {
      for (int& a : s.args)
        if (!valid(a)) a = static_cast<int>(cls.size()) - 1;
      if (s.args.empty() && s.op != Op::param) s.args = {static_cast<int>(cls.size()) - 1};
      if (s.op == Op::call || s.op == Op::route || s.op == Op::set_cond) {
        if (s.child < 0 || s.child >= n_children) {
          s.op = Op::unary, s.kind = static_cast<int>(Unary::tanh), s.args.resize(1);
        }
      }
      if (s.op == Op::route) {
        const bool ok = s.child2 >= 0 && s.child2 < n_children && s.child2 != s.child &&
                        arity(p.modules[m.children[s.child]]) == 1 && arity(p.modules[m.children[s.child2]]) == 1 &&
                        p.modules[m.children[s.child]].out_classes == p.modules[m.children[s.child2]].out_classes;
        if (!ok) s.op = Op::call;
      }
      if (s.op == Op::set_cond && p.modules[m.children[s.child]].kind != ModuleKind::prog) s.op = Op::stash;
      if ((s.op == Op::linear || s.op == Op::param) &&
          (s.module < 0 || s.module >= static_cast<int>(p.modules.size()) || !owns_weights(p.modules[s.module])))
        s.module = index;
      s.outs = 1;
      const ShapeClass a0 = s.args.empty() ? ShapeClass::full : cls[s.args[0]];
      switch (s.op) {
        case Op::binary:
          if (s.args.size() < 2) s.args.push_back(s.args[0]);
          s.args.resize(2);
          s.out_classes = {merge(cls[s.args[0]], cls[s.args[1]])};
          break;
        case Op::reduce_last:
          full_arg(s.args[0]);
          s.out_classes = {ShapeClass::col};
          break;
        case Op::reduce_batch:
          full_arg(s.args[0]);
          s.out_classes = {ShapeClass::row};
          break;
        case Op::linear:
        case Op::checkpoint:
        case Op::set_cond:
          full_arg(s.args[0]);
          s.args.resize(1);
          s.out_classes = {ShapeClass::full};
          break;
        case Op::param:
          s.args.clear();
          s.out_classes = {ShapeClass::row};
          break;
        case Op::read_cond:  // returns its argument when no cond was set
          s.args.resize(1);
          full_arg(s.args[0]);
          s.out_classes = {ShapeClass::full};
          break;
        case Op::call:
        case Op::route: {
          const ModuleSpec& child = p.modules[m.children[s.child]];
          s.args.resize(arity(child), 0);
          for (int& a : s.args) full_arg(a);
          s.outs = child.n_out;
          s.out_classes = child.out_classes;
          break;
        }
        default:
          s.args.resize(1);
          s.out_classes = {a0};
          break;
      }
      for (ShapeClass c : s.out_classes) cls.push_back(c);
    }
    for (int& r : m.returns)
      if (!valid(r)) r = static_cast<int>(cls.size()) - 1;
    if (m.returns.empty()) m.returns = {static_cast<int>(cls.size()) - 1};
    if (must_return_full) {
      m.returns.resize(1);
      full_arg(m.returns[0]);
    }
    m.n_out = static_cast<int>(m.returns.size());
    m.out_classes.clear();
    for (int r : m.returns) m.out_classes.push_back(cls[r]);
  }
};

}  // namespace

bool check(Program& p) {
  if (p.modules.empty() || p.modules[0].kind != ModuleKind::prog) return false;
  if (p.width < 2) p.width = 2;
  Driver& d = p.driver;
  if (d.steps < 1) d.steps = 1;
  d.batch.resize(d.steps, d.batch.empty() ? 2 : d.batch.back());
  for (int& b : d.batch)
    if (b < 1) b = 1;
  Checker c{p, std::vector<int>(p.modules.size(), 0)};
  if (!c.module(0, false)) return false;
  for (size_t i = 1; i < p.modules.size(); ++i)
    if (c.state[i] == 0 && !c.module(static_cast<int>(i), false)) return false;
  return true;
}

std::vector<int> reachable_modules(const Program& p) {
  std::vector<int> order;
  std::vector<bool> seen(p.modules.size(), false);
  std::function<void(int)> visit = [&](int i) {
    if (i < 0 || i >= static_cast<int>(p.modules.size()) || seen[i]) return;
    seen[i] = true;
    order.push_back(i);
    for (int c : p.modules[i].children) visit(c);
  };
  visit(0);
  return order;
}

}  // namespace remat::program_fuzz
