#include "never_silent.h"

namespace remat::never_silent {

void train(Recorder& rec, const std::shared_ptr<nn::Module>& model, const Steps& steps, const ForwardLoss& forward_loss,
           const Backward& backward) {
  rec.set_model(model);
  model->reset_parameters(steps.seed);
  std::unique_ptr<nn::Optimizer> optimizer;
  if (steps.optimizer == 1) optimizer = std::make_unique<nn::SGD>(model->parameters(), nn::SGDOptions{.lr = 0.1});
  if (steps.optimizer == 2) optimizer = std::make_unique<nn::AdamW>(model->parameters(), nn::AdamWOptions{.lr = 0.01});
  for (int s = 0; s < steps.steps; ++s) {
    const int64_t batch = steps.batch[static_cast<size_t>(s) % steps.batch.size()];
    rec.step(s);
    rec.begin_step("B" + std::to_string(batch));
    rec.phase("forward");
    manual_seed(steps.seed * 1000 + static_cast<uint64_t>(s));
    Tensor x = randn({batch, kWidth}, DType::f32, RngState{steps.seed, 1024 * static_cast<uint64_t>(s)});
    if (steps.input_requires_grad) x.requires_grad_();
    const Tensor loss = forward_loss(rec, x, s);
    rec.value("loss", loss);
    rec.phase("backward");
    if (backward) backward(rec, loss, s);
    else loss.backward();
    rec.phase("observe");
    rec.grads("model", *model);
    if (steps.input_requires_grad) rec.value("x.grad", x.grad(), false);
    rec.phase("optimizer");
    if (optimizer) optimizer->step();
    model->zero_grad();
    rec.end_step();
  }
  rec.phase("final");
  rec.parameters("final", *model);
}

namespace {

bool accepted(const program_fuzz::PairResult& p) {
  return p.verdict.kind == program_fuzz::VerdictKind::ok || p.verdict.kind == program_fuzz::VerdictKind::refused;
}

}  // namespace

program_fuzz::MatrixResult expect_matches_save_all(const Body& body, std::vector<Rule> breaks,
                                                   std::vector<std::string> policies) {
  program_fuzz::MatrixOptions o;
  o.broken_rules = std::move(breaks);
  if (!policies.empty()) o.policies = std::move(policies);
  program_fuzz::MatrixResult m = program_fuzz::run_matrix(body, o);
  EXPECT_FALSE(m.save_all.error.has_value()) << "save-all raised: " << m.save_all.error->message;
  for (const auto& p : m.pairs) EXPECT_TRUE(accepted(p)) << program_fuzz::describe(p);
  return m;
}

program_fuzz::MatrixResult expect_raises_like_save_all(const Body& body, const std::string& save_all_says,
                                                       std::vector<Rule> breaks) {
  program_fuzz::MatrixOptions o;
  o.broken_rules = std::move(breaks);
  program_fuzz::MatrixResult m = program_fuzz::run_matrix(body, o);
  EXPECT_TRUE(m.save_all.error.has_value()) << "save-all did not raise";
  if (m.save_all.error) {
    EXPECT_NE(m.save_all.error->message.find(save_all_says), std::string::npos) << m.save_all.error->message;
  }
  for (const auto& p : m.pairs) EXPECT_TRUE(accepted(p)) << program_fuzz::describe(p);
  return m;
}

}  // namespace remat::never_silent
