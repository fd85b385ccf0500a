// remat/backend.h - the device backend interface.
//
// Ops (remat/ops.h) never touch memory directly: they call the kernels of the backend that owns
// their inputs' device. A backend is about 40 kernels, a few device verbs and an allocator; the CPU
// backend implements all of them. A CUDA backend implements the same class and registers itself
// with register_backend(); no op definition changes. Calls are per tensor, never per element.
//
//   remat::register_backend({remat::DeviceType::cuda, 0}, &my_cuda_backend);
//   Tensor x = remat::randn({4, 3}).to(Device{DeviceType::cuda, 0});   // host -> device copy
//   Tensor y = remat::tanh(x);                   // runs my_cuda_backend.unary(...)
//   std::vector<double> v = y.to(remat::kCpu).to_vector();               // device -> host copy
//
// backend(device) of a registered device returns a dispatcher around it (src/tensor/dispatch.cpp):
// each kernel the backend supports() for the call's dtype goes to it; any other runs on the CPU
// backend, its operands copied to host memory and its results copied back, so a new backend can
// start with a few kernels and grow. The dispatcher is also what permits kernels, and only them,
// to read device memory (detail::DeviceKernelScope in remat/tensor.h).
//
// Kernel contract: outputs are allocated by the caller (contiguous, correct shape and dtype, on
// the backend's device); inputs may be strided views unless stated otherwise.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "remat/memory.h"
#include "remat/random.h"
#include "remat/tensor.h"

