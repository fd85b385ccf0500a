// The generator of random model programs (program.h). Choices are drawn from a Source, so the
// same seed (or the same fuzz bytes) gives the same program. The mix of constructs follows the
// issue's list: module trees of depth up to 3, no-grad blocks, detach, layers called twice,
// weight tying, routers, changing batch sizes, stashes and auxiliary losses, several returned
// values, values read after the backward pass, dropout and explicit-state noise, in-place writes,
// parameters used across layers, layers returning a parameter or a view of their input, custom
// ops, optimizer steps, accumulation, retained graphs, grad of intermediates, bf16. A few
// constructs break a rule knowingly (a C++ scalar changed between forward and backward, a buffer
// written while recomputing, a value made on another thread); Program::broken_rules lists them.
#include <algorithm>

#include "program.h"

namespace remat::program_fuzz {

Source Source::from_seed(uint64_t seed) {
  Source s;
  s.state_ = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  return s;
}

Source Source::from_bytes(const uint8_t* data, size_t size) {
  Source s;
  s.bytes_ = true;
  s.data_ = data;
  s.size_ = size;
  return s;
}

uint32_t Source::next() {
  if (bytes_) {
    // Two bytes a choice; past the end, zeros (the first option of every choice: small programs).
    uint32_t v = 0;
    for (int i = 0; i < 2; ++i) v = (v << 8) | (pos_ < size_ ? data_[pos_++] : 0u);
    return v;
  }
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);  // splitmix64
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>((z ^ (z >> 31)) >> 32);
}

int Source::below(int n) { return n <= 1 ? 0 : static_cast<int>(next() % static_cast<uint32_t>(n)); }

const char* op_name(Op op) {
  static const char* names[] = {"unary",  "binary",   "reduce_last", "reduce_batch", "linear",   "param",
                                "call",   "route",    "detach",      "dropout",      "noise",    "constant",
                                "in_place", "stash",  "set_cond",    "read_cond",    "view",     "custom",
                                "async",  "scalar",   "buffer",      "checkpoint"};
  return names[static_cast<int>(op)];
}

std::vector<Rule> Program::broken_rules() const {
  std::vector<Rule> rules;
  auto add = [&](Rule r) {
    if (std::find(rules.begin(), rules.end(), r) == rules.end()) rules.push_back(r);
  };
  for (int m : reachable_modules(*this)) {
    // A member set after a call of the module that reads it (FiLM conditioning changed between
    // two calls): a recomputation of the first call reads the new value.
    std::vector<bool> called(modules[m].children.size(), false);
    for (const Stmt& s : modules[m].body) {
      if ((s.op == Op::call || s.op == Op::route) && s.child >= 0) {
        called[s.child] = true;
        if (s.op == Op::route && s.child2 >= 0) called[s.child2] = true;
      }
      if (s.op != Op::set_cond || s.child < 0 || !called[s.child]) continue;
      for (const Stmt& r : modules[modules[m].children[s.child]].body)
        if (r.op == Op::read_cond) add(Rule::deterministic);
    }
    for (const Stmt& s : modules[m].body) {
      if (s.op == Op::scalar && driver.change_scale) add(Rule::deterministic);
      if (s.op == Op::buffer && s.c == 0) add(Rule::buffer_write);
      if (s.op == Op::async) add(Rule::thread);
      if (s.op == Op::in_place) add(Rule::in_place);
    }
  }
  return rules;
}

namespace {

struct Gen {
  Source& src;
  Program& p;
  int regs = 0;  // registers defined so far in the body being generated

  int any_reg() { return src.below(regs); }
  // A recent register: most programs chain their values.
  int recent_reg() { return src.chance(60) ? regs - 1 : std::max(0, regs - 1 - src.below(std::min(regs, 3))); }

  int add_module(ModuleSpec spec) {
    p.modules.push_back(std::move(spec));
    return static_cast<int>(p.modules.size()) - 1;
  }

  // The prog modules and lib Linears that exist so far: owners of weights to read.
  int pick_owner(int self) {
    std::vector<int> owners;
    for (int i = 0; i < static_cast<int>(p.modules.size()); ++i)
      if (p.modules[i].kind == ModuleKind::prog || p.modules[i].kind == ModuleKind::linear) owners.push_back(i);
    if (owners.empty() || src.chance(60)) return self;
    return owners[src.below(static_cast<int>(owners.size()))];
  }

  Stmt emit(Stmt s) {
    regs += 1;  // check() fixes calls with several outputs
    return s;
  }

