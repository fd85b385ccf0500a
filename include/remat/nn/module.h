// remat/nn/module.h - the Module base class: parameters, children, dotted names, seeded init, and
// the layer calls that make checkpointing automatic.
//
// A Module owns parameters (leaf tensors that require grad, allocated in the `parameter` memory
// account) and child modules, both registered under a name. Names compose with dots, so a GPT's
// parameters read "blocks.3.attn.qkv.weight", and weight files (remat/nn/safetensors.h) use them.
//
// A module says what it computes by overriding forward_impl (one tensor in, one out) or
// forward_list_impl (several in or out); everybody calls it through forward():
//
//   class Model : public remat::nn::Module {
//    public:
//     explicit Model(int depth) {
//       for (int i = 0; i < depth; ++i)
//         layers.push_back(register_module("layer" + std::to_string(i), std::make_shared<Block>(64)));
//       head = register_module("head", std::make_shared<remat::nn::Linear>(64, 10));
//     }
//     Tensor forward_impl(const Tensor& x) override {
//       Tensor h = x;
//       for (auto& layer : layers) h = layer->forward(h);   // each call: a checkpoint region
//       return head->forward(h);
//     }
//     std::vector<std::shared_ptr<Block>> layers;
//     std::shared_ptr<remat::nn::Linear> head;
//   };
//   auto model = std::make_shared<Model>(16);
//   Tensor loss = mean(model->forward(x));   // every-layer (the default): 17 regions
//   loss.backward();                         // each layer recomputed once, then freed
//
// Checkpointing by default: which call is a layer. forward() is a layer call in the sense of
// remat/call.h. The outermost module call (here model->forward) is the root and runs plain. The
// calls a root makes, and the calls made by containers it calls (Sequential, Residual, Parallel,
// or any module marked transparent: containers that only route data), are the model's LAYERS:
// under every-layer each one is a checkpoint region, whatever code makes the call (a loop, a
// container, a shared module called twice). Calls a layer makes (its sub-modules) run plain:
// they are recomputed with their layer, never on their own. So in the example the 16 blocks and
// the head are regions and the Linear layers inside a Block are not.
// Per module:
//   set_policy(p)      the policy for this module's calls and the default for everything inside
//                      them (model->set_policy(Policy::save_all()) turns checkpointing off for a
//                      whole model; block->set_policy(Policy::parse("selective:matmul")) for one)
//   set_transparent()  a container: its calls are never regions; the calls it makes are layers
//                      if it is called where a layer would be (use it for your own containers)
//   set_layer()        always a layer: a region even when called inside another layer
//                      (multi-level checkpointing; recomputes it once more per level)
// Under every-k:K consecutive layer calls are grouped, under budget:BYTES the model's layer calls
// are planned (remat/budget.h: planner() keeps the profile and the plan).
//
// Memory. For a root whose forward makes N layer calls with boundary (input) bytes b each and
// internal saved bytes at most I (what one layer's ops keep when recorded), the peak of saved
// bytes in the backward pass under every-layer is at most N * b + I + g (g: the loss's own saved
// input), against about N * (b + I) under save-all (remat/checkpoint.h).
//
// A region calls the module again in the backward pass: it holds the module by shared_ptr when
// the module is owned by one (the usual case; modules are not copyable), so keep a module that is
// not owned by a shared_ptr alive until the backward pass has run.
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

#include <concepts>
#include <cstdint>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "remat/budget.h"
#include "remat/call.h"
#include "remat/checkpoint.h"
#include "remat/policy.h"
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

// Modules nest at most this deep (a module with no children counts 1). A deeper nesting is a
// remat::Error naming the limit: when the module that makes it too deep is registered, or else
// (a tree grown top-down) when it is called or its tree is walked (parameters(), train(), ...).
// Calls recurse on the stack (about 3 KB a level in Release, three times that under
// AddressSanitizer); this bound, the same as regions' (every module call may be a region), keeps
// them within a 2 MiB thread stack in Release and the default 8 MiB under the sanitizers.
inline constexpr int kMaxModuleNesting = kMaxRegionNesting;