namespace remat {

// relu propagates NaN (relu(NaN) = NaN); its derivative at NaN is 0, as PyTorch's.
enum class UnaryOp : uint8_t {
  neg, exp, log, sqrt, abs, tanh, sigmoid, relu, gelu, gelu_tanh, silu, pow_scalar,
  // helpers used by backward formulas and optimisers
  square, reciprocal, add_scalar, mul_scalar, sign,
};
const char* unary_op_name(UnaryOp op);

// maximum and minimum propagate NaN: a NaN operand gives NaN (as in PyTorch and NumPy); ties go to
// a. The *_picks_b helpers (used by their backward formulas) give 1 where maximum (minimum) of
// (a, b) returns b, else 0.
enum class BinaryOp : uint8_t { add, sub, mul, div, maximum, minimum, maximum_picks_b, minimum_picks_b };
const char* binary_op_name(BinaryOp op);

enum class ReduceOp : uint8_t { sum, mean, max, argmax };

// ---- convolution and pooling geometry
// A 2-D convolution: stride, zero padding (both sides of each axis), dilation, groups.
struct Conv2dGeometry {
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
  bool operator==(const Conv2dGeometry&) const = default;
};
// A 2-D pooling window. Output size per axis: floor-or-ceil((L + 2 pad - dilation (k - 1) - 1)
// / stride) + 1, where with ceil_mode a last window starting inside the right padding is dropped
// (PyTorch's rule). avg_pool2d: count_include_pad divides by the window size clipped to the
// padded input, otherwise by the number of input elements in the window.
struct Pool2dGeometry {
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;  // max_pool2d only
  bool ceil_mode = false;
  bool count_include_pad = true;           // avg_pool2d only
};

// How CPU conv2d in float32 is computed (float64 always uses im2col + OpenBLAS dgemm: oneDNN
// has no f64 convolution on the CPU). `automatic` is the measured choice (README "Convolution
// choice"); the others exist for benchmarks (bench/bench_conv.cpp) and cross-checking tests:
//   im2col_gemm      remat's own im2col (col2im backward) + one GEMM per image and group
//   onednn_plain     oneDNN primitives on the NCHW / OIHW tensors as they are
//   onednn_blocked   oneDNN primitives in the layouts oneDNN prefers, with reorders in and out
// Process-wide; set it before a training step, not during one (a region's recomputation must run
// the same kernels as its first run for gradients to stay bitwise equal).
enum class ConvAlgorithm : uint8_t { automatic, im2col_gemm, onednn_plain, onednn_blocked };
const char* conv_algorithm_name(ConvAlgorithm algorithm);
void set_conv_algorithm(ConvAlgorithm algorithm);
ConvAlgorithm conv_algorithm();

// One optimizer update (Backend::sgd_step, adamw_step); the formulas of remat/nn/optim.h.
struct SgdStep {
  double lr = 0.01, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
  bool first = false;  // the momentum buffer is set to the gradient instead of updated
};
struct AdamWStep {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  double bias_correction1 = 1.0, bias_correction2 = 1.0;  // 1 - beta^t
};

// Fused attention (Backend::attention): out = dropout(softmax(q k^T * scale, mask)) @ v.
struct AttentionParams {
  bool causal = true;       // query i sees keys j <= i only
  double scale = 1.0;       // multiplies the scores q . k
  double dropout_p = 0.0;   // probability of dropping an attention probability (0: no dropout)
  RngState dropout_state;   // where the dropout words come from (see Backend::attention)
};

// ---- the kernel list
// REMAT_KERNELS(X) is the one list of a Backend's kernels, X(name, dtype_of, (parameters),
// (arguments)) per kernel with its contract above it. The Kernel enum, kKernelCount,
// kernel_name(), Backend's pure virtuals, the override declarations of a backend class
// (REMAT_OVERRIDE_KERNELS) and the dispatcher's forwarding (src/tensor/dispatch.cpp) all expand it.
//   name        the virtual function and its Kernel enumerator
//   dtype_of    the operand whose dtype is the `dtype` of supports()
//   parameters  the virtual's parameter list
//   arguments   a call forwarding them, each tensor marked in(t) (only read) or inout(t) (written:
//               the CPU fallback copies it to host memory and back, so a tensor updated in place or
//               accumulated into keeps its contents); a list of tensors only read is each_in(in, ts)
// REMAT_REQUIRED_KERNELS are supported by every backend (the fallback itself needs them); the
// dispatcher asks supports() for the REMAT_OPTIONAL_KERNELS only. Adding a kernel: the checklist
// in docs/backends.md.
template <class Mark>
TensorList each_in(const Mark& in, const TensorList& tensors) {
  TensorList marked;
  marked.reserve(tensors.size());
  for (const Tensor& t : tensors) marked.push_back(in(t));
  return marked;
}
#define REMAT_REQUIRED_KERNELS(X)                                                                                      \
  /* ---- data movement */                                                                                             \
  /* dst[...] = src[...] with broadcasting of src to dst's shape; dtypes may differ (conversion). */                   \
  X(copy, dst, (const Tensor& src, const Tensor& dst), (in(src), inout(dst)))                                          \
  X(fill, dst, (const Tensor& dst, double value), (inout(dst), value))

#define REMAT_OPTIONAL_KERNELS(X)                                                                                      \
  X(arange, dst, (const Tensor& dst, double start, double step), (inout(dst), start, step))                            \
  /* out (one i64) = the recomputation check's 64-bit digest of x's bytes in logical order, the                        \
     formula of src/tensor/digest_formula.h: the same for the same bytes on every backend, whatever                    \
     x's layout and the thread count. */                                                                               \
  X(digest, x, (const Tensor& x, const Tensor& out), (in(x), inout(out)))                                              \
  X(rand_uniform, dst, (const Tensor& dst, RngState state, double low, double high),                                   \
    (inout(dst), state, low, high))                                                                                    \
  X(rand_normal, dst, (const Tensor& dst, RngState state, double mean, double stddev),                                 \
    (inout(dst), state, mean, stddev))                                                                                 \
                                                                                                                       \
  /* ---- elementwise */                                                                                               \
  X(unary, x, (UnaryOp op, const Tensor& x, const Tensor& y, double scalar), (op, in(x), inout(y), scalar))            \
  /* gx = gy * d(op)/dx, given x and (for ops whose derivative is cheaper from it) y = op(x). */                       \
  X(unary_backward, gy, (UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& gy, const Tensor& gx,             \
                         double scalar),                                                                               \
    (op, in(x), in(y), in(gy), inout(gx), scalar))                                                                     \
  /* out = a (op) b with NumPy broadcasting to out's shape. */                                                         \
  X(binary, a, (BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out), (op, in(a), in(b), inout(out)))     \
  /* out = cond != 0 ? a : b, broadcasting all three to out's shape. */                                                \
  X(where, out, (const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out),                             \
    (in(cond), in(a), in(b), inout(out)))                                                                              \
                                                                                                                       \
  /* ---- reductions: reduce x over `axes` (sorted, unique); out has x's shape with those axes                         \
     removed (or kept as 1 when keepdim was asked; the layout is the same). */                                         \
  X(reduce, x, (ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out),                    \
    (op, in(x), axes, inout(out)))                                                                                     \
                                                                                                                       \
  /* ---- matrix products: c[b] = alpha * op(a[b]) @ op(b[b]) + beta * c[b]                                            \
     a: [batch, m, k] (or [batch, k, m] when trans_a), b: [batch, k, n] (or [batch, n, k]),                            \
     c: [batch, m, n] contiguous. A batch stride of 0 broadcasts an operand. */                                        \
  X(gemm, c, (const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, double alpha,             \
              double beta),                                                                                            \
    (in(a), trans_a, in(b), trans_b, inout(c), alpha, beta))                                                           \
  /* c[b] = op(a[b]) @ op(b[b]) + bias, bias [n] added to every row (a linear layer's product): on the                 \
     CPU the bits of copy(bias, c) then gemm(alpha 1, beta 1); a backend may fuse the bias into the                    \
     product's epilogue, the same kernel for the same shapes on every call. */                                          \
  X(gemm_bias, c, (const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias, const Tensor& c), \
    (in(a), trans_a, in(b), trans_b, in(bias), inout(c)))                                                              \
                                                                                                                       \
  /* ---- rows (last axis) kernels, inputs contiguous */                                                               \
  X(softmax, x, (const Tensor& x, const Tensor& y, bool log), (in(x), inout(y), log))                                  \
  X(softmax_backward, y, (const Tensor& y, const Tensor& gy, const Tensor& gx, bool log),                              \
    (in(y), in(gy), inout(gx), log))                                                                                   \
  /* y = (x - mean) * rstd * weight + bias; mean and rstd are [rows]. weight/bias may be undefined. */                 \
  X(layer_norm, x, (const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,            \
                    const Tensor& mean, const Tensor& rstd),                                                           \
    (in(x), in(weight), in(bias), eps, inout(y), inout(mean), inout(rstd)))                                            \
  X(layer_norm_backward, x, (const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,            \
                             const Tensor& gy, const Tensor& gx, const Tensor& gweight, const Tensor& gbias),          \
    (in(x), in(weight), in(mean), in(rstd), in(gy), inout(gx), inout(gweight), inout(gbias)))                          \
  /* The residual add fused into layer norm: s = x + r (x, r, s of one shape), then the layer_norm                    \
     kernel's y, mean and rstd of s, in s's dtype: the bits of binary(add, x, r) followed by layer_norm(s). */          \
  X(add_layer_norm, x, (const Tensor& x, const Tensor& r, const Tensor& weight, const Tensor& bias, double eps,         \
                        const Tensor& s, const Tensor& y, const Tensor& mean, const Tensor& rstd),                     \
    (in(x), in(r), in(weight), in(bias), eps, inout(s), inout(y), inout(mean), inout(rstd)))                           \
  /* layer_norm_backward of s with the residual's gradient gs added to the input gradient:                             \
     gx = layer_norm_backward's gx, rounded to the dtype, + gs (the bits of layer_norm_backward followed by             \
     binary(add)); gweight, gbias as layer_norm_backward's (each may be undefined; gx is defined). */                   \
  X(add_layer_norm_backward, s, (const Tensor& s, const Tensor& weight, const Tensor& mean, const Tensor& rstd,        \
                                 const Tensor& gy, const Tensor& gs, const Tensor& gx, const Tensor& gweight,          \
                                 const Tensor& gbias),                                                                 \
    (in(s), in(weight), in(mean), in(rstd), in(gy), in(gs), inout(gx), inout(gweight), inout(gbias)))                  \
  /* y = x * rstd * weight, rstd = 1/sqrt(mean(x^2) + eps) */                                                          \
  X(rms_norm, x, (const Tensor& x, const Tensor& weight, double eps, const Tensor& y, const Tensor& rstd),             \
    (in(x), in(weight), eps, inout(y), inout(rstd)))                                                                   \
  X(rms_norm_backward, x, (const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& gy,                \
                           const Tensor& gx, const Tensor& gweight),                                                   \
    (in(x), in(weight), in(rstd), in(gy), inout(gx), inout(gweight)))                                                  \
                                                                                                                       \
  /* ---- indexing */                                                                                                  \
  /* out[i, :] = table[ids[i], :]; ids i64 of any shape (flattened), table [V, D]. */                                  \
  X(embedding, table, (const Tensor& table, const Tensor& ids, const Tensor& out), (in(table), in(ids), inout(out)))   \
  /* gtable[ids[i], :] += gout[i, :] (gtable zero-initialised by the caller). */                                       \
  X(embedding_backward, gout, (const Tensor& ids, const Tensor& gout, const Tensor& gtable),                           \
    (in(ids), in(gout), inout(gtable)))                                                                                \
  /* Per-row loss of logits [N, C] against targets [N] (i64); rows whose target equals                                 \
     ignore_index get loss 0. Also writes into `kept` [N] what the backward reads: each row's                          \
     log-sum-exp rounded to kept's dtype (the logits' dtype, float32 for 16-bit logits; nothing                        \
     [N, C] is kept). Into scale (a 0-d tensor of the logits' dtype) the weight of each row in the                    \
     mean: 1 / (the number of rows not ignored), as a double rounded to the dtype, or 0 if every row                   \
     is ignored. A target outside [0, C) that is not ignore_index is a remat::Error naming the row                     \
     (so the op validates its targets without reading device memory on the host). */                                  \
  X(cross_entropy, logits, (const Tensor& logits, const Tensor& targets, double label_smoothing,                       \
                            int64_t ignore_index, const Tensor& losses, const Tensor& kept, const Tensor& scale),      \
    (in(logits), in(targets), label_smoothing, ignore_index, inout(losses), inout(kept), inout(scale)))                \
  /* glogits = gloss[r] * (softmax[r] - smoothed one-hot target), 0 on ignored rows, from the forward's                \
     kept [N]: softmax = exp(logits - kept[r]) in the logits' dtype. */                                                \
  X(cross_entropy_backward, glogits, (const Tensor& logits, const Tensor& kept, const Tensor& targets,                 \
                                      const Tensor& gloss, double label_smoothing, int64_t ignore_index,               \
                                      const Tensor& glogits),                                                          \
    (in(logits), in(kept), in(targets), in(gloss), label_smoothing, ignore_index, inout(glogits)))                     \
  /* y = x * keep / (1 - p), keep drawn from (state): element i kept iff uniform(word i) >= p. */                      \
  X(dropout, x, (const Tensor& x, double p, RngState state, const Tensor& y), (in(x), p, state, inout(y)))             \
                                                                                                                       \
  /* ---- convolution, pooling and batch normalisation (src/tensor/cpu/conv.cpp,                             \
     pool.cpp, batch_norm.cpp). Images are NCHW and contiguous; weights [O, C / groups, KH, KW]. */                    \
  /* y [N, O, OH, OW] = conv(x [N, C, H, W], w) + bias [O] (bias may be undefined). */                                 \
  X(conv2d, x, (const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g,                         \
                const Tensor& y),                                                                                      \
    (in(x), in(w), in(bias), g, inout(y)))                                                                             \
  /* gx [N, C, H, W] = the input gradient of conv2d for gy [N, O, OH, OW]. */                                          \
  X(conv2d_backward_input, gy, (const Tensor& gy, const Tensor& w, const Conv2dGeometry& g,                            \
                                const Tensor& gx),                                                                     \
    (in(gy), in(w), g, inout(gx)))                                                                                     \
  /* gw [O, C / groups, KH, KW] and gbias [O] (either may be undefined) for x and gy. */                               \
  X(conv2d_backward_weight, gy, (const Tensor& x, const Tensor& gy, const Conv2dGeometry& g, const Tensor& gw,         \
                                 const Tensor& gbias),                                                                 \
    (in(x), in(gy), g, inout(gw), inout(gbias)))                                                                       \
  /* y [N, C, OH, OW] = max over each window; indices (i64, y's shape) = the flat position                             \
     h * W + w of the maximum within its input plane (the first one on ties). */                                       \
  X(max_pool2d, x, (const Tensor& x, const Pool2dGeometry& g, const Tensor& y, const Tensor& indices),                 \
    (in(x), g, inout(y), inout(indices)))                                                                              \
  /* gx (zero-filled here) [indices[i]] += gy[i], plane by plane. */                                                   \
  X(max_pool2d_backward, gy, (const Tensor& gy, const Tensor& indices, const Tensor& gx),                              \
    (in(gy), in(indices), inout(gx)))                                                                                  \
  X(avg_pool2d, x, (const Tensor& x, const Pool2dGeometry& g, const Tensor& y), (in(x), g, inout(y)))                  \
  X(avg_pool2d_backward, gy, (const Tensor& gy, const Pool2dGeometry& g, const Tensor& gx), (in(gy), g, inout(gx)))    \
  /* Output bin i of an axis of length L into n bins averages [floor(i L / n), ceil((i + 1) L / n)). */                \
  X(adaptive_avg_pool2d, x, (const Tensor& x, const Tensor& y), (in(x), inout(y)))                                     \
  X(adaptive_avg_pool2d_backward, gy, (const Tensor& gy, const Tensor& gx), (in(gy), inout(gx)))                       \
  /* x [N, C, S...] (any S, possibly none): per-channel mean [C] and biased variance [C] over N and S. */              \
  X(batch_norm_statistics, x, (const Tensor& x, const Tensor& mean, const Tensor& var),                                \
    (in(x), inout(mean), inout(var)))                                                                                  \
  /* y = (x - mean[c]) * rstd[c] * weight[c] + bias[c] (weight, bias may be undefined). */                             \
  X(batch_norm_apply, x, (const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,               \
                          const Tensor& bias, const Tensor& y),                                                        \
    (in(x), in(mean), in(rstd), in(weight), in(bias), inout(y)))                                                       \
  /* Gradients of batch_norm_apply where mean and rstd are the batch statistics of x (training)                        \
     or constants (evaluation). gx, gweight, gbias may each be undefined. */                                           \
  X(batch_norm_backward, x, (const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,            \
                             const Tensor& gy, bool batch_statistics, const Tensor& gx, const Tensor& gweight,         \
                             const Tensor& gbias),                                                                     \
    (in(x), in(mean), in(rstd), in(weight), in(gy), batch_statistics, inout(gx), inout(gweight), inout(gbias)))        \
                                                                                                                       \
  /* ---- optimizer updates, in place, one pass over parameter, gradient and state (all                                \
     contiguous, of the parameter's shape and dtype; the momentum buffer is undefined without momentum) */             \
  X(sgd_step, param, (const Tensor& param, const Tensor& grad, const Tensor& momentum, const SgdStep& step),           \
    (inout(param), in(grad), inout(momentum), step))                                                                   \
  X(adamw_step, param, (const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,      \
                        const AdamWStep& step),                                                                        \
    (inout(param), in(grad), inout(exp_avg), inout(exp_avg_sq), step))                                                 \
  /* out (0-d f64) = the sum, in list order and in float64, of each tensor's sum of squares: the                      \
     value of sum(square(t)) in t's dtype (f32, f64, bf16, f16; any strides), widened. Fixed order: the                \
     same bits on every call. Tensors on out's device. */                                                              \
  X(sum_squares, (tensors.empty() ? out : tensors.front()), (const TensorList& tensors, const Tensor& out),            \
    (each_in(in, tensors), inout(out)))                                                                                \
  /* Each tensor t of `tensors` (floating, any strides, no two sharing storage; at least one) becomes                  \
     t * scale in place, with the bits of unary(mul_scalar, t, tmp, scale) then copy(tmp, t), the                      \
     tensors of one dtype. A backend may scale many tensors in one launch (gradient clipping). */                     \
  X(scale_each, tensors.at(0), (const TensorList& tensors, double scale), (each_in(inout, tensors), scale))           \
                                                                                                                       \
  /* ---- fused attention, per batch b and head h, never forming the [Tq, Tk] probabilities:                           \
       out[b, h] = dropout(softmax(q[b, h] @ k[b, h]^T * scale, causal mask)) @ v[b, h]                                \
     q [B, H, Tq, D], k [B, H, Tk, D], v [B, H, Tk, Dv], out [B, H, Tq, Dv]: any strides with a                        \
     unit stride along the last axis; lse [B, H, Tq] contiguous receives each row's log-sum-exp of                     \
     the scaled, masked scores (the backward recomputes the probabilities from it). Dropout keeps                      \
     probability (b, h, i, j) iff uniform_float(word ((b * H + h) * Tq + i) * Tk + j of                                \
     dropout_state) >= dropout_p, the words dropout() would use on the [B, H, Tq, Tk] tensor.                          \
     Results do not depend on the number of threads. */                                                                \
  X(attention, q, (const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params,                   \
                   const Tensor& out, const Tensor& lse),                                                              \
    (in(q), in(k), in(v), params, inout(out), inout(lse)))                                                             \
  /* Gradients gq, gk, gv (shapes of q, k, v; unit stride along the last axis) from the forward's                      \
     out and lse and the output gradient gout. */                                                                      \
  X(attention_backward, q, (const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,                      \
                            const Tensor& lse, const Tensor& gout, const AttentionParams& params,                      \
                            const Tensor& gq, const Tensor& gk, const Tensor& gv),                                     \
    (in(q), in(k), in(v), in(out), in(lse), in(gout), params, inout(gq), inout(gk), inout(gv)))
#define REMAT_KERNELS(X) REMAT_REQUIRED_KERNELS(X) REMAT_OPTIONAL_KERNELS(X)

// The kernels of a Backend, one per virtual function (for supports() and the fallback).
#define REMAT_KERNEL_ENUMERATOR(name, ...) name,
enum class Kernel : uint8_t { REMAT_KERNELS(REMAT_KERNEL_ENUMERATOR) };
#undef REMAT_KERNEL_ENUMERATOR
#define REMAT_KERNEL_ONE(...) +1
inline constexpr int kKernelCount = 0 REMAT_KERNELS(REMAT_KERNEL_ONE);
#undef REMAT_KERNEL_ONE
const char* kernel_name(Kernel kernel);

// Declares every kernel of the list as an override, inside a class derived from Backend (the
// class declares Backend's device verbs itself):
//   class MyBackend final : public remat::Backend {
//    public:
//     remat::DeviceType device_type() const override;
//     remat::memory::Allocator& allocator() override;
//     void set_num_threads(int threads) override;
//     int num_threads() const override;
//     void copy_from_host(const void* host, const remat::Tensor& dst) override;
//     void copy_to_host(const remat::Tensor& src, void* host) override;
//     REMAT_OVERRIDE_KERNELS()   // void copy(const Tensor& src, const Tensor& dst) override; ...
//   };
// A kernel added to the list is then declared by every backend that uses this, and the build
// fails until each of them defines it.
#define REMAT_KERNEL_OVERRIDE(name, dtype_of, parameters, arguments) void name parameters override;
#define REMAT_OVERRIDE_KERNELS() REMAT_KERNELS(REMAT_KERNEL_OVERRIDE)

// A point in a device's stream of work (Backend::mark_time), for timing work without waiting for
// it: the host's clock when the mark was made, and the backend's own record of the point (a CUDA
// event) where the device runs asynchronously.
struct TimeMark {
  double host_seconds = 0;
  std::shared_ptr<void> event;
};

// What a device was asked to do since it was registered (device_activity()); differences over a
// training step count its launches and the times the host waited for the device.
struct DeviceActivity {
  uint64_t kernel_calls = 0;           // calls of the kernel list below (counted by the dispatcher)
  uint64_t launches = 0;               // device launches they made: kernels, library calls, memsets
  uint64_t host_synchronizations = 0;  // the host waited for the device (a copy to the host, a clock
                                       // read, a deferred check read, synchronize())
  uint64_t copies_to_host = 0, copies_from_host = 0;  // each copy, synchronous or asynchronous
  uint64_t async_copies = 0;           // of those, copies that ran behind the device's work
  uint64_t device_waits = 0;           // the device's work waited for a copy (wait_on_device), not the host
  uint64_t deferred_checks = 0;        // validations recorded on the device, read at a later wait
  std::array<uint64_t, kKernelCount> calls_by_kernel{};  // kernel_calls per Kernel (by its enumerator)
};

// An asynchronous copy between host memory and a device (Backend::copy_to_host_async,
// copy_from_host_async): the backend's record of the copy's end (a CUDA event on its copy
// stream). An empty ticket is a copy that was complete when the call returned.
struct CopyTicket {
  std::shared_ptr<void> event;
  bool pending() const { return event != nullptr; }
};

// ---- backend options
// What a device's backend does besides computing its kernels, as a value: chosen with the device
// (remat::use_device in remat/devices.h), held by the backend for the life of the process and
// named in a run's report (remat::describe_backend_options). Every option is off by default; off
// is the path the last device check passed. An option that has not passed a device check runs
// only where it is asked for: the command line's --backend-options, or REMAT_BACKEND_OPTIONS,
// read once as the defaults (remat::default_backend_options). Nothing else reads the environment
// and no process-wide switch changes what a backend does. Only the CUDA backend has options today
// (the test device takes async and sixteen_bit too); the CPU's value is all off.
struct BackendOptions {
  // No host wait inside a step: region time marks are device events read after the step, index
  // checks whose range the host does not know are read at the next wait, uploads return at once.
  bool async = false;
  // Device memory from the driver's stream-ordered pool (cudaMallocAsync) on the backend's stream.
  bool stream_ordered_allocator = false;
  // Offloaded device values copied on a second stream, behind the kernels.
  bool copy_stream = false;
  // bf16 and f16 tensors on the device (Backend::holds), with the backend's 16-bit kernels.
  bool sixteen_bit = false;
  // float32 matrix products and convolutions on TF32 tensor cores (about 10 bits of mantissa).
  bool tf32 = false;
  // Every launch timed with device events (remat::take_kernel_profile).
  bool profile = false;
  bool operator==(const BackendOptions&) const = default;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceType device_type() const = 0;
  virtual memory::Allocator& allocator() = 0;
  virtual void set_num_threads(int threads) = 0;
  virtual int num_threads() const = 0;

