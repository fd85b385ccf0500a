// Test helpers: small models built from captured parameters, and bitwise comparison.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "remat/remat.h"

namespace remat::testing {

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

// silu as a custom op whose backward reads its saved input twice (the property tests' custom op).
inline CustomOp fused_silu() {
  return CustomOp{"fused_silu",
                  [](const TensorList& in, SaveContext& ctx) {
                    ctx.save(in[0]);
                    return TensorList{silu(in[0])};
                  },
                  [](const TensorList& grads, const SavedValues& saved) {
                    Tensor s = sigmoid(saved[0]);  // reads saved[0] twice
                    Tensor d = mul(s, add_scalar(mul(saved[0], add_scalar(neg(s), 1.0)), 1.0));
                    return TensorList{mul(grads[0], d)};
                  }};
}

// A chain of identical tanh blocks h -> tanh(h @ W_i + b_i), parameters captured by the layers.
struct TanhChain {
  std::vector<Tensor> weights, biases;
  Chain chain;
  TanhChain(int blocks, int width, DType dtype, uint64_t seed) {
    for (int i = 0; i < blocks; ++i) {
      Tensor w = randn({width, width}, dtype, RngState{seed, static_cast<uint64_t>(i) * 1000000}, 0.0,
                       1.0 / std::sqrt(static_cast<double>(width)));
      Tensor b = randn({width}, dtype, RngState{seed + 1, static_cast<uint64_t>(i) * 1000000}, 0.0, 0.1);
      w.requires_grad_();
      b.requires_grad_();
      weights.push_back(w);
      biases.push_back(b);
      chain.add([w, b](const Tensor& h) { return tanh(add(matmul(h, w), b)); }, "block" + std::to_string(i));
    }
  }
  std::vector<Tensor> params() const {
    std::vector<Tensor> p = weights;
    p.insert(p.end(), biases.begin(), biases.end());
    return p;
  }
  void zero_grad() {
    for (auto& p : params()) p.zero_grad();
  }
};

}  // namespace remat::testing
