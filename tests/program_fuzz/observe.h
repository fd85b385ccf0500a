// What a run of a program lets a user see, recorded so that two runs (save-all and a policy) can
// be compared bit for bit: observations in the order the program made them, the first error,
// the warnings, and per step the peak of saved bytes for the budget check.
//
//   Record record;
//   Recorder rec(record);
//   rec.step(0);
//   rec.phase("forward");
//   Tensor out = model->forward(x);
//   rec.value("out", out);          // its bits, requires_grad, whether it has a grad_fn
//   rec.phase("backward");
//   mean(out).backward();
//   rec.grads("model", *model);     // every parameter's gradient (or "undefined")
//
// Used by the program fuzzer (run.cpp) and by the tests of tests/never_silent/, through the
// policy matrix of matrix.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "remat/nn.h"
#include "remat/remat.h"

namespace remat::program_fuzz {

struct Observation {
  std::string label;  // "s1.grad.m2.w"
  std::string bits;   // the exact bytes (a tensor's, in row-major order), or a flag's text
  std::string shown;  // a few values for the report
};

struct ErrorRecord {
  int step = 0;
  std::string phase;
  int phase_seq = 0;  // phases entered before it (orders two errors of one program)
  std::string type;   // "remat::Error", "internal", "std::exception", "unknown"
  std::string message;
};

// One step of a run, for the budget check (filled by Recorder::begin_step / end_step).
struct StepMemory {
  int step = 0;
  size_t peak_saved = 0;      // the allocator's peak of saved bytes over the step
  size_t planned_budget = 0;  // the budget of the plan in force after the step (budget:auto), 0 unknown
  bool warned = false;        // a warning mentioned the budget during the step
  size_t bytes_over_plan = 0; // counters().dynamic.bytes_over_plan after the step
  bool profiling = false;     // one of the first kProfilingSteps steps of its input shape
  size_t budget_over = 0;     // counters().budget.most_over_bytes after the step (a pass counted)
};

struct Record {
  std::vector<Observation> obs;
  std::optional<ErrorRecord> error;
  std::vector<std::string> warnings;
  std::vector<StepMemory> steps;
  // The model's budget planner after the run, if the body gave one (Recorder::set_model).
  size_t smallest_budget = 0;
  size_t planned_save_all_peak = 0;
  size_t peak_saved() const;
};

class Recorder {
 public:
  explicit Recorder(Record& record) : record_(record) {}
  void step(int s) { step_ = s; }
  void phase(const std::string& name) {
    phase_ = name;
    ++phase_seq_;
  }
  // A tensor's bits, dtype and shape; with `flags`, also requires_grad and whether it has a grad_fn.
  void value(const std::string& label, const Tensor& t, bool flags = true);
  void flag(const std::string& label, bool on);
  void number(const std::string& label, double v);
  // Every parameter's gradient of `module` (named_parameters order), "undefined" where none.
  void grads(const std::string& prefix, const nn::Module& module);
  // Every parameter's value.
  void parameters(const std::string& prefix, const nn::Module& module);
  // The root module: its planner's feasible range is read when the run ends.
  void set_model(std::shared_ptr<nn::Module> model) { model_ = std::move(model); }
  const std::shared_ptr<nn::Module>& model() const { return model_; }
  // Starts the step's memory measure (resets the allocator's peaks and the counters) and ends it.
  // `shape_key` identifies the step's input shapes (for the profiling flag).
  void begin_step(const std::string& shape_key);
  void end_step();

  // Used by the harness (matrix.cpp).
  int current_step() const { return step_; }
  const std::string& current_phase() const { return phase_; }
  int phase_seq() const { return phase_seq_; }
  Record& record() { return record_; }

 private:
  Record& record_;
  int step_ = 0;
  std::string phase_ = "build";
  int phase_seq_ = 0;
  std::shared_ptr<nn::Module> model_;
  std::vector<std::string> shape_keys_;
  size_t warnings_at_begin_ = 0;
  bool in_step_ = false;
};

// The exact bytes of a tensor (detached, on the CPU, contiguous), prefixed by dtype and shape.
std::string tensor_bits(const Tensor& t);
std::string tensor_shown(const Tensor& t);

}  // namespace remat::program_fuzz
