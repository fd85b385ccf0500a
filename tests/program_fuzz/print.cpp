// to_pseudo_code: a program as C++-like text, close to the test a person would write from it.
#include <algorithm>
#include <sstream>

#include "program.h"

namespace remat::program_fuzz {

namespace {

const char* unary_name(int k) {
  static const char* names[] = {"tanh", "sigmoid", "gelu", "silu", "square", "neg", "relu", "exp", "mul_scalar", "add_scalar"};
  return names[k];
}
const char* binary_name(int k) {
  static const char* names[] = {"add", "sub", "mul", "maximum"};
  return names[k];
}

std::string module_name(int i) { return i == 0 ? "Root" : "M" + std::to_string(i); }

std::string describe_module(const ModuleSpec& m, int width) {
  const std::string w = std::to_string(width);
  switch (m.kind) {
    case ModuleKind::linear: return "nn::Linear(" + w + ", " + w + ")";
    case ModuleKind::dropout: return "nn::Dropout(0.25)";
    case ModuleKind::tanh: return "nn::Tanh()";
    case ModuleKind::layer_norm: return "nn::LayerNorm(" + w + ")";
    case ModuleKind::sequential: return "nn::Sequential";
    case ModuleKind::prog: return "prog";
  }
  return "?";
}

struct Printer {
  const Program& p;
  std::ostringstream out;

  std::string reg(int r) const { return "r" + std::to_string(r); }
  std::string define(const Stmt& s, int r) const {
    if (s.outs == 1) return "Tensor " + reg(r) + " = ";
    std::string d = "auto [";
    for (int k = 0; k < s.outs; ++k) d += (k ? ", " : "") + reg(r + k);
    return d + "] = ";
  }
  std::string owner(int self, int m, const char* what) const {
    return (m == self ? std::string("") : "model." + module_name(m) + "->") + what;
  }
  std::string child(const ModuleSpec& m, int slot) const { return module_name(m.children[slot]); }

  std::string expr(const ModuleSpec& m, int self, const Stmt& s) const {
    auto a = [&](size_t i) { return reg(s.args[i]); };
    std::ostringstream e;
    switch (s.op) {
      case Op::unary:
        e << unary_name(s.kind) << "(" << a(0);
        if (s.kind >= static_cast<int>(Unary::mul_scalar)) e << ", " << s.c;
        e << ")";
        break;
      case Op::binary: e << binary_name(s.kind) << "(" << a(0) << ", " << a(1) << ")"; break;
      case Op::reduce_last: e << "mean(" << a(0) << ", {-1}, /*keepdim=*/true)"; break;
      case Op::reduce_batch: e << "sum(" << a(0) << ", {0}, /*keepdim=*/true)"; break;
      case Op::linear: e << "linear(" << a(0) << ", " << owner(self, s.module, "w") << ", " << owner(self, s.module, "b") << ")"; break;
      case Op::param: e << owner(self, s.module, "v") << "  /* the parameter itself */"; break;
      case Op::call: {
        e << child(m, s.child) << "->forward(";
        for (size_t i = 0; i < s.args.size(); ++i) e << (i ? ", " : "") << a(i);
        e << ")";
        break;
      }
      case Op::route:
        e << "(sum(" << a(0) << ".detach()).item() > 0 ? " << child(m, s.child) << " : " << child(m, s.child2)
          << ")->forward(" << a(0) << ")";
        break;
      case Op::detach: e << a(0) << ".detach()"; break;
      case Op::dropout: e << "dropout(" << a(0) << ", " << s.c << ", training())"; break;
      case Op::noise: e << "add(" << a(0) << ", 0.1 * randn(" << a(0) << ".shape(), dtype, RngState{" << s.seed << ", 0}))"; break;
      case Op::constant: e << "mul(" << a(0) << ", full(" << a(0) << ".shape(), " << s.c << "))"; break;
      case Op::in_place: e << a(0) << ";  " << a(0) << ".copy_(mul_scalar(" << a(0) << ".detach(), " << s.c << "))  /* in place */"; break;
      case Op::stash: e << a(0) << ";  stash.push_back(" << a(0) << ")"; break;
      case Op::set_cond: e << a(0) << ";  " << child(m, s.child) << "->cond = " << a(0); break;
      case Op::read_cond: e << "cond.defined() ? mul(" << a(0) << ", cond) : " << a(0); break;
      case Op::view: e << a(0) << ".slice(-1, 0, W)  /* a view */"; break;
      case Op::custom: e << (s.c > 0 ? "cube_with_side_effect" : "cube") << "({" << a(0) << "})[0]  /* remat::CustomOp */"; break;
      case Op::async: e << "std::async([=] { return tanh(" << a(0) << "); }).get()  /* another thread */"; break;
      case Op::scalar: e << "mul_scalar(" << a(0) << ", this->scale)  /* 1.5; the driver may set 2.5 before backward */"; break;
      case Op::buffer:
        e << a(0) << ";  " << (s.c > 0 ? "if (!is_recomputing()) " : "")
          << "count.copy_(0.5 * count + mean(" << a(0) << ").item())  /* registered buffer */";
        break;
      case Op::checkpoint: e << "remat::checkpoint([this](const Tensor& h) { return tanh(linear(h, w, b)); }, " << a(0) << ")"; break;
    }
    return e.str();
  }