  Stmt compute_stmt(int self, bool in_layer) {
    Stmt s;
    const int r = src.below(100);
    const int a = recent_reg();
    if (r < 22) {
      s.op = Op::unary, s.kind = src.below(kUnaryCount), s.args = {a};
      s.c = 0.5 + 0.25 * src.below(4);
    } else if (r < 38) {
      s.op = Op::binary, s.kind = src.below(kBinaryCount), s.args = {a, any_reg()};
    } else if (r < 48) {
      s.op = Op::linear, s.module = pick_owner(self), s.args = {a};
    } else if (r < 52) {
      s.op = src.chance(70) ? Op::reduce_last : Op::reduce_batch, s.args = {a};
    } else if (r < 56) {
      s.op = Op::param, s.module = pick_owner(self);
    } else if (r < 60) {
      s.op = Op::detach, s.args = {a};
    } else if (r < 64) {
      s.op = Op::dropout, s.args = {a}, s.c = 0.25;
    } else if (r < 68) {
      s.op = Op::noise, s.args = {a}, s.seed = src.next();
    } else if (r < 72) {
      s.op = Op::constant, s.args = {a}, s.c = 0.5 + src.below(3);
    } else if (r < 74) {
      s.op = Op::in_place, s.args = {any_reg()}, s.c = 0.5;
    } else if (r < 80) {
      s.op = Op::stash, s.args = {a};
    } else if (r < 84) {
      s.op = Op::view, s.args = {a};
    } else if (r < 88) {
      s.op = Op::custom, s.args = {a}, s.c = src.chance(30) ? 1 : 0;
    } else if (r < 91) {  // an explicit region inside a layer; a stash in the model's code
      s.op = in_layer ? Op::checkpoint : Op::stash, s.args = {a};
    } else if (r < 92) {
      s.op = Op::async, s.args = {a};
    } else if (r < 94) {
      s.op = Op::scalar, s.args = {a};
    } else if (r < 97) {
      s.op = Op::buffer, s.args = {a}, s.c = src.chance(70) ? 1 : 0;
    } else {
      s.op = Op::read_cond, s.args = {a};
    }
    s.no_grad = src.chance(4);
    return emit(s);
  }

  // A library layer (a leaf module).
  ModuleSpec lib_module() {
    ModuleSpec m;
    const int r = src.below(4);
    m.kind = r == 0 ? ModuleKind::linear : r == 1 ? ModuleKind::dropout : r == 2 ? ModuleKind::tanh : ModuleKind::layer_norm;
    return m;
  }

  void maybe_policy_and_role(ModuleSpec& m, int depth) {
    if (src.chance(5)) m.own_policy = "save-all";  // (a recomputing one would make the reference recompute)
    if (depth >= 2 && src.chance(10)) m.role = Role::layer;
    if (depth == 2 && src.chance(8)) m.role = Role::transparent;
  }

  // A module at `depth` (the root is 1); returns its index.
  int module(int depth) {
    if (depth > 1 && src.chance(25)) return add_module(lib_module());
    if (depth == 2 && src.chance(8)) {  // a container of layers
      ModuleSpec seq;
      seq.kind = ModuleKind::sequential;
      const int n = src.between(1, 3);
      for (int i = 0; i < n; ++i) seq.children.push_back(depth < 3 ? module(depth + 1) : add_module(lib_module()));
      return add_module(seq);
    }
    ModuleSpec m;
    m.kind = ModuleKind::prog;
    if (depth == 2 && src.chance(15)) m.n_in = 2;
    const int n_children = depth == 1 ? src.between(1, 5) : depth == 2 ? (src.chance(40) ? src.between(1, 2) : 0) : 0;
    for (int i = 0; i < n_children; ++i) m.children.push_back(module(depth + 1));
    if (depth > 1) maybe_policy_and_role(m, depth);
    const int self = static_cast<int>(p.modules.size());  // its index once added (children come first)
    if (self > 0 && src.chance(10)) {
      std::vector<int> weights;
      for (int i = 0; i < self; ++i)
        if (p.modules[i].kind == ModuleKind::prog || p.modules[i].kind == ModuleKind::linear) weights.push_back(i);
      if (!weights.empty()) m.tie_to = weights[src.below(static_cast<int>(weights.size()))];
    }
    regs = m.n_in;
    if (depth == 1) root_body(m, self);
    else layer_body(m, self, depth);
    return add_module(std::move(m));
  }

  Stmt call_stmt(const ModuleSpec& m, int child_slot) {
    Stmt s;
    s.op = Op::call, s.child = child_slot, s.args = {recent_reg()};
    if (p.modules[m.children[child_slot]].kind == ModuleKind::prog && p.modules[m.children[child_slot]].n_in == 2)
      s.args.push_back(any_reg());
    s.no_grad = src.chance(3);  // a teacher called under no-grad
    return emit(s);
  }

