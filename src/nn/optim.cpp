// Optimizers (PyTorch's SGD and AdamW formulas), gradient clipping and the LR schedule.
#include "remat/nn/optim.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <unordered_set>

#include "remat/autodiff.h"
#include "remat/backend.h"
#include "remat/ops.h"

namespace remat::nn {

namespace {

// Optimizer state: zeros like `p`, in the `other` account, on p's device.
Tensor state_like(const Tensor& p) {
  Tensor t = Tensor::empty(p.shape(), p.dtype(), memory::Tag::other, p.device());
  t.fill_(0.0);
  return t;
}

// The gradient of p as a tensor to compute with; undefined when p has none.
Tensor grad_of(const Tensor& p, const char* optimizer) {
  Tensor g = p.grad();
  if (!g.defined()) return g;
  REMAT_CHECK(g.shape() == p.shape() && g.dtype() == p.dtype(), optimizer, ": the gradient of parameter \"", p.name(),
              "\" is ", dtype_name(g.dtype()), " ", shape_str(g.shape()), ", the parameter ", dtype_name(p.dtype()),
              " ", shape_str(p.shape()));
  return g.detach();
}

Tensor contiguous_of(const Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

// A copy of `value` (any device) in a new state tensor like `p` (its shape, dtype and device).
Tensor state_copy(const Tensor& p, const Tensor& value) {
  Tensor t = Tensor::empty(p.shape(), p.dtype(), memory::Tag::other, p.device());
  NoGradGuard no_grad;
  t.copy_(value.detach());
  return t;
}

// Text of a number that reads back as the same double.
std::string exact_text(double v) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", v);
  return text;
}

// The checks every optimizer's state shares: exactly the tensor names `tensors` (each with p's
// shape and dtype) and counter names `counters` (each >= 0). `optimizer` and p name the state.
void check_state_names(const char* optimizer, const Tensor& p, size_t i, const Optimizer::ParameterState& state,
                       const std::vector<std::string>& tensors, const std::vector<std::string>& counters) {
  const std::string who = detail::concat(optimizer, ": the state of parameter ", i, " (\"", p.name(), "\", ",
                                         dtype_name(p.dtype()), " ", shape_str(p.shape()), ")");
  std::vector<std::string> seen;
  for (const auto& [name, t] : state.tensors) {
    REMAT_CHECK(std::find(tensors.begin(), tensors.end(), name) != tensors.end(), who, " has a tensor \"", name,
                "\", which ", optimizer, " does not keep");
    REMAT_CHECK(std::find(seen.begin(), seen.end(), name) == seen.end(), who, " has \"", name, "\" twice");
    seen.push_back(name);
    REMAT_CHECK(t.defined() && t.shape() == p.shape() && t.dtype() == p.dtype(), who, ": \"", name, "\" is ",
                t.defined() ? detail::concat(dtype_name(t.dtype()), " ", shape_str(t.shape())) : "undefined",
                ", expected the parameter's dtype and shape");
  }
  REMAT_CHECK(seen.empty() || seen.size() == tensors.size(), who, " has ", seen.size(), " of the ", tensors.size(),
              " tensors ", optimizer, " keeps together");
  REMAT_CHECK(state.counters.size() == counters.size(), who, " has ", state.counters.size(), " counters, ", optimizer,
              " keeps ", counters.size());
  for (size_t k = 0; k < counters.size(); ++k) {
    REMAT_CHECK(state.counters[k].first == counters[k], who, " has a counter \"", state.counters[k].first,
                "\" where ", optimizer, " keeps \"", counters[k], "\"");
    REMAT_CHECK(state.counters[k].second >= 0, who, ": counter \"", counters[k], "\" is ", state.counters[k].second,
                ", expected >= 0");
  }
}

// The tensor of `state` named `name`, or an undefined one.
Tensor state_tensor(const Optimizer::ParameterState& state, const std::string& name) {
  for (const auto& [n, t] : state.tensors)
    if (n == name) return t;
  return Tensor();
}

// Runs update(value) on p's values (a contiguous copy when p is a strided view, written back),
// then marks p's storage as written, so that a value saved before the step is detected as stale.
template <class Update>
void in_place(const Tensor& p, Update&& update) {
  Tensor value = p.detach();
  if (value.is_contiguous()) {
    update(value);
    value.storage()->bump_version();
  } else {
    Tensor work = value.contiguous();
    update(work);
    value.copy_(work);
  }
}

}  // namespace

Optimizer::Optimizer(TensorList params, double lr, const char* name) : params_(std::move(params)), lr_(lr), name_(name) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    REMAT_CHECK(p.defined(), name_, ": parameter ", i, " is undefined");
    REMAT_CHECK(p.is_leaf() && p.requires_grad() && is_floating(p.dtype()), name_, ": parameter ", i, " (\"",
                p.name(), "\", ", dtype_name(p.dtype()), " ", shape_str(p.shape()),
                ") must be a floating leaf tensor that requires grad");
    REMAT_CHECK(index_.emplace(p.impl_ptr().get(), i).second, name_, ": parameter ", i, " (\"", p.name(),
                "\") is listed twice");
  }
  set_lr(lr);
}

