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

#include <array>
#include <optional>
#include <vector>

#include "remat/autodiff.h"
#include "remat/random.h"
#include "remat/tensor.h"

// ---- the op list
// REMAT_OP_KINDS(X) is the one list of the built-in op kinds, X(kind, family, entry points...) per
// kind, sorted by kind:
//   kind          the name an op records (OpSpec), a selective policy lists (selective:matmul,gelu)
//                 and autodiff::op_kinds() returns
//   family        the file that defines it, src/autodiff/ops/<family>.cpp, and the op test's rows
//                 file tests/op_rows/<family>.cpp
//   entry points  the public functions of this header and the Tensor methods (remat/tensor.h) that
//                 run it (operators: the operator shorthands below), each with a row of the op test
//                 named after it
// The op kind enumeration of the op definitions, op_kinds() and the op test's coverage all expand
// it, and the op test checks that every function declared below is an entry point here. A new op
// adds its entry here and its rows file's rows; it then does not build until its family defines
// its rows. (argmax records no op: it is REMAT_UNRECORDED_OPS.)
#define REMAT_OP_KINDS(X)                                                                     \
  X(abs, unary, abs)                                                                          \
  X(adaptive_avg_pool2d, pool, adaptive_avg_pool2d)                                           \
  X(add, binary, add, operators)                                                              \
  X(add_layer_norm, norm, add_layer_norm)                                                     \
  X(add_scalar, unary, add_scalar)                                                            \
  X(avg_pool2d, pool, avg_pool2d)                                                             \
  X(batch_norm, batch_norm, batch_norm)                                                       \
  X(concat, join, concat)                                                                     \
  X(contiguous, views, contiguous, clone)                                                     \
  X(conv2d, conv, conv2d, conv1d)                                                             \
  X(convert, views, to)                                                                       \
  X(cross_entropy, loss, cross_entropy)                                                       \
  X(diagonal, diagonal, diagonal)                                                             \
  X(div, binary, div)                                                                         \
  X(dropout, dropout, dropout)                                                                \
  X(embedding, embedding, embedding)                                                          \
  X(exp, unary, exp)                                                                          \
  X(expand, views, expand)                                                                    \
  X(gelu, unary, gelu)                                                                        \
  X(gelu_tanh, unary, gelu)                                                                   \
  X(layer_norm, norm, layer_norm)                                                             \
  X(log, unary, log)                                                                          \
  X(log_softmax, softmax, log_softmax)                                                        \
  X(matmul, matmul, matmul, linear)                                                           \
  X(max, reduce, max)                                                                         \
  X(max_pool2d, pool, max_pool2d)                                                             \
  X(maximum, binary, maximum)                                                                 \
  X(mean, reduce, mean)                                                                       \
  X(minimum, binary, minimum)                                                                 \
  X(mul, binary, mul)                                                                         \
  X(mul_scalar, unary, mul_scalar)                                                            \
  X(neg, unary, neg)                                                                          \
  X(permute, views, permute, transpose)                                                       \
  X(pow, unary, pow)                                                                          \
  X(relu, unary, relu)                                                                        \
  X(rms_norm, norm, rms_norm)                                                                 \
  X(scaled_dot_product_attention, attention, scaled_dot_product_attention)                    \
  X(sigmoid, unary, sigmoid)                                                                  \
  X(silu, unary, silu)                                                                        \
  X(slice, views, slice)                                                                      \
  X(softmax, softmax, softmax)                                                                \
  X(split, join, split)                                                                       \
  X(sqrt, unary, sqrt)                                                                        \
  X(square, unary, square)                                                                    \
  X(sub, binary, sub)                                                                         \
  X(sum, reduce, sum, sum_to)                                                                 \
  X(tanh, unary, tanh)                                                                        \
  X(to_device, views, to)                                                                     \
  X(view, views, view, reshape, flatten, unsqueeze, squeeze)                                  \
  X(where, binary, where, masked_fill)