  // ---- device verbs: what an accelerator needs and the CPU implements trivially
  // Bytes between host memory and a contiguous tensor `dst` (`src`) of this backend's device:
  // dst.nbytes() bytes are read from `host` (written to `host`). The host pointer is ordinary
  // memory; the copy is complete when the call returns.
  virtual void copy_from_host(const void* host, const Tensor& dst) = 0;
  virtual void copy_to_host(const Tensor& src, void* host) = 0;
  // Returns once every kernel issued to the device has finished (the CPU's kernels are synchronous).
  // A device that defers checks (raise_deferred_errors) raises a failed one here too.
  virtual void synchronize() {}
  // Marks the current end of the device's work. seconds_between(from, to) is the device time
  // between two marks; it waits until the work before `to` is done (time_ready says whether it
  // is), so marks are read after the step's own wait, when waiting costs nothing. The CPU's
  // kernels are synchronous: its marks are the host clock.
  virtual TimeMark mark_time();
  virtual bool time_ready(const TimeMark& mark) {
    (void)mark;
    return true;
  }
  virtual double seconds_between(const TimeMark& from, const TimeMark& to) { return to.host_seconds - from.host_seconds; }
  // Deferred checks. A kernel of an asynchronous device that validates what it reads on the device
  // (an id against its table, a target against its classes) may record the verdict there instead
  // of reading it back at once; the verdict is read at the next wait for the device (synchronize,
  // a copy to the host) or here, which waits only when a check was recorded since the last wait,
  // and a failure is raised as the remat::Error the kernel would have thrown. The engine calls it
  // before a backward pass commits gradients, so bad input leaves every .grad() as it was. The
  // CPU's kernels throw at once and record nothing.
  virtual void raise_deferred_errors() {}
  // Copies that run behind the device's work (offload's device values: Note [offload of device
  // values] in src/saved/offload_device.cpp). host_buffer(dtype, numel) is a contiguous host tensor (on
  // kCpu, counted by the CPU's allocator) that these copies may use directly: pinned memory on
  // CUDA. copy_to_host_async(src, host) starts copying the contiguous device tensor `src` into
  // `host` (src's dtype and numel, from host_buffer) after the work issued so far;
  // copy_from_host_async(host, dst) starts copying the contiguous host tensor `host` into the
  // contiguous device tensor `dst`. The backend keeps both tensors alive until the copy is done, so
  // the caller may drop them at once: a device block is never reused before the copy has read it.
  // copy_done(ticket) says whether the copy is over without waiting; wait_copy(ticket) waits for
  // it on the host; wait_on_device(ticket) makes the device's later work wait for it (a stream
  // wait: the host does not wait). A copy that failed raises its remat::Error from copy_done,
  // wait_copy or wait_on_device, once; its tensors are as they were (dst's contents undefined).
  // The defaults copy at once (copy_to_host / copy_from_host) and return an empty ticket.
  virtual Tensor host_buffer(DType dtype, int64_t numel);
  virtual CopyTicket copy_to_host_async(const Tensor& src, const Tensor& host);
  virtual CopyTicket copy_from_host_async(const Tensor& host, const Tensor& dst);
  virtual bool copy_done(const CopyTicket& ticket) { return !ticket.pending(); }
  virtual void wait_copy(const CopyTicket& ticket) { (void)ticket; }
  virtual void wait_on_device(const CopyTicket& ticket) { (void)ticket; }
  // This backend's counts (DeviceActivity); the dispatcher adds the kernel calls.
  virtual DeviceActivity activity() const { return {}; }
  // Whether this backend implements `kernel` for tensors of `dtype` (the dtype of the kernel's
  // first floating operand, or i64 for index kernels). What it does not support runs on the CPU.
  // copy, fill and the device verbs must always be supported.
  virtual bool supports(Kernel kernel, DType dtype) const {
    (void)kernel;
    (void)dtype;
    return true;
  }
  // Whether tensors of `dtype` may live on this backend's device at all (its copy and fill take
  // them). f32, f64 and i64 by default; a backend whose kernels also take the 16-bit floats (bf16,
  // f16) says so. Allocating a tensor of a dtype its device does not hold is a remat::Error naming
  // why_not_held(dtype): why not, and what would change it.
  virtual bool holds(DType dtype) const { return !is_16bit_float(dtype); }
  virtual std::string why_not_held(DType dtype) const;
  // The options this backend runs with (BackendOptions): all off for a backend that has none.
  virtual const BackendOptions& options() const;

