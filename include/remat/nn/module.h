// remat/nn/module.h - the Module base class: parameters, children, dotted names, seeded init.
//
// A Module owns parameters (leaf tensors that require grad, allocated in the `parameter` memory
// account) and child modules, both registered under a name. Names compose with dots, so a GPT's
// parameters read "blocks.3.attn.qkv.weight", the same names PyTorch's state_dict() would give
// for the same structure, and weight files (remat/nn/safetensors.h) exchange with it directly.
//
//   class TwoLayer : public remat::nn::Module {
//    public:
//     TwoLayer() {
//       fc1 = register_module("fc1", std::make_shared<remat::nn::Linear>(8, 32));
//       fc2 = register_module("fc2", std::make_shared<remat::nn::Linear>(32, 1));
//     }
//     Tensor forward(const Tensor& x) override { return fc2->forward(remat::tanh(fc1->forward(x))); }
//     std::shared_ptr<remat::nn::Linear> fc1, fc2;
//   };
//   auto model = std::make_shared<TwoLayer>();
//   model->reset_parameters(/*seed=*/42);       // "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"
//
// Modules are shared by std::shared_ptr and are not copyable (a copy would share the
// parameters' storage anyway, since Tensor is a handle).
//
// Seeded initialisation. Every parameter carries an Init rule (zeros, ones, uniform, normal).
// reset_parameters(seed) re-draws each parameter from its own explicit random stream
// parameter_rng_state(seed, i), where i is its position in named_parameters(): the same seed and
// the same model structure give the same weights whatever the default generator's state, the
// thread count or what ran before. A freshly constructed module is already initialised, from
// seed 0 with indices local to that module (so two freshly built identical layers start equal);
// call reset_parameters(seed) on the root module to give every parameter its own stream.
// Defaults (PyTorch-like): Linear weight U(-1/sqrt(in), 1/sqrt(in)), biases 0, norm weights 1,
// norm biases 0, embeddings N(0, 0.02^2); the GPT model (remat/nn/gpt.h) uses N(0, 0.02^2) for
// every Linear weight instead (GPT-2).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "remat/random.h"
#include "remat/tensor.h"

namespace remat::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using Metadata = std::map<std::string, std::string>;

// How a parameter is (re)initialised.
struct Init {
  enum class Kind { keep, constant, uniform, normal };
  Kind kind = Kind::constant;
  double a = 0.0;  // constant: the value; uniform: low; normal: mean
  double b = 0.0;  // uniform: high; normal: standard deviation

  static Init keep() { return {Kind::keep}; }  // leave the values as they are
  static Init zeros() { return {Kind::constant, 0.0}; }
  static Init ones() { return {Kind::constant, 1.0}; }
  static Init constant(double value) { return {Kind::constant, value}; }
  static Init uniform(double low, double high) { return {Kind::uniform, low, high}; }
  static Init normal(double mean, double stddev) { return {Kind::normal, mean, stddev}; }
  std::string to_string() const;
  bool operator==(const Init&) const = default;
};

// The random stream of parameter `index` under `seed`: RngState{seed, index * 2^40}, i.e.
// disjoint windows of 2^40 words of the Philox stream keyed by the seed.
RngState parameter_rng_state(uint64_t seed, uint64_t index);

// Overwrites `tensor` in place (not recorded on the tape) with values drawn by `init` from
// `state`; Kind::keep does nothing.
void init_tensor(const Tensor& tensor, const Init& init, RngState state);

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The computation. The base version throws remat::Error.
  virtual Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }
  // A short description for messages, e.g. "Linear(4 -> 3, bias)".
  virtual std::string type_name() const { return "Module"; }

  // ---- registration (names: non-empty, no '.', unique within this module)
  // Allocates a parameter (memory::Tag::parameter), fills it by `init` (from seed 0 and this
  // module's local parameter index) and marks it as requiring grad.
  Tensor register_parameter(const std::string& name, const Shape& shape, DType dtype, Init init);
  // Registers a parameter holding a copy of `value` (its init rule is Init::keep()).
  Tensor register_parameter(const std::string& name, const Tensor& value);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  // ---- parameters, recursively, in registration order (own parameters first, then each child's);
  // a tensor reachable under two names (a shared module) is listed once, under its first name.
  NamedTensors named_parameters() const;
  TensorList parameters() const;
  // The parameter with this dotted name; throws remat::Error naming it if there is none.
  Tensor parameter(const std::string& dotted_name) const;
  int64_t num_parameters() const;  // total number of elements
  // The direct children in registration order, and every module below this one (itself first,
  // named "") with its dotted name.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  std::vector<std::pair<std::string, const Module*>> named_modules() const;

  // Drops every parameter's accumulated gradient.
  void zero_grad();
  // Training mode (dropout active) or evaluation mode; propagates to all children.
  void train(bool on = true);
  void eval() { train(false); }
  bool training() const { return training_; }

  // ---- initialisation (see the header comment)
  void reset_parameters(uint64_t seed);
  // Changes the init rule of the parameter with this dotted name (used by reset_parameters).
  void set_parameter_init(const std::string& dotted_name, Init init);
  Init parameter_init(const std::string& dotted_name) const;

  // ---- weight files (safetensors; see remat/nn/safetensors.h)
  // Writes named_parameters() atomically.
  void save(const std::string& path, const Metadata& metadata = {}) const;
  // Reads a file written by save() (or by PyTorch for the same structure). Missing, unexpected
  // or mismatched (shape or dtype) tensors give one remat::Error listing every problem, and
  // leave the parameters untouched; a corrupt file gives remat::Error too. Returns the file's
  // metadata.
  Metadata load(const std::string& path);
  // The same check-everything-then-copy for tensors in memory; `source` names them in errors.
  void load_parameters(const std::map<std::string, Tensor>& tensors, const std::string& source = "tensors");

 protected:
  void add_child(const std::string& name, std::shared_ptr<Module> module);

 private:
  struct Parameter {
    std::string name;
    Tensor tensor;
    Init init;
  };
  struct Child {
    std::string name;
    std::shared_ptr<Module> module;
  };
  void check_new_name(const std::string& name, const char* what) const;
  // Visits every parameter (deduplicated) with its dotted name.
  template <class F>
  void visit_parameters(F&& f) const;
  Parameter* find_parameter(const std::string& dotted_name);
  const Parameter* find_parameter(const std::string& dotted_name) const;

  std::vector<Parameter> parameters_;
  std::vector<Child> children_;
  bool training_ = true;
};

}  // namespace remat::nn