class Module : public std::enable_shared_from_this<Module> {
 public:
  Module() = default;
  virtual ~Module();  // destroys any depth of children without recursion
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // ---- calling a module (a layer call; see the header comment)
  Tensor forward(const Tensor& x);                   // forward_impl must give exactly one output
  TensorList forward(const TensorList& inputs);      // several inputs or outputs
  template <class... More>
    requires(std::same_as<More, Tensor> && ...)
  Tensor forward(const Tensor& a, const Tensor& b, const More&... more) {
    return single_output(forward(TensorList{a, b, more...}));
  }
  Tensor operator()(const Tensor& x) { return forward(x); }
  TensorList operator()(const TensorList& inputs) { return forward(inputs); }
  // A short description for messages, e.g. "Linear(4 -> 3, bias)".
  virtual std::string type_name() const { return "Module"; }

  // ---- registration (names: non-empty, no '.', unique within this module)
  // Allocates a parameter (memory::Tag::parameter), fills it by `init` (from seed 0 and this
  // module's local parameter index) and marks it as requiring grad.
  Tensor register_parameter(const std::string& name, const Shape& shape, DType dtype, Init init);
  // Registers a parameter holding a copy of `value` (its init rule is Init::keep()).
  Tensor register_parameter(const std::string& name, const Tensor& value);
  // Registers state that is not a parameter (BatchNorm's running statistics): it takes no
  // gradient and is not in named_parameters() (so save() does not write it), but to() moves it
  // with the parameters. Returns `value` itself (its holders see the move).
  Tensor register_buffer(const std::string& name, const Tensor& value);
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

  // ---- checkpointing (see the header comment)
  // This module's own policy (nullopt: inherit the caller's); returns *this.
  Module& set_policy(std::optional<Policy> policy);
  const std::optional<Policy>& policy() const { return policy_; }
  Module& set_role(CallRole role);
  Module& set_transparent() { return set_role(CallRole::transparent); }
  Module& set_layer() { return set_role(CallRole::layer); }
  CallRole role() const { return role_; }
  // The budget planner used when this module is the plan scope (the root under budget:BYTES).
  const std::shared_ptr<BudgetPlanner>& planner() const;

  // The buffers (register_buffer), recursively, in the order of named_parameters(), each once.
  NamedTensors named_buffers() const;
  // Whole-number state of this module beside its parameters and buffers (BatchNorm's count of
  // batches), by name, which training states keep (remat/nn/training_state.h); none by default.
  virtual std::vector<std::pair<std::string, int64_t>> state_counters() const { return {}; }
  // Sets a counter that state_counters() lists to `value` (>= 0); anything else is a remat::Error.
  virtual void set_state_counter(const std::string& name, int64_t value);

  // Drops every parameter's accumulated gradient.
  void zero_grad();
  // Moves every parameter and every buffer to `device` in place (the tensors every holder sees now
  // live there; the parameters' gradients are dropped); returns *this.
  Module& to(Device device);
  // Training mode (dropout active) or evaluation mode; propagates to all children.
  void train(bool on = true);
  void eval() { train(false); }
  bool training() const { return training_; }

  // ---- initialisation (see the header comment)
  void reset_parameters(uint64_t seed);
  // Changes the init rule of the parameter with this dotted name (used by reset_parameters).
  void set_parameter_init(const std::string& dotted_name, Init init);
  Init parameter_init(const std::string& dotted_name) const;

