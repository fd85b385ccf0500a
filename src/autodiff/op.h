// Internal: how an op is defined once, with its forward, its backward and what the backward needs.
//
//   Tensor exp(const Tensor& x) {
//     static const OpSpec spec{OpKind::exp, save_outputs};
//     return apply1(spec, {x},
//         [](const TensorList& in) { return TensorList{kernels::unary(UnaryOp::exp, in[0])}; },
//         [](BackwardContext& ctx) { ctx.set_input_grad(0, mul(ctx.grad_output(0), ctx.output(0))); });
//   }
//
// apply() runs the forward (with nested op calls untaped), counts it, lets a checkpoint region
// observe it, and, when an input requires grad and recording is on, records a node whose saved
// values are exactly those declared by `save`. Backward formulas run under no-grad and may use
// any public op. Aux outputs (spec.num_aux) are extra forward results the backward needs (e.g.
// layer norm's mean and rstd); they are saved, never returned.
#pragma once

#include <functional>
#include <string>

#include "remat/autodiff.h"
#include "remat/ops.h"

namespace remat::autodiff {

enum Save : unsigned { save_nothing = 0, save_inputs = 1, save_outputs = 2, save_inputs_and_outputs = 3 };

// The built-in op kinds: one enumerator per entry of REMAT_OP_KINDS (remat/ops.h), so an op whose
// kind is not listed there does not compile.
#define REMAT_OP_KIND_ENUMERATOR(kind, ...) kind,
enum class OpKind : uint8_t { REMAT_OP_KINDS(REMAT_OP_KIND_ENUMERATOR) };
#undef REMAT_OP_KIND_ENUMERATOR
const char* op_kind_name(OpKind kind);

struct OpSpec {
  std::string name;         // the op kind, as selective policies name it ("matmul", "tanh", ...)
  unsigned save = save_nothing;
  int num_aux = 0;          // trailing forward results kept for backward only
  uint32_t saved_inputs_mask = ~0u;  // with save_inputs: which inputs (bit i = input i) are kept
  uint32_t saved_outputs_mask = ~0u;  // with save_outputs: which visible outputs are kept (aux ones always are)

  OpSpec() = default;  // for custom ops, which fill in "custom:NAME" themselves
  // A built-in op of kind `kind` (its name: op_kind_name(kind)).
  OpSpec(OpKind kind, unsigned save = save_nothing, int num_aux = 0, uint32_t saved_inputs_mask = ~0u,
         uint32_t saved_outputs_mask = ~0u);
};

class OpNode;

class BackwardContext {
 public:
  explicit BackwardContext(OpNode& node, TensorList&& grad_outputs);
  // Gradient of visible output i (zeros when none arrived).
  Tensor grad_output(size_t i);
  bool has_grad_output(size_t i) const;
  Tensor input(size_t i) const;   // needs save_inputs
  Tensor output(size_t i) const;  // needs save_outputs (aux outputs follow the visible ones)
  size_t num_inputs() const;
  size_t num_outputs() const;        // visible outputs
  size_t num_saved_outputs() const;  // visible + aux
  const OutputMeta& input_meta(size_t i) const;
  bool needs_input_grad(size_t i) const;
  // Sets the gradient of input i; it is reduced over broadcast axes to the input's shape.
  void set_input_grad(size_t i, const Tensor& grad);
  TensorList take_input_grads() { return std::move(input_grads_); }

 private:
  OpNode& node_;
  TensorList grad_outputs_;
  TensorList input_grads_;
};

using BackwardFn = std::function<void(BackwardContext&)>;
using ForwardFn = std::function<TensorList(const TensorList&)>;

class OpNode final : public Node {
 public:
  OpNode(const OpSpec& spec, BackwardFn backward) : spec_(spec), backward_(std::move(backward)) {}
  std::string name() const override { return spec_.name; }
  TensorList apply(TensorList&& grad_outputs) override;
  void release_saved() override;
  size_t saved_bytes() const override;
  void prefetch_saved() const override;

  OpSpec spec_;
  BackwardFn backward_;
  std::vector<SavedTensor> saved_inputs;
  std::vector<SavedTensor> saved_outputs;
  std::vector<OutputMeta> input_meta;
  std::vector<bool> input_requires_grad;
  size_t num_visible_outputs = 0;
};

// Runs and (maybe) records one op. `flops` < 0 means "one per output element".
TensorList apply(const OpSpec& spec, const TensorList& inputs, const ForwardFn& forward, BackwardFn backward,
                 double flops = -1);
inline Tensor apply1(const OpSpec& spec, const TensorList& inputs, const ForwardFn& forward, BackwardFn backward,
                     double flops = -1) {
  return apply(spec, inputs, forward, std::move(backward), flops)[0];
}

// Thread-local flag: true while an op's forward body runs (nested ops are then plain calls).
bool in_op_forward();

}  // namespace remat::autodiff
