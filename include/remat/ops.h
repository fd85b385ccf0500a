// remat/ops.h - the differentiable operations.
//
// Each op is defined once (src/autodiff/ops/<family>.cpp): its forward through the device
// backend's kernels, its backward, and a declaration of what the backward needs. All take and
// return Tensors; float ops work in f32 and f64 (inputs of one op must share a dtype); index
// arguments are i64 tensors. Invalid arguments throw remat::Error naming the op and the shapes.
//
//   Tensor h = gelu(add(matmul(x, w), b));          // x [B, T, C] @ w [C, 4C] + b [4C]
//   Tensor loss = cross_entropy(logits.reshape({B * T, V}), targets.reshape({B * T}));
#pragma once

#include <optional>
#include <vector>

#include "remat/autodiff.h"
#include "remat/random.h"
#include "remat/tensor.h"

namespace remat {

// ---- unary elementwise
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x, bool tanh_approximation = false);
Tensor silu(const Tensor& x);
Tensor pow(const Tensor& x, double exponent);
Tensor square(const Tensor& x);
Tensor add_scalar(const Tensor& x, double value);
Tensor mul_scalar(const Tensor& x, double value);

// ---- binary elementwise with NumPy broadcasting
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
// cond (any dtype, nonzero = true) ? a : b, broadcasting all three.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor operator+(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);

// Sums `x` over broadcast axes down to `shape` (the backward of broadcasting).
Tensor sum_to(const Tensor& x, const Shape& shape);

// ---- reductions (negative axes count from the end; empty axes = all axes)
Tensor sum(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false);
Tensor max(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t axis, bool keepdim = false);  // i64, not differentiable

// ---- matrix products
// a [..., m, k] @ b [..., k, n] (with trans_a: a is [..., k, m]; with trans_b: b is [..., n, k]).
// Leading (batch) axes broadcast; a 2-D b against a batched a is one large GEMM.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// x [..., in] @ weight [out, in]^T + bias [out] (bias may be undefined): one "matmul" op whose GEMM
// adds the bias (no separate pass or tensor for it).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- normalisation and softmax over the last axis (softmax over any axis)
Tensor softmax(const Tensor& x, int64_t axis = -1);
Tensor log_softmax(const Tensor& x, int64_t axis = -1);
// weight and bias [C] may be undefined Tensors (no affine part).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);

// ---- indexing and losses
// table [V, D], ids (i64, any shape S) -> [S..., D]
Tensor embedding(const Tensor& table, const Tensor& ids);
// logits [N, C], targets [N] (i64) -> mean loss over rows whose target != ignore_index (scalar).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, double label_smoothing = 0.0,
                     int64_t ignore_index = -100);
// Keeps each element with probability 1 - p (scaled by 1/(1-p)); the mask comes from the default
// generator's counter, so a checkpoint region that replays the RNG state replays the mask.
Tensor dropout(const Tensor& x, double p, bool training = true);
Tensor dropout(const Tensor& x, double p, RngState state);

// ---- attention
// Fused scaled dot-product attention, as one op:
//   out = dropout(softmax(q @ k^T * scale, causal mask), dropout_p) @ v
// q [B, H, Tq, D], k [B, H, Tk, D], v [B, H, Tk, Dv] -> out [B, H, Tq, Dv] (or all without B).
// causal: query i sees keys j <= i. scale defaults to 1 / sqrt(D). The kernel never forms the
// [Tq, Tk] probabilities (FlashAttention's tiled online softmax); the backward keeps q, k, v, the
// output and one log-sum-exp per query row, and recomputes the probabilities tile by tile. Dropout
// draws one word per probability from the default generator (or the given state), the same words
// dropout() on the probabilities would use, so checkpointing replays it exactly. The output is a
// [B, H, Tq, Dv] view of a [B, Tq, H, Dv] buffer: out.permute({0, 2, 1, 3}).reshape({B, Tq, H * Dv})
// is free.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = true,
                                    double dropout_p = 0.0, bool training = true,
                                    std::optional<double> scale = std::nullopt);
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double dropout_p,
                                    RngState state, std::optional<double> scale = std::nullopt);

// ---- joining and splitting
Tensor concat(const TensorList& tensors, int64_t axis);
TensorList split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis);

}  // namespace remat