void Optimizer::step() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) update(i);
}

void Optimizer::step_parameter(size_t i) {
  REMAT_CHECK(i < params_.size(), name_, ": parameter index ", i, " out of range (", params_.size(), " parameters)");
  NoGradGuard no_grad;
  update(i);
}

int64_t Optimizer::index_of(const Tensor& p) const {
  if (!p.defined()) return -1;
  auto it = index_.find(p.impl_ptr().get());
  return it == index_.end() ? -1 : static_cast<int64_t>(it->second);
}

void Optimizer::zero_grad() {
  for (auto& p : params_) p.zero_grad();
}

void Optimizer::set_lr(double lr) {
  REMAT_CHECK(lr >= 0.0 && std::isfinite(lr), name_, ": invalid learning rate ", lr);
  lr_ = lr;
}

// ---- SGD

SGD::SGD(TensorList params, const SGDOptions& options) : Optimizer(std::move(params), options.lr, "SGD"), options_(options) {
  REMAT_CHECK(options.momentum >= 0.0, "SGD: invalid momentum ", options.momentum);
  REMAT_CHECK(options.weight_decay >= 0.0, "SGD: invalid weight_decay ", options.weight_decay);
  REMAT_CHECK(!options.nesterov || (options.momentum > 0.0 && options.dampening == 0.0),
              "SGD: nesterov momentum needs momentum > 0 and dampening 0, got momentum ", options.momentum,
              ", dampening ", options.dampening);
  momentum_.resize(params_.size());
}

void SGD::update(size_t i) {
  Tensor& p = params_[i];
  Tensor g = grad_of(p, "SGD");
  if (!g.defined()) return;
  SgdStep s{.lr = lr_, .momentum = options_.momentum, .dampening = options_.dampening,
            .weight_decay = options_.weight_decay, .nesterov = options_.nesterov};
  if (options_.momentum != 0.0 && !momentum_[i].defined()) {
    momentum_[i] = state_like(p);
    s.first = true;
  }
  in_place(p, [&](const Tensor& value) {
    backend(value.device()).sgd_step(value, contiguous_of(g), momentum_[i], s);
  });
}

Optimizer::ParameterState SGD::parameter_state(size_t i) const {
  ParameterState state;
  if (momentum_.at(i).defined()) state.tensors.emplace_back("momentum_buffer", momentum_[i]);
  return state;
}

void SGD::check_parameter_state(size_t i, const ParameterState& state) const {
  REMAT_CHECK(i < params_.size(), "SGD: parameter index ", i, " out of range (", params_.size(), " parameters)");
  check_state_names("SGD", params_[i], i, state,
                    options_.momentum != 0.0 ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{},
                    {});
}

void SGD::set_parameter_state(size_t i, const ParameterState& state) {
  check_parameter_state(i, state);
  const Tensor buffer = state_tensor(state, "momentum_buffer");
  momentum_[i] = buffer.defined() ? state_copy(params_[i], buffer) : Tensor();
}

std::map<std::string, std::string> SGD::options_text() const {
  return {{"momentum", exact_text(options_.momentum)},
          {"dampening", exact_text(options_.dampening)},
          {"weight_decay", exact_text(options_.weight_decay)},
          {"nesterov", options_.nesterov ? "true" : "false"}};
}

// ---- AdamW

AdamW::AdamW(TensorList params, const AdamWOptions& options)
    : Optimizer(std::move(params), options.lr, "AdamW"), options_(options) {
  REMAT_CHECK(options.beta1 >= 0.0 && options.beta1 < 1.0 && options.beta2 >= 0.0 && options.beta2 < 1.0,
              "AdamW: betas must be in [0, 1), got (", options.beta1, ", ", options.beta2, ")");
  REMAT_CHECK(options.eps >= 0.0, "AdamW: invalid eps ", options.eps);
  REMAT_CHECK(options.weight_decay >= 0.0, "AdamW: invalid weight_decay ", options.weight_decay);
  exp_avg_.resize(params_.size());
  exp_avg_sq_.resize(params_.size());
  steps_.assign(params_.size(), 0);
}

void AdamW::update(size_t i) {
  Tensor& p = params_[i];
  Tensor g = grad_of(p, "AdamW");
  if (!g.defined()) return;
  if (!exp_avg_[i].defined()) {
    exp_avg_[i] = state_like(p);
    exp_avg_sq_[i] = state_like(p);
  }
  const int64_t t = ++steps_[i];
  const AdamWStep s{.lr = lr_, .beta1 = options_.beta1, .beta2 = options_.beta2, .eps = options_.eps,
                    .weight_decay = options_.weight_decay,
                    .bias_correction1 = 1.0 - std::pow(options_.beta1, static_cast<double>(t)),
                    .bias_correction2 = 1.0 - std::pow(options_.beta2, static_cast<double>(t))};
  in_place(p, [&](const Tensor& value) {
    backend(value.device()).adamw_step(value, contiguous_of(g), exp_avg_[i], exp_avg_sq_[i], s);
  });
}