  // ---- mixed precision (docs/precision.md)
  // Computes in `dtype` (bf16 or f16) while the parameters stay as they are (float32 master
  // weights, which the optimizer updates): each call of this module that is not inside another
  // call (a step's forward) first makes one copy of every parameter of the tree in `dtype`, once
  // per tensor (a tied weight gets one copy), recorded so that gradients reach the masters in
  // their own dtype; the layers compute with those copies (compute_weight) until the next such
  // call, so a recomputation in the backward pass reads exactly what the forward read. The copies
  // count as parameter memory. Activations, and so saved values, are then in `dtype`; statistics
  // and losses are float32 (accumulate_dtype). nullopt turns it off. Set it on the model's root:
  // every module below it shares the setting.
  //   model->set_compute_dtype(DType::bf16);
  //   Tensor loss = model->loss(ids, targets);   // bf16 forward, float32 loss
  //   loss.backward();                           // float32 gradients on the parameters
  Module& set_compute_dtype(std::optional<DType> dtype);
  std::optional<DType> compute_dtype() const;

  // ---- weight files (safetensors; see remat/nn/safetensors.h)
  // Writes named_parameters() atomically.
  void save(const std::string& path, const Metadata& metadata = {}) const;
  // Reads a file written by save() (or by PyTorch for the same structure). Missing, unexpected
  // or mismatched (shape or dtype) tensors give one remat::Error listing every problem, and
  // leave the parameters untouched; a corrupt file gives remat::Error too. A bf16 or f16 tensor
  // loads into an f32 or f64 parameter (widened exactly). Returns the file's metadata.
  Metadata load(const std::string& path);
  // The same check-everything-then-copy for tensors in memory; `source` names them in errors.
  void load_parameters(const std::map<std::string, Tensor>& tensors, const std::string& source = "tensors");

 protected:
  // What the module computes. Override one of the two; each default calls the other (a module
  // overriding neither throws remat::Error when called).
  virtual Tensor forward_impl(const Tensor& x);
  virtual TensorList forward_list_impl(const TensorList& inputs);
  // Calls a child as this module's forward would (a layer call), with a policy for this call
  // alone that overrides the child's own (containers use it for per-child policies).
  static TensorList call_child(Module& child, const TensorList& inputs, const std::optional<Policy>& call_policy);
  // The tensor a layer computes with for its parameter `p`: the step's copy of p in the compute
  // dtype under set_compute_dtype, else p itself (an undefined p stays undefined).
  Tensor compute_weight(const Tensor& p) const;
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  // Weight tying: this module's own parameter `name` becomes `shared`, a parameter (a leaf that
  // requires grad) of the same shape and dtype from elsewhere in the model. Both names then hold
  // one tensor: named_parameters() lists it once, under the name visited first, its gradient is
  // the sum over both uses, and its init rule is that of the first name. Returns `shared`.
  Tensor share_parameter(const std::string& name, const Tensor& shared);

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
  struct ComputeCopies;  // the step's compute copies of the parameters (mixed_precision.cpp)
  void refresh_compute_copies();
  TensorList invoke(const TensorList& inputs, const std::optional<Policy>& call_policy);
  Tensor single_output(const TensorList& outputs) const;
  std::string child_name(const Module* child) const;
  void check_new_name(const std::string& name, const char* what) const;
  // Visits every parameter (deduplicated) with its dotted name.
  template <class F>
  void visit_parameters(F&& f) const;
  // This module and every module under it, depth first in registration order, with dotted names
  // (each shared module once when `once`); an Error when they nest beyond kMaxModuleNesting.
  std::vector<std::pair<std::string, const Module*>> walk(bool once) const;
  Parameter* find_parameter(const std::string& dotted_name);
  const Parameter* find_parameter(const std::string& dotted_name) const;

  std::vector<Parameter> parameters_;
  NamedTensors buffers_;
  std::vector<Child> children_;
  bool training_ = true;
  std::optional<Policy> policy_;
  CallRole role_ = CallRole::automatic;
  bool warned_unregistered_ = false;  // called by a module that never registered it: warned once
  int height_ = 1;  // nesting depth of the tree under this module as registered (itself: 1)
  mutable std::shared_ptr<BudgetPlanner> planner_;
  std::shared_ptr<ComputeCopies> compute_copies_;  // shared by the tree under set_compute_dtype
};

}  // namespace remat::nn
