#include "model.h"

#include <future>
#include <optional>

namespace remat::program_fuzz {

namespace {

CustomOp make_cube(ProgModule* counted) {
  CustomOp op;
  op.name = counted ? "cube_counted" : "cube";
  op.forward = [](const TensorList& in, SaveContext& ctx) {
    ctx.save(in[0]);
    return TensorList{mul(mul(in[0], in[0]), in[0])};
  };
  op.backward = [](const TensorList& grads, const SavedValues& saved) {
    return TensorList{mul(mul_scalar(square(saved[0]), 3.0), grads[0])};
  };
  if (counted) op.side_effect = [counted](const TensorList&, const TensorList&) { ++counted->side_effects; };
  return op;
}

Tensor unary(Unary kind, const Tensor& a, double c) {
  switch (kind) {
    case Unary::tanh: return tanh(a);
    case Unary::sigmoid: return sigmoid(a);
    case Unary::gelu: return gelu(a);
    case Unary::silu: return silu(a);
    case Unary::square: return square(a);
    case Unary::neg: return neg(a);
    case Unary::relu: return relu(a);
    case Unary::exp: return exp(a);
    case Unary::mul_scalar: return mul_scalar(a, c);
    case Unary::add_scalar: return add_scalar(a, c);
  }
  return a;
}

Tensor binary(Binary kind, const Tensor& a, const Tensor& b) {
  switch (kind) {
    case Binary::add: return add(a, b);
    case Binary::sub: return sub(a, b);
    case Binary::mul: return mul(a, b);
    case Binary::maximum: return maximum(a, b);
  }
  return a;
}

}  // namespace

ProgModule::ProgModule(const Model* model, int index) : model_(model), index_(index) {
  const int64_t W = model->program->width;
  w = register_parameter("w", {W, W}, DType::f32, nn::Init::uniform(-0.5, 0.5));
  b = register_parameter("b", {W}, DType::f32, nn::Init::uniform(-0.1, 0.1));
  v = register_parameter("v", {W}, DType::f32, nn::Init::uniform(-0.5, 0.5));
  buffer = register_buffer("count", zeros({W}));
  cube_ = make_cube(nullptr);
  cube_counted_ = make_cube(this);
}

// The weight `w` / bias `b` / vector `v` of a module that owns weights (a prog or a Linear).
static Tensor owned(const Model& m, int owner, char which) {
  if (const ProgModule* p = m.progs[owner]) return which == 'w' ? p->w : which == 'b' ? p->b : p->v;
  auto* linear = dynamic_cast<nn::Linear*>(m.modules[owner].get());
  REMAT_CHECK(linear, "program_fuzz: module ", owner, " owns no weights");
  return which == 'w' ? linear->weight : linear->bias;
}

Tensor ProgModule::call(const Stmt& s, int slot, const TensorList& regs, TensorList& out) {
  const ModuleSpec& spec = model_->program->modules[index_];
  nn::Module& child = *model_->modules[spec.children[slot]];
  TensorList args;
  for (int a : s.args) args.push_back(regs[a]);
  out = child.forward(args);
  return out[0];
}

void ProgModule::run(const Stmt& s, TensorList& regs) {
  std::optional<NoGradGuard> no_grad;
  if (s.no_grad) no_grad.emplace();
  Tensor a = s.args.empty() ? Tensor() : regs[s.args[0]];
  const Model& m = *model_;
  Tensor r;
  switch (s.op) {
    case Op::unary: r = unary(static_cast<Unary>(s.kind), a, s.c); break;
    case Op::binary: r = binary(static_cast<Binary>(s.kind), a, regs[s.args[1]]); break;
    case Op::reduce_last: r = mean(a, {-1}, true); break;
    case Op::reduce_batch: r = sum(a, {0}, true); break;
    case Op::linear: r = linear(a, weight(owned(m, s.module, 'w')), weight(owned(m, s.module, 'b'))); break;
    case Op::param: r = weight(owned(m, s.module, 'v')); break;
    case Op::call:
    case Op::route: {
      int slot = s.child;
      if (s.op == Op::route && !(sum(a.detach()).item() > 0)) slot = s.child2;
      TensorList out;
      call(s, slot, regs, out);
      for (int i = 0; i < s.outs; ++i) regs.push_back(i < static_cast<int>(out.size()) ? out[i] : out.back());
      return;
    }
    case Op::detach: r = a.detach(); break;
    case Op::dropout: r = dropout(a, s.c, training()); break;
    case Op::noise: r = add(a, mul_scalar(randn(a.shape(), a.dtype(), RngState{s.seed, 0}), 0.1)); break;
    case Op::constant: r = mul(a, full(a.shape(), s.c, a.dtype())); break;
    case Op::in_place: {
      NoGradGuard writes;
      const Tensor scaled = mul_scalar(a.detach(), s.c);
      a.copy_(scaled);
      r = a;
      break;
    }
    case Op::stash: stash.push_back(a), r = a; break;
    case Op::set_cond:
      m.progs[m.program->modules[index_].children[s.child]]->cond = a;
      r = a;
      break;
    case Op::read_cond: r = cond.defined() ? mul(a, cond) : a; break;
    case Op::view: r = a.slice(-1, 0, a.size(-1)); break;
    case Op::custom: r = (s.c > 0 ? cube_counted_ : cube_)({a})[0]; break;
    case Op::async: r = std::async(std::launch::async, [a] { return tanh(a); }).get(); break;
    case Op::scalar: r = mul_scalar(a, scale); break;
    case Op::buffer: {
      if (s.c == 0 || !is_recomputing()) {
        NoGradGuard writes;
        const double level = mean(a.detach()).item();
        buffer.copy_(add_scalar(mul_scalar(buffer, 0.5), level));
      }
      r = a;
      break;
    }
    case Op::checkpoint: {
      ProgModule* self = this;
      r = remat::checkpoint([self](const Tensor& h) { return tanh(linear(h, self->weight(self->w), self->weight(self->b))); },
                            a);
      break;
    }
  }
  regs.push_back(r);
}

TensorList ProgModule::forward_list_impl(const TensorList& inputs) {
  const ModuleSpec& spec = model_->program->modules[index_];
  REMAT_CHECK(static_cast<int>(inputs.size()) == spec.n_in, "M", index_, ": ", inputs.size(), " inputs, expected ",
              spec.n_in);
  TensorList regs = inputs;
  for (const Stmt& s : spec.body) run(s, regs);
  TensorList out;
  for (int r : spec.returns) out.push_back(regs[r]);
  return out;
}

namespace {

void construct(Model& m, int i, std::vector<int>& state) {
  if (state[i]) return;
  state[i] = 1;
  const ModuleSpec& spec = m.program->modules[i];
  const int64_t W = m.program->width;
  std::shared_ptr<nn::Module> module;
  switch (spec.kind) {
    case ModuleKind::prog: {
      auto prog = std::make_shared<ProgModule>(&m, i);
      if (spec.tie_to >= 0) {
        construct(m, spec.tie_to, state);
        prog->tie(owned(m, spec.tie_to, 'w'));
      }
      m.progs[i] = prog.get();
      module = prog;
      break;
    }
    case ModuleKind::linear: module = std::make_shared<nn::Linear>(W, W); break;
    case ModuleKind::dropout: module = std::make_shared<nn::Dropout>(spec.dropout_p); break;
    case ModuleKind::tanh: module = std::make_shared<nn::Tanh>(); break;
    case ModuleKind::layer_norm: module = std::make_shared<nn::LayerNorm>(W); break;
    case ModuleKind::sequential: module = std::make_shared<nn::Sequential>(); break;
  }
  if (!spec.own_policy.empty()) module->set_policy(Policy::parse(spec.own_policy));
  if (spec.role == Role::layer) module->set_layer();
  if (spec.role == Role::transparent) module->set_transparent();
  m.modules[i] = module;
}

}  // namespace

std::shared_ptr<Model> build_model(const Program& program) {
  auto m = std::make_shared<Model>();
  m->program = &program;
  const size_t n = program.modules.size();
  m->modules.resize(n);
  m->progs.assign(n, nullptr);
  std::vector<int> state(n, 0);
  for (size_t i = 0; i < n; ++i) construct(*m, static_cast<int>(i), state);
  for (size_t i = 0; i < n; ++i) {
    const ModuleSpec& spec = program.modules[i];
    for (size_t k = 0; k < spec.children.size(); ++k) {
      const std::string name = "c" + std::to_string(k);
      if (ProgModule* p = m->progs[i]) p->attach(name, m->modules[spec.children[k]]);
      else if (auto* seq = dynamic_cast<nn::Sequential*>(m->modules[i].get())) seq->add(m->modules[spec.children[k]], name);
    }
  }
  m->root()->reset_parameters(program.seed);
  if (program.driver.bf16) m->root()->set_compute_dtype(DType::bf16);
  return m;
}

}  // namespace remat::program_fuzz
