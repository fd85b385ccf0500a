// remat/nn/optim.h - optimizers (SGD, AdamW), gradient clipping, the warm-up + cosine schedule.
//
//   remat::nn::AdamW opt(model->parameters(), {.lr = 3e-4, .weight_decay = 0.1});
//   remat::nn::WarmupCosine schedule{.max_lr = 3e-4, .min_lr = 3e-5, .warmup_steps = steps / 50,
//                                    .total_steps = steps};
//   for (int64_t step = 0; step < steps; ++step) {
//     opt.zero_grad();
//     Tensor loss = model->loss(ids, targets);
//     loss.backward();
//     remat::nn::clip_grad_norm(model->parameters(), 1.0);
//     opt.set_lr(schedule(step));
//     opt.step();
//   }
//
// The updates follow PyTorch's torch.optim.SGD and torch.optim.AdamW formulas. They run under
// NoGradGuard and write each parameter in place in one pass over parameter, gradient and state
// (Backend::sgd_step / adamw_step), bumping the storage version so a stale saved value is detected. State tensors (momentum, exp_avg, exp_avg_sq) are
// allocated on the first step of each parameter, in the `other` memory account. Parameters
// without a gradient are skipped (their state and step count are unchanged).
//
// The optimizer inside the backward (FusedOptimizerStep below): each parameter is updated the
// moment its gradient is final and the gradient is dropped at once, so that at most a few
// gradients are alive instead of all of them:
//
//   for (int64_t step = 0; step < steps; ++step) {
//     opt.set_lr(schedule(step));
//     remat::nn::FusedOptimizerStep fused(opt);   // while it lives, backward() steps opt
//     model->loss(ids, targets).backward();       // each parameter updated when its gradient is final
//   }
//
// The parameters end bitwise equal to the unfused loop without clipping (zero_grad, backward,
// step): each update is the same kernel on the same final gradient, and an update changes nothing
// that a later node of the backward reads. Global-norm clipping (clip_grad_norm) needs every
// gradient before the first update, so it cannot be fused: the two do not combine, and
// `remat train --fuse-optimizer` refuses a non-zero --clip. See remat/grad_ready.h for when a
// gradient is final, and for what an exception in the middle of a fused backward leaves behind
// (the parameters already updated stay updated).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "remat/grad_ready.h"
#include "remat/tensor.h"

namespace remat::nn {

class Optimizer {
 public:
  // params: leaf tensors requiring grad (f32 or f64); listed twice is an error.
  Optimizer(TensorList params, double lr, const char* name);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  void step();        // updates every parameter that has a gradient
  void zero_grad();  // drops every parameter's gradient
  // Updates parameter i alone, exactly as step() would (skipped when it has no gradient).
  void step_parameter(size_t i);
  // The position of `p` in params(), or -1 when it is not one of them.
  int64_t index_of(const Tensor& p) const;
  double lr() const { return lr_; }
  void set_lr(double lr);
  const TensorList& params() const { return params_; }
  const char* name() const { return name_; }  // "SGD", "AdamW"

  // ---- state, for training states (remat/nn/training_state.h)
  // What the optimizer keeps for parameter i: its tensors (AdamW: "exp_avg", "exp_avg_sq"; SGD:
  // "momentum_buffer"; none before the parameter's first update), on the parameter's device, and
  // its counters (AdamW: "step").
  struct ParameterState {
    std::vector<std::pair<std::string, Tensor>> tensors;
    std::vector<std::pair<std::string, int64_t>> counters;
  };
  virtual ParameterState parameter_state(size_t i) const = 0;
  // Whether `state` could be parameter i's (the names this optimizer keeps, the parameter's shape
  // and dtype, counters >= 0): a remat::Error naming the difference, else nothing.
  virtual void check_parameter_state(size_t i, const ParameterState& state) const = 0;
  // Replaces parameter i's state with copies of `state`'s tensors (any device; the copies live on
  // the parameter's), after check_parameter_state.
  virtual void set_parameter_state(size_t i, const ParameterState& state) = 0;
  // The options fixed at construction (not the learning rate), as text: compared when a state is loaded.
  virtual std::map<std::string, std::string> options_text() const = 0;

