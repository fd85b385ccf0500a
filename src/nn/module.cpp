// Module: registration, recursive dotted names, seeded initialisation, load with full validation.
#include "remat/nn/module.h"

#include <functional>
#include <set>
#include <sstream>
#include <unordered_set>

#include "remat/autodiff.h"
#include "remat/backend.h"
#include "remat/checkpoint.h"
#include "remat/nn/safetensors.h"

namespace remat::nn {

std::string Init::to_string() const {
  std::ostringstream out;
  switch (kind) {
    case Kind::keep: return "keep";
    case Kind::constant: out << "constant(" << a << ")"; break;
    case Kind::uniform: out << "uniform(" << a << ", " << b << ")"; break;
    case Kind::normal: out << "normal(" << a << ", " << b << ")"; break;
  }
  return out.str();
}

RngState parameter_rng_state(uint64_t seed, uint64_t index) {
  REMAT_CHECK(index < (uint64_t{1} << 24), "parameter_rng_state: parameter index ", index, " exceeds 2^24");
  return RngState{seed, index << 40};
}

void init_tensor(const Tensor& tensor, const Init& init, RngState state) {
  REMAT_CHECK(tensor.defined(), "init_tensor: tensor is undefined");
  NoGradGuard no_grad;
  Tensor t = tensor;
  switch (init.kind) {
    case Init::Kind::keep: return;
    case Init::Kind::constant: t.fill_(init.a); return;
    case Init::Kind::uniform:
      REMAT_CHECK(is_floating(t.dtype()), "init_tensor: ", init.to_string(), " needs a floating tensor, got ",
                  dtype_name(t.dtype()));
      REMAT_CHECK(init.b > init.a, "init_tensor: empty range in ", init.to_string());
      t.copy_(rand(t.shape(), t.dtype(), state, init.a, init.b));
      return;
    case Init::Kind::normal:
      REMAT_CHECK(is_floating(t.dtype()), "init_tensor: ", init.to_string(), " needs a floating tensor, got ",
                  dtype_name(t.dtype()));
      REMAT_CHECK(init.b >= 0, "init_tensor: negative standard deviation in ", init.to_string());
      t.copy_(randn(t.shape(), t.dtype(), state, init.a, init.b));
      return;
  }
}

// ---- calls

namespace {

// The module calls in progress on this thread, for dotted names: (module, its dotted name).
struct ModuleFrame {
  const Module* module;
  std::string path;
};
thread_local std::vector<ModuleFrame> module_frames;

class ModuleFrameGuard {
 public:
  ModuleFrameGuard(const Module* module, const std::string& path) { module_frames.push_back({module, path}); }
  ~ModuleFrameGuard() { module_frames.pop_back(); }
  ModuleFrameGuard(const ModuleFrameGuard&) = delete;
  ModuleFrameGuard& operator=(const ModuleFrameGuard&) = delete;
};

// Set while a default forward_impl waits for forward_list_impl: a module overriding neither.
thread_local const Module* default_forward_of = nullptr;

}  // namespace

std::string Module::child_name(const Module* child) const {
  for (const auto& c : children_)
    if (c.module.get() == child) return c.name;
  return "<unregistered " + child->type_name() + ">";  // called without being registered as a child
}

TensorList Module::invoke(const TensorList& inputs, const std::optional<Policy>& call_policy) {
  if (module_frames.empty()) refresh_compute_copies();  // a step's forward (Note [Compute copies])
  std::string path;
  if (!module_frames.empty()) {
    const ModuleFrame& parent = module_frames.back();
    const std::string name = parent.module->child_name(this);
    path = parent.path.empty() ? name : parent.path + "." + name;
    REMAT_CHECK(module_frames.size() < static_cast<size_t>(kMaxModuleNesting), type_name(), ": module calls are nested ",
                module_frames.size() + 1, " deep; remat supports at most ", kMaxModuleNesting, " (kMaxModuleNesting)");
    if (name.front() == '<' && !warned_unregistered_) {
      warned_unregistered_ = true;
      warn(detail::concat("module ", type_name(), " is called by ",
                          parent.path.empty() ? "the model" : "'" + parent.path + "'", " (",
                          parent.module->type_name(), ") but was never registered with register_module: its ",
                          num_parameters(), " parameter values are not in parameters(), so the optimizer does not "
                          "update them and save() does not write them; it shows as '", path,
                          "' in the memory report"));
    }
  }
  CallSite site;
  site.label = path;
  site.role = role_;
  site.policy = call_policy ? call_policy : policy_;
  site.planner = planner();
  // A region may call the module again in the backward pass: hold it while it may.
  std::shared_ptr<Module> owner = weak_from_this().lock();
  Module* self = this;
  RegionFn fn = [owner, self, path](const TensorList& in) {
    ModuleFrameGuard frame(self, path);
    return self->forward_list_impl(in);
  };
  return call(fn, inputs, site);
}

Tensor Module::single_output(const TensorList& outputs) const {
  REMAT_CHECK(outputs.size() == 1, type_name(), ": forward returned ", outputs.size(),
              " outputs; call forward(TensorList) to get them all");
  return outputs[0];
}

Tensor Module::forward(const Tensor& x) { return single_output(invoke(TensorList{x}, std::nullopt)); }

TensorList Module::forward(const TensorList& inputs) { return invoke(inputs, std::nullopt); }

TensorList Module::call_child(Module& child, const TensorList& inputs, const std::optional<Policy>& call_policy) {
  return child.invoke(inputs, call_policy);
}

Tensor Module::forward_impl(const Tensor& x) {
  REMAT_CHECK(default_forward_of != this, type_name(),
              ": the module computes nothing: override forward_impl(const Tensor&) or forward_list_impl(const TensorList&)");
  const Module* previous = default_forward_of;
  default_forward_of = this;
  TensorList out;
  try {
    out = forward_list_impl(TensorList{x});
  } catch (...) {
    default_forward_of = previous;
    throw;
  }
  default_forward_of = previous;
  return single_output(out);
}

TensorList Module::forward_list_impl(const TensorList& inputs) {
  REMAT_CHECK(default_forward_of != this, type_name(),
              ": the module computes nothing: override forward_impl(const Tensor&) or forward_list_impl(const TensorList&)");
  REMAT_CHECK(inputs.size() == 1, type_name(), ": called with ", inputs.size(),
              " inputs, but it implements forward_impl(const Tensor&) (one input); override forward_list_impl for several");
  return TensorList{forward_impl(inputs[0])};
}

Module& Module::set_policy(std::optional<Policy> policy) {
  policy_ = std::move(policy);
  return *this;
}

Module& Module::set_role(CallRole role) {
  role_ = role;
  return *this;
}

const std::shared_ptr<BudgetPlanner>& Module::planner() const {
  if (!planner_) planner_ = std::make_shared<BudgetPlanner>();
  return planner_;
}

void Module::check_new_name(const std::string& name, const char* what) const {
  REMAT_CHECK(!name.empty(), type_name(), ": cannot register a ", what, " with an empty name");
  REMAT_CHECK(name.find('.') == std::string::npos, type_name(), ": ", what, " name \"", name,
              "\" contains '.', which separates the parts of dotted names");
  for (const auto& p : parameters_)
    REMAT_CHECK(p.name != name, type_name(), ": a parameter named \"", name, "\" is already registered");
  for (const auto& b : buffers_)
    REMAT_CHECK(b.first != name, type_name(), ": a buffer named \"", name, "\" is already registered");
  for (const auto& c : children_)
    REMAT_CHECK(c.name != name, type_name(), ": a module named \"", name, "\" is already registered");
}

Tensor Module::register_parameter(const std::string& name, const Shape& shape, DType dtype, Init init) {
  check_new_name(name, "parameter");
  REMAT_CHECK(is_floating(dtype), type_name(), ": parameter \"", name, "\" must be floating (f32, f64, bf16, f16), got ",
              dtype_name(dtype));
  Tensor t;
  try {
    t = Tensor::empty(shape, dtype, memory::Tag::parameter);
  } catch (const OutOfMemory& e) {
    throw OutOfMemory(detail::concat(type_name(), ": parameter \"", name, "\": ", e.what()), e.bytes());
  } catch (const Error& e) {  // a shape beyond the limits
    throw Error(detail::concat(type_name(), ": parameter \"", name, "\": ", e.what()));
  }
  init_tensor(t, init.kind == Init::Kind::keep ? Init::zeros() : init,
              parameter_rng_state(0, parameters_.size()));
  t.requires_grad_();
  t.set_name(name);
  parameters_.push_back({name, t, init});
  return t;
}

Tensor Module::register_parameter(const std::string& name, const Tensor& value) {
  REMAT_CHECK(value.defined(), type_name(), ": parameter \"", name, "\" is undefined");
  check_new_name(name, "parameter");
  REMAT_CHECK(is_floating(value.dtype()), type_name(), ": parameter \"", name, "\" must be floating (f32, f64, bf16, f16), got ",
              dtype_name(value.dtype()));
  Tensor t = Tensor::empty(value.shape(), value.dtype(), memory::Tag::parameter, value.device());
  {
    NoGradGuard no_grad;
    t.copy_(value.detach());
  }
  t.requires_grad_();
  t.set_name(name);
  parameters_.push_back({name, t, Init::keep()});
  return t;
}

Tensor Module::share_parameter(const std::string& name, const Tensor& shared) {
  Parameter* p = nullptr;
  for (auto& own : parameters_)
    if (own.name == name) p = &own;
  REMAT_CHECK(p != nullptr, type_name(), ": share_parameter: no parameter named \"", name, "\"");
  REMAT_CHECK(shared.defined() && shared.requires_grad() && shared.is_leaf(), type_name(), ": share_parameter \"", name,
              "\": the shared tensor must be a parameter (a leaf that requires grad)");
  REMAT_CHECK(shared.shape() == p->tensor.shape() && shared.dtype() == p->tensor.dtype(), type_name(),
              ": share_parameter \"", name, "\": the shared tensor is ", dtype_name(shared.dtype()), " ",
              shape_str(shared.shape()), ", the parameter ", dtype_name(p->tensor.dtype()), " ", shape_str(p->tensor.shape()));
  p->tensor = shared;
  p->init = Init::keep();
  return shared;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  REMAT_CHECK(module != nullptr, type_name(), ": module \"", name, "\" is null");
  REMAT_CHECK(module.get() != this, type_name(), ": cannot register a module as its own child");
  check_new_name(name, "module");
  REMAT_CHECK(module->height_ < kMaxModuleNesting, type_name(), ": registering module \"", name,
              "\" would leave modules nested ", module->height_ + 1, " deep; remat supports at most ",
              kMaxModuleNesting, " (kMaxModuleNesting)");
  height_ = std::max(height_, module->height_ + 1);
  children_.push_back({name, std::move(module)});
}

// Note [module depth]. Every walk over a module tree is a loop over an explicit stack, and the
// whole walk is collected before anything is done with it, so a tree nested beyond
// kMaxModuleNesting is an Error that changes nothing. The destructor dismantles the tree the same
// way: a child it alone holds loses its children to the loop before it is destroyed, so no
// destructor recurses. Calls (invoke) recurse for real and check the depth of the call stack.
std::vector<std::pair<std::string, const Module*>> Module::walk(bool once) const {
  std::vector<std::pair<std::string, const Module*>> out;
  std::unordered_set<const Module*> seen;
  struct Item {
    const Module* module;
    std::string name;
    int depth;
  };
  std::vector<Item> stack{{this, "", 1}};
  while (!stack.empty()) {
    Item item = std::move(stack.back());
    stack.pop_back();
    REMAT_CHECK(item.depth <= kMaxModuleNesting, type_name(), ": modules are nested more than ", kMaxModuleNesting,
                " deep (at '", item.name.substr(0, 60), "...'); remat supports at most ", kMaxModuleNesting,
                " (kMaxModuleNesting)");
    if (once && !seen.insert(item.module).second) continue;
    const auto& children = item.module->children_;
    for (auto c = children.rbegin(); c != children.rend(); ++c)
      stack.push_back({c->module.get(), item.name.empty() ? c->name : item.name + "." + c->name, item.depth + 1});
    out.emplace_back(std::move(item.name), item.module);
  }
  return out;
}

Module::~Module() {
  std::vector<std::shared_ptr<Module>> pending;
  for (auto& c : children_) pending.push_back(std::move(c.module));
  while (!pending.empty()) {
    std::shared_ptr<Module> m = std::move(pending.back());
    pending.pop_back();
    if (m.use_count() != 1) continue;  // someone else holds it: not ours to take apart
    for (auto& c : m->children_) pending.push_back(std::move(c.module));
  }
}

template <class F>
void Module::visit_parameters(F&& f) const {
  std::unordered_set<const TensorImpl*> seen;
  for (const auto& [name, m] : walk(/*once=*/false)) {
    const std::string prefix = name.empty() ? name : name + ".";
    for (const auto& p : m->parameters_)
      if (seen.insert(p.tensor.impl_ptr().get()).second) f(prefix + p.name, p);
  }
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  visit_parameters([&](const std::string& name, const Parameter& p) { out.emplace_back(name, p.tensor); });
  return out;
}

Tensor Module::register_buffer(const std::string& name, const Tensor& value) {
  check_new_name(name, "buffer");
  REMAT_CHECK(value.defined(), type_name(), ": buffer \"", name, "\" is an undefined tensor");
  REMAT_CHECK(!value.requires_grad(), type_name(), ": buffer \"", name, "\" requires grad (register a parameter)");
  buffers_.emplace_back(name, value);
  return value;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  std::unordered_set<const TensorImpl*> seen;
  for (const auto& [name, m] : walk(/*once=*/true))
    for (const auto& [own, t] : m->buffers_)
      if (seen.insert(&t.impl()).second) out.emplace_back(name.empty() ? own : name + "." + own, t);
  return out;
}

TensorList Module::parameters() const {
  TensorList out;
  visit_parameters([&](const std::string&, const Parameter& p) { out.push_back(p.tensor); });
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  visit_parameters([&](const std::string&, const Parameter& p) { n += p.tensor.numel(); });
  return n;
}

const Module::Parameter* Module::find_parameter(const std::string& dotted_name) const {
  const Module* m = this;
  std::string rest = dotted_name;
  for (;;) {
    size_t dot = rest.find('.');
    if (dot == std::string::npos) {
      for (const auto& p : m->parameters_)
        if (p.name == rest) return &p;
      return nullptr;
    }
    std::string head = rest.substr(0, dot);
    const Module* next = nullptr;
    for (const auto& c : m->children_)
      if (c.name == head) next = c.module.get();
    if (next == nullptr) return nullptr;
    m = next;
    rest = rest.substr(dot + 1);
  }
}

Module::Parameter* Module::find_parameter(const std::string& dotted_name) {
  return const_cast<Parameter*>(static_cast<const Module*>(this)->find_parameter(dotted_name));
}

Tensor Module::parameter(const std::string& dotted_name) const {
  const Parameter* p = find_parameter(dotted_name);
  REMAT_CHECK(p != nullptr, type_name(), ": no parameter named \"", dotted_name, "\"");
  return p->tensor;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  for (const auto& c : children_) out.emplace_back(c.name, c.module);
  return out;
}

std::vector<std::pair<std::string, const Module*>> Module::named_modules() const { return walk(/*once=*/true); }

namespace {
// Gives t's impl a contiguous copy of its values on `device` (every holder of t sees the move).
void move_in_place(const Tensor& t, Device device) {
  if (t.device() == device) return;
  Tensor moved = Tensor::empty(t.shape(), t.dtype(), t.storage()->tag(), device);
  copy_between_devices(t, moved);
  TensorImpl& impl = t.impl();
  impl.storage = moved.storage();
  impl.offset = 0;
  impl.strides = moved.strides();
  impl.grad.reset();
}
}  // namespace

Module& Module::to(Device device) {
  backend(device);  // a device without a backend is an error before anything moves
  for (const auto& [name, p] : named_parameters()) move_in_place(p, device);
  for (const auto& [name, b] : named_buffers()) move_in_place(b, device);
  return *this;
}

void Module::zero_grad() {
  for (auto& p : parameters()) p.zero_grad();
}

void Module::train(bool on) {
  for (const auto& [name, m] : walk(/*once=*/true)) const_cast<Module*>(m)->training_ = on;
}

void Module::reset_parameters(uint64_t seed) {
  uint64_t index = 0;
  visit_parameters([&](const std::string&, const Parameter& p) {
    init_tensor(p.tensor, p.init, parameter_rng_state(seed, index));
    ++index;
  });
}

void Module::set_parameter_init(const std::string& dotted_name, Init init) {
  Parameter* p = find_parameter(dotted_name);
  REMAT_CHECK(p != nullptr, type_name(), ": set_parameter_init: no parameter named \"", dotted_name, "\"");
  p->init = init;
}

Init Module::parameter_init(const std::string& dotted_name) const {
  const Parameter* p = find_parameter(dotted_name);
  REMAT_CHECK(p != nullptr, type_name(), ": parameter_init: no parameter named \"", dotted_name, "\"");
  return p->init;
}

void Module::set_state_counter(const std::string& name, int64_t value) {
  throw Error(detail::concat(type_name(), ": has no counter \"", name, "\" to set to ", value));
}

void Module::save(const std::string& path, const Metadata& metadata) const {
  save_safetensors(path, named_parameters(), metadata);
}

Metadata Module::load(const std::string& path) {
  SafetensorsFile file = load_safetensors(path);
  load_parameters(file.tensors, path);
  return std::move(file.metadata);
}

namespace {

std::string describe(const Tensor& t) { return detail::concat(dtype_name(t.dtype()), " ", shape_str(t.shape())); }

}  // namespace

void Module::load_parameters(const std::map<std::string, Tensor>& tensors, const std::string& source) {
  // Check everything first: nothing is copied unless every tensor matches.
  NamedTensors named = named_parameters();
  std::vector<std::string> problems;
  std::set<std::string> expected;
  for (const auto& [name, p] : named) {
    expected.insert(name);
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      problems.push_back(detail::concat("missing \"", name, "\" (the model has ", describe(p), ")"));
      continue;
    }
    const Tensor& t = it->second;
    // a 16-bit float widens exactly into an f32 or f64 parameter (a bf16 checkpoint into a float32 model)
    const bool widens = is_16bit_float(t.dtype()) && (p.dtype() == DType::f32 || p.dtype() == DType::f64);
    if (!t.defined()) {
      problems.push_back(detail::concat("\"", name, "\" is undefined"));
    } else if (t.shape() != p.shape() || (t.dtype() != p.dtype() && !widens)) {
      problems.push_back(detail::concat("\"", name, "\" is ", describe(t), " in ", source, " but ", describe(p),
                                        " in the model"));
    }
  }
  for (const auto& [name, t] : tensors) {
    if (expected.count(name) == 0) {
      problems.push_back(detail::concat("unexpected \"", name, "\"",
                                        t.defined() ? " (" + describe(t) + ")" : std::string(),
                                        " is not a parameter of the model"));
    }
  }
  if (!problems.empty()) {
    std::ostringstream out;
    out << type_name() << ": cannot load " << source << ": " << problems.size()
        << (problems.size() == 1 ? " problem" : " problems") << " (nothing was loaded):";
    for (const auto& p : problems) out << "\n  " << p;
    throw Error(out.str());
  }
  NoGradGuard no_grad;
  for (auto& [name, p] : named) p.copy_(tensors.at(name));
}

}  // namespace remat::nn