Optimizer::ParameterState AdamW::parameter_state(size_t i) const {
  ParameterState state;
  if (exp_avg_.at(i).defined()) {
    state.tensors.emplace_back("exp_avg", exp_avg_[i]);
    state.tensors.emplace_back("exp_avg_sq", exp_avg_sq_[i]);
  }
  state.counters.emplace_back("step", steps_[i]);
  return state;
}

void AdamW::check_parameter_state(size_t i, const ParameterState& state) const {
  REMAT_CHECK(i < params_.size(), "AdamW: parameter index ", i, " out of range (", params_.size(), " parameters)");
  check_state_names("AdamW", params_[i], i, state, {"exp_avg", "exp_avg_sq"}, {"step"});
  // the moments exist from the first update on, and only then
  REMAT_CHECK(state.tensors.empty() == (state.counters[0].second == 0), "AdamW: the state of parameter ", i, " (\"",
              params_[i].name(), "\") has step ", state.counters[0].second, " and ",
              state.tensors.empty() ? "no moments" : "moments", ", which do not go together");
}

void AdamW::set_parameter_state(size_t i, const ParameterState& state) {
  check_parameter_state(i, state);
  const Tensor m = state_tensor(state, "exp_avg"), v = state_tensor(state, "exp_avg_sq");
  exp_avg_[i] = m.defined() ? state_copy(params_[i], m) : Tensor();
  exp_avg_sq_[i] = v.defined() ? state_copy(params_[i], v) : Tensor();
  steps_[i] = state.counters[0].second;
}

std::map<std::string, std::string> AdamW::options_text() const {
  return {{"beta1", exact_text(options_.beta1)},
          {"beta2", exact_text(options_.beta2)},
          {"eps", exact_text(options_.eps)},
          {"weight_decay", exact_text(options_.weight_decay)}};
}

// ---- the optimizer inside the backward

FusedOptimizerStep::FusedOptimizerStep(Optimizer& optimizer, FusedStepOptions options)
    : optimizer_(optimizer), options_(std::move(options)), hook_([this](const Tensor& leaf) {
        const int64_t i = optimizer_.index_of(leaf);
        if (i < 0) return;  // not ours: the gradient stays
        Tensor p = leaf;
        if (options_.before_update) options_.before_update(p);
        optimizer_.step_parameter(static_cast<size_t>(i));
        ++updated_;
        if (!options_.keep_gradients) p.zero_grad();
      }) {}

// ---- clipping

double clip_grad_norm(const TensorList& params, double max_norm) {
  REMAT_CHECK(max_norm >= 0.0, "clip_grad_norm: max_norm must be non-negative, got ", max_norm);
  NoGradGuard no_grad;
  // The sum of squares is one kernel call on the gradients' device (Backend::sum_squares: each
  // parameter's sum(square(g)) added in float64 in parameter order), read once.
  TensorList grads;
  std::unordered_set<const TensorImpl*> seen;  // a parameter listed twice counts once
  for (const auto& p : params) {
    REMAT_CHECK(p.defined(), "clip_grad_norm: a parameter is undefined");
    Tensor g = p.grad();
    if (!g.defined() || !seen.insert(g.impl_ptr().get()).second) continue;
    REMAT_CHECK(grads.empty() || g.device() == grads.front().device(), "clip_grad_norm: gradients on ",
                device_name(grads.empty() ? g.device() : grads.front().device()), " and ", device_name(g.device()));
    grads.push_back(g);
  }
  double total = 0.0;
  if (!grads.empty()) {
    Tensor total_sq = Tensor::empty({}, DType::f64, memory::Tag::other, grads.front().device());
    backend(grads.front().device()).sum_squares(grads, total_sq);
    total = std::sqrt(total_sq.to(kCpu).item());
  }
  const double coefficient = max_norm / (total + 1e-6);
  if (std::isfinite(total) && coefficient < 1.0) {
    // one kernel call scales every gradient of a dtype in place (Backend::scale_each: the bits of
    // g.copy_(mul_scalar(g, coefficient)))
    for (size_t first = 0; first < grads.size();) {
      TensorList same;
      size_t next = first;
      for (; next < grads.size() && grads[next].dtype() == grads[first].dtype(); ++next) same.push_back(grads[next].detach());
      backend(grads[first].device()).scale_each(same, coefficient);
      for (const Tensor& g : same) g.storage()->bump_version();
      first = next;
    }
  }
  return total;
}

// ---- schedule

double WarmupCosine::lr(int64_t step) const {
  REMAT_CHECK(step >= 0, "WarmupCosine: negative step ", step);
  REMAT_CHECK(warmup_steps >= 0 && total_steps >= warmup_steps, "WarmupCosine: need 0 <= warmup_steps (",
              warmup_steps, ") <= total_steps (", total_steps, ")");
  if (step < warmup_steps) return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (step >= total_steps) return min_lr;
  const double ratio =
      static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
}

}  // namespace remat::nn