 protected:
  virtual void update(size_t i) = 0;
  TensorList params_;
  double lr_;
  const char* name_;

 private:
  std::unordered_map<const TensorImpl*, size_t> index_;
};

// The optimizer inside the backward. While it lives on a thread, every backward() there updates
// each parameter of `optimizer` as soon as its gradient is final (remat/grad_ready.h), then drops
// that gradient (unless keep_gradients). `before_update(p)`, when given, runs first, with p.grad()
// final: it may read it (a digest, a norm, a finiteness check), change it (add the gradients of
// earlier micro-batches, scale it) or throw to stop the step before p is changed. Leaves that are
// not parameters of the optimizer keep their gradients, as without it.
struct FusedStepOptions {
  GradReadyFn before_update;
  bool keep_gradients = false;
};
class FusedOptimizerStep {
 public:
  explicit FusedOptimizerStep(Optimizer& optimizer, FusedStepOptions options = {});
  size_t updated() const { return updated_; }  // parameters updated so far

 private:
  Optimizer& optimizer_;
  FusedStepOptions options_;
  size_t updated_ = 0;
  GradReadyHook hook_;
};

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  // L2: added to the gradient (coupled)
  bool nesterov = false;      // needs momentum > 0 and dampening 0
};

// g = grad + weight_decay * p
// momentum: buf = g on the first step, then buf = momentum * buf + (1 - dampening) * g;
//           g = nesterov ? g + momentum * buf : buf
// p = p - lr * g
class SGD : public Optimizer {
 public:
  SGD(TensorList params, const SGDOptions& options);
  const Tensor& momentum_buffer(size_t i) const { return momentum_.at(i); }  // undefined before
  ParameterState parameter_state(size_t i) const override;
  void check_parameter_state(size_t i, const ParameterState& state) const override;
  void set_parameter_state(size_t i, const ParameterState& state) override;
  std::map<std::string, std::string> options_text() const override;

 protected:
  void update(size_t i) override;

 private:
  SGDOptions options_;
  TensorList momentum_;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // decoupled
};

// t = t + 1
// p = p * (1 - lr * weight_decay)
// m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
// p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
class AdamW : public Optimizer {
 public:
  AdamW(TensorList params, const AdamWOptions& options);
  const Tensor& exp_avg(size_t i) const { return exp_avg_.at(i); }
  const Tensor& exp_avg_sq(size_t i) const { return exp_avg_sq_.at(i); }
  int64_t steps(size_t i) const { return steps_.at(i); }
  ParameterState parameter_state(size_t i) const override;
  void check_parameter_state(size_t i, const ParameterState& state) const override;
  void set_parameter_state(size_t i, const ParameterState& state) override;
  std::map<std::string, std::string> options_text() const override;

 protected:
  void update(size_t i) override;

 private:
  AdamWOptions options_;
  TensorList exp_avg_, exp_avg_sq_;
  std::vector<int64_t> steps_;
};

// Scales all gradients by max_norm / (total + 1e-6) when their total L2 norm exceeds max_norm
// (as torch.nn.utils.clip_grad_norm_); returns the total norm before clipping. Tensors without
// a gradient are skipped. A non-finite total (an overflowed or NaN gradient) is returned with the
// gradients left as they are, so the caller can skip the step.
double clip_grad_norm(const TensorList& params, double max_norm);

// Linear warm-up then cosine decay, a pure function of the step (0-based):
//   step < warmup_steps:                max_lr * (step + 1) / warmup_steps
//   warmup_steps <= step < total_steps: min_lr + (max_lr - min_lr) * (1 + cos(pi * r)) / 2,
//                                       r = (step - warmup_steps) / (total_steps - warmup_steps)
//   step >= total_steps:                min_lr
struct WarmupCosine {
  double max_lr = 1e-3;
  double min_lr = 0.0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double operator()(int64_t step) const { return lr(step); }
  double lr(int64_t step) const;
};

}  // namespace remat::nn