  void layer_body(ModuleSpec& m, int self, int depth) {
    const int n = src.between(1, 6);
    int slot = 0;
    if (src.chance(70)) {  // most layers begin with their weights
      Stmt s;
      s.op = Op::linear, s.module = self, s.args = {0};
      m.body.push_back(emit(s));
    }
    for (int i = 0; i < n; ++i) {
      if (!m.children.empty() && src.chance(35)) {
        m.body.push_back(call_stmt(m, slot));
        slot = (slot + 1) % static_cast<int>(m.children.size());
      } else {
        m.body.push_back(compute_stmt(self, true));
      }
    }
    (void)depth;
    const int r = src.below(100);
    if (r < 4) m.returns = {0};                  // returns its input
    else if (r < 8) {                             // returns a view of its input
      Stmt v;
      v.op = Op::view, v.args = {0};
      m.body.push_back(emit(v));
      m.returns = {regs - 1};
    } else if (r < 13) {                          // returns its parameter (a learned query)
      Stmt q;
      q.op = Op::param, q.module = self;
      m.body.push_back(emit(q));
      m.returns = {regs - 1};
    } else {
      m.returns = {regs - 1};
    }
    if (src.chance(12)) m.returns.push_back(any_reg());  // a second output
  }

  void root_body(ModuleSpec& m, int self) {
    const int n_calls = src.between(2, 8);
    for (int i = 0; i < n_calls; ++i) {
      const int slot = src.below(static_cast<int>(m.children.size()));
      const ModuleSpec& child = p.modules[m.children[slot]];
      if (child.kind == ModuleKind::prog && src.chance(10)) {  // FiLM: conditioning set before the call
        Stmt c;
        c.op = Op::set_cond, c.child = slot, c.args = {any_reg()};
        m.body.push_back(emit(c));
      }
      if (m.children.size() >= 2 && src.chance(8)) {  // a router
        Stmt r;
        r.op = Op::route, r.child = slot, r.child2 = (slot + 1) % static_cast<int>(m.children.size());
        r.args = {recent_reg()};
        m.body.push_back(emit(r));
      } else {
        m.body.push_back(call_stmt(m, slot));
      }
      if (src.chance(20)) {  // a residual connection in the model's code
        Stmt add;
        add.op = Op::binary, add.kind = static_cast<int>(Binary::add), add.args = {regs - 1, std::max(0, regs - 2)};
        m.body.push_back(emit(add));
      }
      const int glue = src.chance(50) ? src.between(1, 3) : 0;
      for (int g = 0; g < glue; ++g) m.body.push_back(compute_stmt(self, false));
    }
    if (src.chance(70)) {  // a head with the root's own weights
      Stmt head;
      head.op = Op::linear, head.module = self, head.args = {regs - 1};
      m.body.push_back(emit(head));
    }
    m.returns = {regs - 1};
    if (src.chance(20)) m.returns.push_back(any_reg());  // values returned beside the output
  }
};

}  // namespace

Program generate(Source& source, uint64_t seed_label) {
  Program p;
  p.seed = seed_label;
  p.width = source.between(2, 8);
  Gen g{source, p};
  g.module(1);
  // The root is generated last (its children first); move it to index 0.
  const int root = static_cast<int>(p.modules.size()) - 1;
  std::rotate(p.modules.begin(), p.modules.begin() + root, p.modules.end());
  auto shift = [&](int& i) {
    if (i >= 0) i = i == root ? 0 : i + 1;
  };
  for (ModuleSpec& m : p.modules) {
    for (int& c : m.children) shift(c);
    shift(m.tie_to);
    for (Stmt& s : m.body) shift(s.module);
  }
  Driver& d = p.driver;
  d.steps = source.between(3, 5);
  const int base = source.between(2, 4);
  const bool shapes_change = source.chance(25);
  for (int i = 0; i < d.steps; ++i) d.batch.push_back(shapes_change ? source.between(1, 5) : base);
  const int b = source.below(100);
  d.backward = b < 60   ? BackwardKind::plain
               : b < 72 ? BackwardKind::retain_twice
               : b < 86 ? BackwardKind::grad_intermediate
                        : BackwardKind::accumulate;
  d.optimizer = source.below(3);
  d.aux_loss = source.chance(70);
  d.input_requires_grad = source.chance(30);
  d.bf16 = source.chance(12);
  d.change_scale = source.chance(20);
  d.data_seed = source.next();
  check(p);
  return p;
}

}  // namespace remat::program_fuzz
