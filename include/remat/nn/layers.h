// remat/nn/layers.h - basic layers: Linear, Embedding, LayerNorm, RMSNorm, activations, Dropout.
//
//   auto fc = std::make_shared<remat::nn::Linear>(64, 256);        // weight [256, 64], bias [256]
//   Tensor h = remat::nn::GELU().forward(fc->forward(x));           // x [B, T, 64] -> [B, T, 256]
//
// Parameter layouts follow PyTorch (Linear stores weight [out, in] and computes x @ W^T + b), so a
// safetensors file written by PyTorch for the same module names loads as is.
// Every layer takes the dtype of its parameters (f32 by default; f64 for gradient checks).
#pragma once

#include <cstdint>

#include "remat/nn/module.h"

namespace remat::nn {

// y = x @ weight^T + bias; x [..., in] -> [..., out]. weight [out, in] ~ U(-1/sqrt(in), 1/sqrt(in)),
// bias [out] = 0.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, DType dtype = DType::f32);
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override;
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  // Weight tying: the weight becomes `weight` ([out, in], a parameter of another module, e.g. an
  // Embedding(out, in)'s); see Module::share_parameter.
  void tie_weight(const Tensor& weight);
  Tensor weight;
  Tensor bias;  // undefined without bias

 private:
  int64_t in_, out_;
};

// ids (i64, any shape S) -> [S..., dim]; weight [num, dim] ~ N(0, 0.02^2).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, DType dtype = DType::f32);
  Tensor forward_impl(const Tensor& ids) override;
  std::string type_name() const override;
  Tensor weight;

 private:
  int64_t num_, dim_;
};

// Normalises the last axis: (x - mean) / sqrt(var + eps) * weight + bias; weight 1, bias 0.
// Called with two inputs {x, r} (a pre-LN block's residual stream and the branch added to it), it
// returns {x + r, the norm of x + r}: the add fused into the norm (add_layer_norm, remat/ops.h),
// the bits of add(x, r) followed by forward(x + r).
//   auto ln = std::make_shared<remat::nn::LayerNorm>(64);
//   TensorList hn = ln->forward(TensorList{x, attn_out});    // hn[0] = x + attn_out, hn[1] its norm
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool affine = true, DType dtype = DType::f32);
  Tensor forward_impl(const Tensor& x) override;
  TensorList forward_list_impl(const TensorList& inputs) override;
  std::string type_name() const override;
  Tensor weight, bias;  // undefined without affine

 private:
  int64_t dim_;
  double eps_;
};

// x / sqrt(mean(x^2) + eps) * weight over the last axis; weight 1.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6, DType dtype = DType::f32);
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override;
  Tensor weight;

 private:
  int64_t dim_;
  double eps_;
};

// ---- activations (no parameters)
class GELU : public Module {
 public:
  explicit GELU(bool tanh_approximation = false) : tanh_(tanh_approximation) {}
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return tanh_ ? "GELU(tanh)" : "GELU"; }

 private:
  bool tanh_;
};
class ReLU : public Module {
 public:
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "ReLU"; }
};
class Tanh : public Module {
 public:
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "Tanh"; }
};
class SiLU : public Module {
 public:
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override { return "SiLU"; }
};

// remat::dropout with the default generator in training mode; the identity in eval mode. Inside
// a checkpoint region the mask is replayed exactly during recomputation. Note that the mode is
// read again when a region re-runs, so do not switch train()/eval() between a forward pass and
// its backward.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward_impl(const Tensor& x) override;
  std::string type_name() const override;
  double p() const { return p_; }

 private:
  double p_;
};

}  // namespace remat::nn
