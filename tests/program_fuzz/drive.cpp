// The driver of a program: the training loop a user writes around the model (run.h).
#include <cmath>
#include <memory>

#include "model.h"
#include "run.h"

namespace remat::program_fuzz {

namespace {

Tensor f32(const Tensor& t) { return t.dtype() == DType::f32 ? t : t.to(DType::f32); }

// The stashes of every prog module reachable from the root, in module order.
TensorList stashes(const Model& m) {
  TensorList all;
  for (int i : reachable_modules(*m.program))
    if (const ProgModule* p = m.progs[i])
      for (const Tensor& t : p->stash) all.push_back(t);
  return all;
}

std::unique_ptr<nn::Optimizer> make_optimizer(int kind, const TensorList& params) {
  if (kind == 1) return std::make_unique<nn::SGD>(params, nn::SGDOptions{.lr = 0.1, .momentum = 0.5});
  if (kind == 2) return std::make_unique<nn::AdamW>(params, nn::AdamWOptions{.lr = 0.01});
  return nullptr;
}

// Self-test: one ulp added to the first gradient, as a wrong policy would.
void perturb_first_gradient(const nn::Module& root) {
  for (const Tensor& p : root.parameters()) {
    const Tensor g = p.grad();
    if (!g.defined() || g.dtype() != DType::f32 || g.numel() == 0) continue;
    float* d = g.data<float>();
    d[0] = std::nextafter(d[0], INFINITY);
    return;
  }
}

Tensor loss_of(const TensorList& outs, const TensorList& stash, bool aux) {
  Tensor loss = mean(square(f32(outs[0])));
  for (size_t i = 1; i < outs.size(); ++i) loss = add(loss, mul_scalar(mean(f32(outs[i])), 0.5));
  if (aux)
    for (const Tensor& s : stash) loss = add(loss, mul_scalar(mean(f32(s)), 0.01));
  return loss;
}

void record_values(Recorder& rec, const std::string& when, const TensorList& outs, const TensorList& stash, bool flags) {
  for (size_t i = 0; i < outs.size(); ++i) rec.value(when + ".out" + std::to_string(i), outs[i], flags);
  rec.number(when + ".stashes", static_cast<double>(stash.size()));
  for (size_t i = 0; i < stash.size(); ++i) rec.value(when + ".stash" + std::to_string(i), stash[i], flags);
}

void step(const Program& p, const Model& m, nn::Optimizer* optimizer, bool perturb, int s, Recorder& rec) {
  const Driver& d = p.driver;
  nn::Module& root = *m.root();
  for (ProgModule* prog : m.progs)
    if (prog) prog->stash.clear(), prog->cond = Tensor(), prog->scale = 1.5;
  rec.step(s);
  rec.begin_step("B" + std::to_string(d.batch[s]));
  rec.phase("forward");
  manual_seed(d.data_seed + 7919 * static_cast<uint64_t>(s));
  Tensor x = randn({d.batch[s], p.width}, DType::f32, RngState{d.data_seed, 4096 * static_cast<uint64_t>(s)});
  if (d.input_requires_grad) x.requires_grad_();
  const Tensor input = d.bf16 ? x.to(DType::bf16) : x;
  TensorList inputs(p.modules[0].n_in, input);
  TensorList outs = root.forward(inputs);
  rec.phase("loss");
  TensorList stash = stashes(m);
  Tensor loss = loss_of(outs, stash, d.aux_loss);
  rec.value("loss", loss);
  record_values(rec, "forward", outs, stash, true);
  if (d.change_scale)
    for (ProgModule* prog : m.progs)
      if (prog) prog->scale = 2.5;
  rec.phase("backward");
  switch (d.backward) {
    case BackwardKind::plain:
    case BackwardKind::accumulate: loss.backward(); break;
    case BackwardKind::retain_twice:
      loss.backward(Tensor(), true);
      rec.grads("first", root);
      rec.phase("backward2");
      mean(f32(outs[0])).backward();
      break;
    case BackwardKind::grad_intermediate: {
      rec.phase("grad");
      const Tensor target = stash.empty() ? outs[0] : stash[0];
      const TensorList g = remat::grad({loss}, {target}, {}, true);
      rec.value("grad_of_intermediate", g[0], false);
      rec.phase("backward");
      loss.backward();
      break;
    }
  }
  if (perturb && s == 0) perturb_first_gradient(root);
  rec.phase("observe");
  rec.grads("model", root);
  if (d.input_requires_grad) rec.value("input.grad", x.grad(), false);
  record_values(rec, "after_backward", outs, stash, false);
  for (const auto& [name, t] : root.named_buffers()) rec.value("buffer." + name, t, false);
  for (int i : reachable_modules(p))
    if (const ProgModule* prog = m.progs[i]) rec.number("m" + std::to_string(i) + ".side_effects", prog->side_effects);
  rec.phase("optimizer");
  const bool accumulate = d.backward == BackwardKind::accumulate;
  const bool boundary = !accumulate || s % 2 == 1 || s + 1 == d.steps;
  if (optimizer && boundary) optimizer->step();
  if (boundary) root.zero_grad();
  rec.end_step();
}

}  // namespace

Body program_body(const Program& program, const BodyOptions& options) {
  auto p = std::make_shared<const Program>(program);
  return [p, options](Recorder& rec) {
    rec.phase("build");
    std::shared_ptr<Model> m = build_model(*p);
    rec.set_model(m->root());
    const bool perturb = options.perturb && !(current_policy() == Policy::save_all());
    auto optimizer = make_optimizer(p->driver.optimizer, m->root()->parameters());
    for (int s = 0; s < p->driver.steps; ++s) step(*p, *m, optimizer.get(), perturb, s, rec);
    rec.phase("final");
    rec.parameters("final", *m->root());
  };
}

MatrixResult run_program_matrix(const Program& program, MatrixOptions options, const BodyOptions& body) {
  options.broken_rules = program.broken_rules();
  return run_matrix(program_body(program, body), options);
}

MatrixResult run_program_matrix(const Program& program, const std::vector<std::string>& policies) {
  MatrixOptions o;
  o.policies = policies;
  return run_program_matrix(program, o);
}

}  // namespace remat::program_fuzz
