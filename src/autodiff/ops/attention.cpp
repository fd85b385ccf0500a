// Fused scaled dot-product attention: out = dropout(softmax(q k^T * scale, causal mask)) @ v in one
// op whose kernel never forms the [Tq, Tk] probabilities (Backend::attention). The backward
// needs q, k, v, the output and the per-row log-sum-exp (an aux output, [..., Tq]): O(B*H*T*D)
// saved bytes instead of the O(B*H*T^2) probabilities an explicit softmax keeps. Dropout keeps
// only its RngState, as dropout() does: the backward regenerates the mask from it.
//
// Layout: the output and the input gradients are allocated as [B, T, H, D] and returned as
// [B, H, T, D] views, so that the usual "heads back to [B, T, H * D]" permute + reshape after
// attention, and the inverse on the gradients, are free.
#include <cmath>
#include <optional>

#include "autodiff/kernels.h"
#include "autodiff/op.h"

namespace remat {

using autodiff::BackwardContext;
using autodiff::OpSpec;

namespace {

const OpSpec kAttention{autodiff::OpKind::scaled_dot_product_attention, autodiff::save_inputs_and_outputs, 1};

struct AttentionShape {
  int64_t tq, tk, d, dv;
  bool rank3;  // [N, T, D] inputs, seen as [1, N, T, D]
};

AttentionShape check_attention(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p,
                               const std::optional<double>& scale) {
  const char* op = "scaled_dot_product_attention";
  REMAT_CHECK(q.defined() && k.defined() && v.defined(), op, ": an input is undefined");
  REMAT_CHECK(is_floating(q.dtype()) && q.dtype() == k.dtype() && q.dtype() == v.dtype(), op,
              ": q, k, v must share a floating dtype, got ", dtype_name(q.dtype()), ", ", dtype_name(k.dtype()), ", ",
              dtype_name(v.dtype()));
  REMAT_CHECK(q.device() == k.device() && q.device() == v.device(), op, ": q, k, v must be on one device");
  REMAT_CHECK((q.dim() == 4 || q.dim() == 3) && k.dim() == q.dim() && v.dim() == q.dim(), op,
              ": expects q [B, H, Tq, D], k [B, H, Tk, D], v [B, H, Tk, Dv] (or without B), got ",
              shape_str(q.shape()), ", ", shape_str(k.shape()), ", ", shape_str(v.shape()));
  const int64_t r = q.dim();
  for (int64_t a = 0; a + 2 < r; ++a)
    REMAT_CHECK(q.size(a) == k.size(a) && q.size(a) == v.size(a), op, ": batch and head axes differ: q ",
                shape_str(q.shape()), ", k ", shape_str(k.shape()), ", v ", shape_str(v.shape()));
  REMAT_CHECK(k.size(-1) == q.size(-1), op, ": q and k have head sizes ", q.size(-1), " and ", k.size(-1), " (q ",
              shape_str(q.shape()), ", k ", shape_str(k.shape()), ")");
  REMAT_CHECK(v.size(-2) == k.size(-2), op, ": k and v have ", k.size(-2), " and ", v.size(-2), " positions (k ",
              shape_str(k.shape()), ", v ", shape_str(v.shape()), ")");
  REMAT_CHECK(q.size(-1) > 0, op, ": head size 0 (q of shape ", shape_str(q.shape()), ")");
  REMAT_CHECK(k.size(-2) > 0 || q.size(-2) == 0 || q.numel() == 0, op, ": no keys for ", q.size(-2),
              " queries (k of shape ", shape_str(k.shape()), ")");
  REMAT_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0, op, ": dropout probability ", dropout_p,
              " is outside [0, 1] (q of shape ", shape_str(q.shape()), ")");
  if (scale) REMAT_CHECK(std::isfinite(*scale), op, ": scale ", *scale, " is not finite");
  return {q.size(-2), k.size(-2), q.size(-1), v.size(-1), r == 3};
}

// A [B, H, T, X] tensor stored as [B, T, H, X].
Tensor heads_view_buffer(const Shape& shape, DType dtype, Device device) {
  Tensor buffer = kernels::empty({shape[0], shape[2], shape[1], shape[3]}, dtype, device);
  return buffer.detach().permute({0, 2, 1, 3});
}

// Views a [N, T, X] tensor as [1, N, T, X] (no copy).
Tensor as4(const Tensor& t, bool rank3) { return rank3 ? t.detach().unsqueeze(0) : t.detach(); }
Tensor as_input_rank(const Tensor& t, bool rank3) { return rank3 ? t.squeeze(0) : t; }

// Pairs (query, key) that are computed, for the flop count.
double attended_pairs(const AttentionShape& s, bool causal) {
  if (!causal) return static_cast<double>(s.tq) * static_cast<double>(s.tk);
  double pairs = 0;
  const int64_t full = std::min(s.tq, s.tk);  // rows 0..full-1 see i + 1 keys, later rows all tk
  pairs += static_cast<double>(full) * static_cast<double>(full + 1) / 2.0;
  pairs += static_cast<double>(s.tq - full) * static_cast<double>(s.tk);
  return pairs;
}

Tensor attention_op(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double dropout_p,
                    std::optional<RngState> state, const std::optional<double>& scale_in) {
  const AttentionShape s = check_attention(q, k, v, dropout_p, scale_in);
  AttentionParams params;
  params.causal = causal;
  params.scale = scale_in ? *scale_in : 1.0 / std::sqrt(static_cast<double>(s.d));
  params.dropout_p = state ? dropout_p : 0.0;
  if (state) params.dropout_state = *state;
  const bool rank3 = s.rank3;
  double batch_heads = 1;
  for (int64_t a = 0; a + 2 < q.dim(); ++a) batch_heads *= static_cast<double>(q.size(a));
  const double flops = 2.0 * batch_heads * attended_pairs(s, causal) * static_cast<double>(s.d + s.dv);

  return autodiff::apply(
      kAttention, {q, k, v},
      [params, rank3](const TensorList& in) {
        Tensor q4 = as4(in[0], rank3), k4 = as4(in[1], rank3), v4 = as4(in[2], rank3);
        Shape out_shape = q4.shape();
        out_shape[3] = v4.size(3);
        Tensor out = heads_view_buffer(out_shape, q4.dtype(), q4.device());
        Tensor lse = kernels::empty({q4.size(0), q4.size(1), q4.size(2)}, accumulate_dtype(q4.dtype()), q4.device());
        kernels::backend_of(q4).attention(q4, k4, v4, params, out, lse);
        return TensorList{as_input_rank(out, rank3), lse};
      },
      [params, rank3](BackwardContext& ctx) {
        Tensor q4 = as4(ctx.input(0), rank3), k4 = as4(ctx.input(1), rank3), v4 = as4(ctx.input(2), rank3);
        Tensor out = as4(ctx.output(0), rank3), lse = ctx.output(1);
        Tensor gout = as4(ctx.grad_output(0), rank3);
        Tensor gq = heads_view_buffer(q4.shape(), q4.dtype(), q4.device());
        Tensor gk = heads_view_buffer(k4.shape(), k4.dtype(), k4.device());
        Tensor gv = heads_view_buffer(v4.shape(), v4.dtype(), v4.device());
        kernels::backend_of(q4).attention_backward(q4, k4, v4, out, lse, gout, params, gq, gk, gv);
        ctx.set_input_grad(0, as_input_rank(gq, rank3));
        ctx.set_input_grad(1, as_input_rank(gk, rank3));
        ctx.set_input_grad(2, as_input_rank(gv, rank3));
      },
      flops)[0];
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double dropout_p,
                                    bool training, std::optional<double> scale) {
  check_attention(q, k, v, dropout_p, scale);
  if (!training || dropout_p == 0.0) return attention_op(q, k, v, causal, 0.0, std::nullopt, scale);
  // one word per (b, h, query, key), as dropout() on the probabilities would claim
  uint64_t words = 1;
  for (int64_t a = 0; a + 1 < q.dim(); ++a) {
    REMAT_CHECK(!__builtin_mul_overflow(words, static_cast<uint64_t>(q.size(a)), &words),
                "scaled_dot_product_attention: too many attention probabilities for q ", shape_str(q.shape()));
  }
  REMAT_CHECK(!__builtin_mul_overflow(words, static_cast<uint64_t>(k.size(-2)), &words),
              "scaled_dot_product_attention: too many attention probabilities for q ", shape_str(q.shape()), " and k ",
              shape_str(k.shape()));
  return attention_op(q, k, v, causal, dropout_p, rng_reserve(words), scale);
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double dropout_p,
                                    RngState state, std::optional<double> scale) {
  return attention_op(q, k, v, causal, dropout_p, dropout_p > 0.0 ? std::optional<RngState>(state) : std::nullopt,
                      scale);
}

}  // namespace remat
