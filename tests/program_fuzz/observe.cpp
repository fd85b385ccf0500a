#include "observe.h"

#include <algorithm>
#include <cstring>
#include <sstream>

namespace remat::program_fuzz {

size_t Record::peak_saved() const {
  size_t peak = 0;
  for (const StepMemory& s : steps) peak = std::max(peak, s.peak_saved);
  return peak;
}

std::string tensor_bits(const Tensor& t) {
  if (!t.defined()) return "undefined";
  NoGradGuard no_grad;
  Tensor c = t.detach();
  if (c.device() != kCpu) c = c.to(kCpu);
  c = c.contiguous();
  std::string out = std::string(dtype_name(c.dtype())) + shape_str(c.shape()) + ":";
  const size_t n = c.nbytes();
  const size_t head = out.size();
  out.resize(head + n);
  if (n > 0) std::memcpy(out.data() + head, c.raw_data(), n);
  return out;
}

std::string tensor_shown(const Tensor& t) {
  if (!t.defined()) return "undefined";
  NoGradGuard no_grad;
  Tensor c = t.detach();
  if (c.device() != kCpu) c = c.to(kCpu);
  std::ostringstream out;
  out.precision(9);
  out << dtype_name(c.dtype()) << shape_str(c.shape()) << " {";
  const std::vector<double> v = c.to_vector();
  for (size_t i = 0; i < v.size() && i < 4; ++i) out << (i ? ", " : "") << v[i];
  if (v.size() > 4) out << ", ...";
  out << "}";
  return out.str();
}

void Recorder::value(const std::string& label, const Tensor& t, bool flags) {
  const std::string prefix = "s" + std::to_string(step_) + "." + label;
  record_.obs.push_back({prefix, tensor_bits(t), tensor_shown(t)});
  if (flags && t.defined()) {
    flag(label + ".requires_grad", t.requires_grad());
    flag(label + ".has_grad_fn", t.grad_fn() != nullptr);
  }
}

void Recorder::flag(const std::string& label, bool on) {
  record_.obs.push_back({"s" + std::to_string(step_) + "." + label, on ? "true" : "false", on ? "true" : "false"});
}

void Recorder::number(const std::string& label, double v) {
  std::ostringstream out;
  out.precision(17);
  out << v;
  record_.obs.push_back({"s" + std::to_string(step_) + "." + label, out.str(), out.str()});
}

void Recorder::grads(const std::string& prefix, const nn::Module& module) {
  for (const auto& [name, p] : module.named_parameters()) value(prefix + ".grad." + name, p.grad(), false);
}

void Recorder::parameters(const std::string& prefix, const nn::Module& module) {
  for (const auto& [name, p] : module.named_parameters()) value(prefix + ".param." + name, p, false);
}

void Recorder::begin_step(const std::string& shape_key) {
  StepMemory m;
  m.step = step_;
  m.profiling = std::count(shape_keys_.begin(), shape_keys_.end(), shape_key) < BudgetPlanner::kProfilingSteps;
  shape_keys_.push_back(shape_key);
  record_.steps.push_back(m);
  warnings_at_begin_ = record_.warnings.size();
  memory::reset_peaks();
  reset_counters();
  in_step_ = true;
}

void Recorder::end_step() {
  if (!in_step_) return;
  in_step_ = false;
  StepMemory& m = record_.steps.back();
  m.peak_saved = memory::peak_bytes(memory::Tag::saved);
  m.bytes_over_plan = counters().dynamic.bytes_over_plan;
  m.budget_over = counters().budget.most_over_bytes;
  // A warning about the budget (not the one that says a policy met no region, which names it).
  for (size_t i = warnings_at_begin_; i < record_.warnings.size(); ++i) {
    const std::string& w = record_.warnings[i];
    if (w.find("budget") != std::string::npos && w.find("met no checkpoint region") == std::string::npos) m.warned = true;
  }
  if (model_ && model_->planner()) {
    if (const auto report = model_->planner()->report()) m.planned_budget = report->budget_bytes;
  }
}

}  // namespace remat::program_fuzz
