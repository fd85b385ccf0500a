// Basic layers: Linear, Embedding, LayerNorm, RMSNorm, activations, Dropout.
#include "remat/nn/layers.h"

#include <cmath>

#include "remat/ops.h"

namespace remat::nn {

// ---- Linear

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, DType dtype)
    : in_(in_features), out_(out_features) {
  REMAT_CHECK(in_features > 0 && out_features > 0, "Linear: sizes must be positive, got in_features ", in_features,
              ", out_features ", out_features);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  weight = register_parameter("weight", {out_features, in_features}, dtype, Init::uniform(-bound, bound));
  if (bias) this->bias = register_parameter("bias", {out_features}, dtype, Init::zeros());
}

void Linear::tie_weight(const Tensor& w) { weight = share_parameter("weight", w); }

std::string Linear::type_name() const {
  return detail::concat("Linear(", in_, " -> ", out_, bias.defined() ? ", bias)" : ", no bias)");
}

Tensor Linear::forward_impl(const Tensor& x) {
  REMAT_CHECK(x.defined(), type_name(), ": input is undefined");
  REMAT_CHECK(x.dim() >= 1 && x.size(-1) == in_, type_name(), ": expects an input of shape [..., ", in_, "], got ",
              shape_str(x.shape()));
  if (x.dim() == 1) return forward_impl(x.unsqueeze(0)).squeeze(0);
  // x [..., in] @ weight^T [in, out] -> [..., out]
  return linear(x, compute_weight(weight), compute_weight(bias));
}

// ---- Embedding

Embedding::Embedding(int64_t num_embeddings, int64_t dim, DType dtype) : num_(num_embeddings), dim_(dim) {
  REMAT_CHECK(num_embeddings > 0 && dim > 0, "Embedding: sizes must be positive, got ", num_embeddings, " x ", dim);
  weight = register_parameter("weight", {num_embeddings, dim}, dtype, Init::normal(0.0, 0.02));
}

std::string Embedding::type_name() const { return detail::concat("Embedding(", num_, ", ", dim_, ")"); }

Tensor Embedding::forward_impl(const Tensor& ids) { return embedding(compute_weight(weight), ids); }

// ---- LayerNorm, RMSNorm

LayerNorm::LayerNorm(int64_t dim, double eps, bool affine, DType dtype) : dim_(dim), eps_(eps) {
  REMAT_CHECK(dim > 0, "LayerNorm: dim must be positive, got ", dim);
  if (affine) {
    weight = register_parameter("weight", {dim}, dtype, Init::ones());
    bias = register_parameter("bias", {dim}, dtype, Init::zeros());
  }
}

std::string LayerNorm::type_name() const { return detail::concat("LayerNorm(", dim_, ")"); }

Tensor LayerNorm::forward_impl(const Tensor& x) {
  REMAT_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == dim_, type_name(), ": expects an input of shape [..., ",
              dim_, "], got ", x.defined() ? shape_str(x.shape()) : "an undefined tensor");
  return layer_norm(x, compute_weight(weight), compute_weight(bias), eps_);
}

TensorList LayerNorm::forward_list_impl(const TensorList& inputs) {
  REMAT_CHECK(inputs.size() == 1 || inputs.size() == 2, type_name(),
              ": expects one input (x) or two (x and a residual added to it), got ", inputs.size());
  if (inputs.size() == 1) return TensorList{forward_impl(inputs[0])};
  const Tensor& x = inputs[0];
  REMAT_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == dim_, type_name(), ": expects an input of shape [..., ",
              dim_, "], got ", x.defined() ? shape_str(x.shape()) : "an undefined tensor");
  return add_layer_norm(x, inputs[1], compute_weight(weight), compute_weight(bias), eps_);
}

RMSNorm::RMSNorm(int64_t dim, double eps, DType dtype) : dim_(dim), eps_(eps) {
  REMAT_CHECK(dim > 0, "RMSNorm: dim must be positive, got ", dim);
  weight = register_parameter("weight", {dim}, dtype, Init::ones());
}

std::string RMSNorm::type_name() const { return detail::concat("RMSNorm(", dim_, ")"); }

Tensor RMSNorm::forward_impl(const Tensor& x) {
  REMAT_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == dim_, type_name(), ": expects an input of shape [..., ",
              dim_, "], got ", x.defined() ? shape_str(x.shape()) : "an undefined tensor");
  return rms_norm(x, compute_weight(weight), eps_);
}

// ---- activations

Tensor GELU::forward_impl(const Tensor& x) { return gelu(x, tanh_); }
Tensor ReLU::forward_impl(const Tensor& x) { return relu(x); }
Tensor Tanh::forward_impl(const Tensor& x) { return remat::tanh(x); }
Tensor SiLU::forward_impl(const Tensor& x) { return silu(x); }

// ---- Dropout

Dropout::Dropout(double p) : p_(p) {
  REMAT_CHECK(p >= 0.0 && p <= 1.0, "Dropout: probability p = ", p, " is outside [0, 1]");
}

std::string Dropout::type_name() const { return detail::concat("Dropout(", p_, ")"); }

Tensor Dropout::forward_impl(const Tensor& x) { return dropout(x, p_, training()); }

}  // namespace remat::nn
