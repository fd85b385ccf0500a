// Custom ops: a user forward and a user backward, recorded like any other op. The values the
// forward saves travel as aux outputs of the op, so they are SavedTensors like every other
// saved value (counted, freed after the backward, and re-created when a region recomputes).
#include "autodiff/op.h"

namespace remat {

TensorList CustomOp::operator()(const TensorList& inputs) const {
  REMAT_CHECK(static_cast<bool>(forward) && static_cast<bool>(backward), "custom op '", name,
              "': both forward and backward must be set");
  auto spec = std::make_shared<autodiff::OpSpec>();
  spec->name = "custom:" + name;
  spec->save = autodiff::save_nothing;
  // Everything is captured by value: a checkpoint region may replay this call after the CustomOp
  // object itself is gone.
  auto user_forward = forward;
  auto effect = side_effect;
  std::string op_name = name;
  auto forward_fn = [user_forward, effect, op_name, spec](const TensorList& in) {
    const std::string& name = op_name;
    SaveContext ctx;
    TensorList outputs = user_forward(in, ctx);
    REMAT_CHECK(!outputs.empty(), "custom op '", name, "': forward returned no outputs");
    for (size_t i = 0; i < outputs.size(); ++i)
      REMAT_CHECK(outputs[i].defined(), "custom op '", name, "': forward output ", i, " is undefined");
    if (effect && autodiff::recompute_depth() == 0) effect(in, outputs);  // first runs only
    spec->num_aux = static_cast<int>(ctx.values().size());
    for (const auto& v : ctx.values()) outputs.push_back(v);
    return outputs;
  };
  auto user_backward = backward;
  auto backward_fn = [user_backward, op_name](autodiff::BackwardContext& ctx) {
    // saved values are the aux outputs, after the visible ones
    size_t visible = ctx.num_outputs();
    TensorList grads;
    for (size_t i = 0; i < visible; ++i) grads.push_back(ctx.grad_output(i));
    SavedValues saved;
    for (size_t i = visible; i < ctx.num_saved_outputs(); ++i) saved.push_back(ctx.output(i));
    TensorList input_grads = user_backward(grads, saved);
    REMAT_CHECK(input_grads.size() == ctx.num_inputs(), "custom op '", op_name, "': backward returned ",
                input_grads.size(), " gradients for ", ctx.num_inputs(), " inputs");
    for (size_t i = 0; i < input_grads.size(); ++i) {
      if (!input_grads[i].defined()) continue;
      const autodiff::OutputMeta& meta = ctx.input_meta(i);
      REMAT_CHECK(input_grads[i].shape() == meta.shape, "custom op '", op_name,
                  "': backward returned a gradient of shape ", shape_str(input_grads[i].shape()), " for input ", i,
                  ", expected shape ", shape_str(meta.shape), " (dtype ", dtype_name(meta.dtype), ")");
      if (!ctx.needs_input_grad(i)) continue;
      REMAT_CHECK(input_grads[i].dtype() == meta.dtype, "custom op '", op_name, "': backward returned a gradient of dtype ",
                  dtype_name(input_grads[i].dtype()), " for input ", i, ", expected dtype ", dtype_name(meta.dtype),
                  " (shape ", shape_str(meta.shape), ")");
      ctx.set_input_grad(i, input_grads[i]);
    }
  };
  // The spec must outlive the call: the node copies it when recorded.
  autodiff::OpSpec& s = *spec;
  return autodiff::apply(s, inputs, forward_fn, backward_fn);
}

}  // namespace remat