  // ---- the kernels: REMAT_KERNELS above, each with its contract
#define REMAT_KERNEL_PURE_VIRTUAL(name, dtype_of, parameters, arguments) virtual void name parameters = 0;
  REMAT_KERNELS(REMAT_KERNEL_PURE_VIRTUAL)
#undef REMAT_KERNEL_PURE_VIRTUAL
};

// The backend of a device (src/tensor/registry.cpp): the CPU backend, or the dispatcher around a
// registered one (see the top of this file). A device with no registered backend is a remat::Error.
Backend& backend(Device device);
Backend& cpu_backend();
// Registers (or, with nullptr, removes) the backend of `device`; the caller keeps it alive while
// registered. The CPU's cannot be replaced. Not thread-safe against concurrent kernel calls.
void register_backend(Device device, Backend* backend);
bool has_backend(Device device);
// The allocator counters of one device (remat::memory::stats() is the CPU's).
memory::Stats memory_stats(Device device);
void reset_peaks(Device device);
// Calls this many kernels ran on the CPU in place of a registered backend (since the start).
uint64_t fallback_calls(Device device);
// What the device was asked to do since it was registered (all zeros on the CPU).
DeviceActivity device_activity(Device device);
// Backend::raise_deferred_errors on every registered device.
void raise_deferred_errors();

// Copies src into dst (same shape, any dtypes) where the two are on different devices: through
// copy_to_host / copy_from_host, staging strided layouts on the device they live on.
void copy_between_devices(const Tensor& src, const Tensor& dst);

// Threads used by CPU kernels (OpenMP and the GEMM library). Default: all cores.
// Results can depend on the count: oneDNN's float32 GEMM splits the reduction over threads for
// some shapes (small M and N with a long K, e.g. 8 x 8 x 65536 or 64 x 64 x 64), so its last bits
// differ between 1 and 2 threads. remat's own kernels are written not to depend on it (tests
// check the row kernels, attention, convolution, dropout and offload's core yield). Checkpointing is
// unaffected (a recomputation runs at the same count), but runs compared bitwise should use the
// same count.
void set_num_threads(int threads);
int num_threads();

namespace detail {
// While yield_core(true) holds on the calling thread, its parallel CPU kernels run on one thread
// fewer than num_threads() (at least one), leaving a core to a helper thread (offload's I/O
// worker) on a machine with no core to spare, so that the helper does not preempt one thread of
// a parallel region and stall the whole region at its barrier. Only kernels whose results do not
// depend on the thread count yield: GEMM and oneDNN convolutions, whose results do, keep
// num_threads(). Returns the previous setting.
bool yield_core(bool on);
// Whether the process may run on fewer cores than num_threads() plus one helper thread.
bool no_spare_core();
}  // namespace detail

}  // namespace remat