  void module(int i) {
    const ModuleSpec& m = p.modules[i];
    if (m.kind != ModuleKind::prog) {
      out << "// " << module_name(i) << " = " << describe_module(m, p.width);
      if (m.kind == ModuleKind::sequential) {
        out << " {";
        for (size_t k = 0; k < m.children.size(); ++k) out << (k ? ", " : "") << module_name(m.children[k]);
        out << "}";
      }
      if (m.role == Role::layer) out << "  set_layer()";
      if (!m.own_policy.empty()) out << "  set_policy(" << m.own_policy << ")";
      out << "\n";
      return;
    }
    out << "struct " << module_name(i) << " : nn::Module {  // params w[" << p.width << "," << p.width << "] b["
        << p.width << "] v[" << p.width << "], buffer count[" << p.width << "]";
    if (m.tie_to >= 0) out << "; w tied to " << module_name(m.tie_to) << "'s";
    if (m.role == Role::layer) out << "; set_layer()";
    if (m.role == Role::transparent) out << "; set_transparent()";
    if (!m.own_policy.empty()) out << "; set_policy(" << m.own_policy << ")";
    if (!m.children.empty()) {
      out << "\n  // children:";
      for (int c : m.children) out << " " << module_name(c);
    }
    out << "\n  TensorList forward(";
    for (int k = 0; k < m.n_in; ++k) out << (k ? ", " : "") << "Tensor r" << k;
    out << ") {\n";
    int r = m.n_in;
    for (size_t k = 0; k < m.body.size();) {
      const Stmt& first = m.body[k];
      if (!first.no_grad) {
        out << "    " << define(first, r) << expr(m, i, first) << ";\n";
        r += first.outs;
        ++k;
        continue;
      }
      // a no-grad block: its registers declared before it, assigned in it
      size_t end = k;
      int declared = r;
      out << "    Tensor";
      while (end < m.body.size() && m.body[end].no_grad) {
        for (int o = 0; o < m.body[end].outs; ++o) out << (declared > r ? ", " : " ") << reg(declared++);
        ++end;
      }
      out << ";\n    {\n      NoGradGuard no_grad;\n";
      for (; k < end; ++k) {
        const Stmt& s = m.body[k];
        out << "      ";
        if (s.outs == 1) out << reg(r) << " = ";
        else {
          out << "std::tie(";
          for (int o = 0; o < s.outs; ++o) out << (o ? ", " : "") << reg(r + o);
          out << ") = ";
        }
        out << expr(m, i, s) << ";\n";
        r += s.outs;
      }
      out << "    }\n";
    }
    out << "    return {";
    for (size_t k = 0; k < m.returns.size(); ++k) out << (k ? ", " : "") << reg(m.returns[k]);
    out << "};\n  }\n};\n";
  }

  void driver() {
    const Driver& d = p.driver;
    out << "// driver: " << d.steps << " steps, batch sizes {";
    for (size_t i = 0; i < d.batch.size(); ++i) out << (i ? ", " : "") << d.batch[i];
    out << "}, width " << p.width << (d.bf16 ? ", root->set_compute_dtype(bf16)" : "")
        << (d.input_requires_grad ? ", x.requires_grad_()" : "") << "\n";
    out << "//   out = root->forward(x);  loss = mean(square(out[0])) + 0.5 * sum(mean(out[1:]))"
        << (d.aux_loss ? " + 0.01 * sum(mean(stash))" : "") << "\n";
    if (d.change_scale) out << "//   every module's scale = 2.5 (a C++ member changed after the forward pass)\n";
    static const char* backward[] = {"loss.backward()", "loss.backward(retain_graph); mean(out[0]).backward()",
                                     "remat::grad({loss}, {stash[0] or out[0]}, retain_graph); loss.backward()",
                                     "loss.backward(), gradients accumulated over two steps"};
    out << "//   " << backward[static_cast<int>(d.backward)];
    static const char* optim[] = {"", "; SGD(lr 0.1, momentum 0.5).step()", "; AdamW(lr 0.01).step()"};
    out << optim[d.optimizer] << "; zero_grad()\n";
  }
};

}  // namespace

std::string to_pseudo_code(const Program& p) {
  Printer printer{p, {}};
  printer.out << "// program seed " << p.seed << "\n";
  const std::vector<int> order = reachable_modules(p);
  for (auto it = order.rbegin(); it != order.rend(); ++it) printer.module(*it);
  std::vector<bool> read(p.modules.size(), false);
  for (int m : order) {
    if (p.modules[m].tie_to >= 0) read[p.modules[m].tie_to] = true;
    for (const Stmt& s : p.modules[m].body)
      if ((s.op == Op::linear || s.op == Op::param) && s.module >= 0) read[s.module] = true;
  }
  for (size_t i = 0; i < p.modules.size(); ++i)
    if (read[i] && std::find(order.begin(), order.end(), static_cast<int>(i)) == order.end()) {
      printer.out << "// (not called; its weights are read) ";
      printer.module(static_cast<int>(i));
    }
  printer.driver();
  return printer.out.str();
}

}  // namespace remat::program_fuzz
