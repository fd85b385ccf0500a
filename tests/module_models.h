// Test helpers: module-structured models written the way a user writes them (own classes, loops
// over layers, residual glue in the model's own code), and measurement helpers.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint_models.h"
#include "remat/nn.h"
#include "remat/remat.h"

namespace remat::testing {

// A user's layer: tanh(Linear(x)); its Linear is a sub-module (a nested call, run plain).
class TanhBlock : public nn::Module {
 public:
  TanhBlock(int64_t width, DType dtype) { fc = register_module("fc", std::make_shared<nn::Linear>(width, width, true, dtype)); }
  Tensor forward_impl(const Tensor& x) override { return tanh(fc->forward(x)); }
  std::string type_name() const override { return "TanhBlock"; }
  std::shared_ptr<nn::Linear> fc;
};

// A wider user layer: Linear(w, 4w) -> tanh -> Linear(4w, w); it keeps about 5x its input.
class WideBlock : public nn::Module {
 public:
  WideBlock(int64_t width, DType dtype) {
    up = register_module("up", std::make_shared<nn::Linear>(width, 4 * width, true, dtype));
    down = register_module("down", std::make_shared<nn::Linear>(4 * width, width, true, dtype));
  }
  Tensor forward_impl(const Tensor& x) override { return down->forward(tanh(up->forward(x))); }
  std::string type_name() const override { return "WideBlock"; }
  std::shared_ptr<nn::Linear> up, down;
};

// A user's model: a loop over N layers (TanhBlock, or WideBlock when `wide`), optionally with the
// residual add in its own code.
class LoopModel : public nn::Module {
 public:
  LoopModel(int n, int64_t width, DType dtype, uint64_t seed, bool residual = false, bool wide = false)
      : residual_(residual) {
    for (int i = 0; i < n; ++i) {
      std::shared_ptr<nn::Module> layer;
      if (wide)
        layer = std::make_shared<WideBlock>(width, dtype);
      else
        layer = std::make_shared<TanhBlock>(width, dtype);
      layers.push_back(register_module("layer" + std::to_string(i), layer));
    }
    reset_parameters(seed);
  }
  Tensor forward_impl(const Tensor& x) override {
    Tensor h = x;
    for (auto& layer : layers) h = residual_ ? add(h, mul_scalar(layer->forward(h), 0.5)) : layer->forward(h);
    return h;
  }
  std::string type_name() const override { return "LoopModel"; }
  std::vector<std::shared_ptr<nn::Module>> layers;

 private:
  bool residual_;
};

// A layer with two outputs: the halves of tanh(Linear(w, 2w)(x)).
class TwoOut : public nn::Module {
 public:
  TwoOut(int64_t width, DType dtype) { fc = register_module("fc", std::make_shared<nn::Linear>(width, 2 * width, true, dtype)); }
  TensorList forward_list_impl(const TensorList& in) override {
    Tensor h = tanh(fc->forward(in[0]));
    const int64_t w = in[0].size(-1);
    return {h.slice(-1, 0, w), h.slice(-1, w, 2 * w)};
  }
  std::shared_ptr<nn::Linear> fc;
};

// Linear -> "scaled" (tanh of the input times *scale, read when the layer runs) -> Linear. The
// tanh keeps its output for its backward, so the recomputation runs both ops (a layer whose ops
// no node saved is not recomputed at all: Note [one graph] in src/checkpoint/segment.cpp).
// An op whose forward is not a pure function of its inputs: tanh(h * *scale), reading the scalar
// when it runs (a recomputation runs an op's forward again, never the layer's code).
inline CustomOp scaled_tanh(const double* scale) {
  return CustomOp{"scaled_tanh",
                  [scale](const TensorList& in, SaveContext& ctx) {
                    Tensor y = tanh(mul_scalar(in[0], *scale));
                    ctx.save(y);
                    ctx.save(full({1}, *scale, in[0].dtype(), memory::Tag::other, in[0].device()));
                    return TensorList{y};
                  },
                  [](const TensorList& grads, const SavedValues& saved) {
                    Tensor d = mul(add_scalar(neg(square(saved[0])), 1.0), saved[1]);
                    return TensorList{mul(grads[0], d)};
                  }};
}

inline std::shared_ptr<nn::Sequential> scaled_model(const double* scale) {
  manual_seed(3);
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Linear>(4, 8));
  m->add(std::make_shared<nn::Lambda>([op = scaled_tanh(scale)](const Tensor& h) { return op({h})[0]; }), "scaled");
  m->add(std::make_shared<nn::Linear>(8, 2));
  return m;
}

// A step of scaled_model on `device` under every-layer whose scale changes between the forward
// and the backward pass: the error it raised ("" if none).
inline std::string captured_scalar_error(Device device) {
  double scale = 1.5;
  auto model = scaled_model(&scale);
  model->to(device);
  ScopedPolicy scoped(Policy::every_layer());
  Tensor loss = sum(square(model->forward(randn({3, 4}, DType::f32, RngState{7, 0}).to(device))));
  scale = 2.5;
  try {
    loss.backward();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Gradients of mean(model(x)) for every parameter and x, under a policy.
inline TensorList module_grads(nn::Module& model, const Tensor& x, const Policy& policy, uint64_t dropout_seed = 7) {
  TensorList wrt = model.parameters();
  if (x.requires_grad()) wrt.push_back(x);
  manual_seed(dropout_seed);
  return remat::grad([&](const TensorList&) { return mean(model.forward(x)); }, wrt, GradOptions{policy});
}

struct StepMeasure {
  size_t peak_saved = 0;
  Counters counters;
};

// One backward of mean(model(x)) under a policy: the peak of saved bytes above the baseline, the
// counters, and a check that every saved byte is freed afterwards.
inline StepMeasure measure_step(nn::Module& model, const Tensor& x, const Policy& policy, uint64_t dropout_seed = 7) {
  model.zero_grad();
  manual_seed(dropout_seed);
  memory::reset_peaks();
  reset_counters();
  const size_t base = memory::live_bytes(memory::Tag::saved);
  backward([&] { return mean(model.forward(x)); }, GradOptions{policy});
  StepMeasure m;
  m.peak_saved = memory::peak_bytes(memory::Tag::saved) - base;
  m.counters = counters();
  EXPECT_EQ(memory::live_bytes(memory::Tag::saved), base) << "saved bytes left after the backward pass";
  return m;
}

// The bound of include/remat/checkpoint.h for any region structure without nesting, when the ops
// outside regions keep nothing: sum of what the regions keep + the largest re-run.
inline size_t region_bound(const Counters& c) {
  size_t kept = 0, rerun = 0;
  for (const auto& r : c.regions) {
    kept += r.boundary_bytes + r.cached_bytes;
    rerun = std::max(rerun, r.recomputed_saved_bytes);
  }
  return kept + rerun;
}

}  // namespace remat::testing