// The public functions that record no op (X(name, family)): their results carry no gradient.
#define REMAT_UNRECORDED_OPS(X) X(argmax, reduce)

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
// The residual add fused into layer norm (a pre-LN block's `h = x + r; n = layer_norm(h)`):
// returns {s, y} with s = x + r and y = layer_norm(s, weight, bias, eps), x and r of one shape,
// dtype and device (no broadcasting). Bitwise the add followed by layer_norm, forward and backward
// (x and r each get s's gradient plus the norm's input gradient), in one kernel call each way.
//   TensorList hn = add_layer_norm(x, attn_out, weight, bias);   // x, attn_out [B, T, C]; weight, bias [C]
//   Tensor out = add(hn[0], gelu(hn[1]));                         // hn[0] = x + attn_out, hn[1] its norm
TensorList add_layer_norm(const Tensor& x, const Tensor& r, const Tensor& weight, const Tensor& bias,
                          double eps = 1e-5);

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

// ---- convolution, pooling and batch normalisation (src/autodiff/ops/conv.cpp,
// pool.cpp, batch_norm.cpp). Images are NCHW; a Size2 is (height, width).
//
//   Tensor y = conv2d(x, w, b, {1, 1}, {1, 1});          // x [8, 3, 32, 32], w [16, 3, 3, 3] -> [8, 16, 32, 32]
//   Tensor p = max_pool2d(y, {3, 3}, {2, 2}, {1, 1});    // -> [8, 16, 16, 16]
//   Tensor z = batch_norm(y, gamma, beta, running_mean, running_var, /*training=*/true);
using Size2 = std::array<int64_t, 2>;

// x [N, C, H, W], weight [O, C / groups, KH, KW], bias [O] (may be undefined) -> [N, O, OH, OW] with
// OH = floor((H + 2 padding_h - dilation_h (KH - 1) - 1) / stride_h) + 1 (likewise OW); zero padding.
// float32 runs on oneDNN's primitives, float64 on im2col + OpenBLAS (remat/backend.h, ConvAlgorithm).
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), Size2 stride = {1, 1},
              Size2 padding = {0, 0}, Size2 dilation = {1, 1}, int64_t groups = 1);
// x [N, C, L], weight [O, C / groups, K] -> [N, O, OL]: conv2d on images of height 1.
Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), int64_t stride = 1,
              int64_t padding = 0, int64_t dilation = 1, int64_t groups = 1);
// Max over each window of x [N, C, H, W] -> [N, C, OH, OW] (same output-size rule as conv2d with
// kernel, stride, padding, dilation; with ceil_mode the division rounds up, but a last window that
// would start in the right padding is dropped). Padding is at most half the dilated kernel and
// counts as -inf. The gradient goes to the first maximum of each window. Stride defaults to the kernel.
Tensor max_pool2d(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding = {0, 0}, Size2 dilation = {1, 1},
                  bool ceil_mode = false);
Tensor max_pool2d(const Tensor& x, Size2 kernel);
// Mean over each window; count_include_pad divides by the window clipped to the padded input
// (PyTorch's rule), otherwise by the number of input elements in it.
Tensor avg_pool2d(const Tensor& x, Size2 kernel, Size2 stride, Size2 padding = {0, 0}, bool ceil_mode = false,
                  bool count_include_pad = true);
Tensor avg_pool2d(const Tensor& x, Size2 kernel);
// x [N, C, H, W] -> [N, C, out_h, out_w]; bin i of n along an axis of length L averages
// [floor(i L / n), ceil((i + 1) L / n)). adaptive_avg_pool2d(x, {1, 1}) is global average pooling.
Tensor adaptive_avg_pool2d(const Tensor& x, Size2 output_size);
// Normalises x [N, C, ...] per channel (axis 1) over every other axis:
//   y = (x - mean_c) / sqrt(var_c + eps) * weight_c + bias_c    (weight, bias [C] may be undefined)
// training: mean and (biased) var are the batch's; when running_mean / running_var ([C], no
// gradient) are given they are updated in place, r = (1 - momentum) r + momentum * batch, with
// the unbiased variance for running_var (N * spatial size must then exceed 1).
// !training: the running statistics (both required) normalise, and are left unchanged.
// The update is a side effect: a recomputation of the op (any policy) leaves them alone.
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum = 0.1, double eps = 1e-5);

// ---- diagonals (for einsum's repeated indices; src/autodiff/ops/diagonal.cpp)
// The view of x whose last axis runs along the diagonal of axes axis1 != axis2 (both removed):
// x [2, 3, 3] with axes 1, 2 -> [2, 3], element [b, i] = x[b, i, i]. Length min of the two sizes.
Tensor diagonal(const Tensor& x, int64_t axis1, int64_t axis2);

}  // namespace remat
