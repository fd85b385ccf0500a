// The CUDA kernels that have not passed a device check: each a function with the contract of the
// kernel-list row it would serve (include/remat/backend.h), taking the backend whose stream it
// runs on. The library never calls them; the candidate harness (candidates/cuda_candidates.cpp)
// checks each against the library's kernel for the row and times both. One file per candidate.
//
//   remat::cuda::CudaBackend& be = ...;            // the backend of cuda:0
//   if (!remat::candidates::cuda::unary_flat(be, UnaryOp::gelu, x, y, 0.0))
//     be.unary(UnaryOp::gelu, x, y, 0.0);         // the operands do not qualify: the library's kernel
//
// A function returning bool says whether it took the problem (false: nothing was launched, the
// row's library kernel serves it). Promoting a candidate (docs/backends.md, "Candidates") moves its
// code into src/tensor/cuda/ as the row's one kernel and deletes the kernel it replaces.
#pragma once

#include <vector>

#include "remat/backend.h"
#include "tensor/cuda/cuda_internal.h"

namespace remat::candidates::cuda {

using remat::cuda::CudaBackend;

// attention_tc.cu: attention forward and backward on tensor cores (float32 as 3xTF32 products,
// bf16 and f16 as one 16-bit product), equal head sizes 32 and 64, compute capability 8.0 or above.
bool attention_tc(CudaBackend& be, const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params,
                  const Tensor& out, const Tensor& lse);
bool attention_backward_tc(CudaBackend& be, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                           const Tensor& lse, const Tensor& gout, const AttentionParams& params, const Tensor& gq,
                           const Tensor& gk, const Tensor& gv);

// elementwise.cu: contiguous, 16-byte-aligned float32 and float64 operands under 2^31 elements.
bool unary_flat(CudaBackend& be, UnaryOp op, const Tensor& x, const Tensor& y, double scalar);
bool unary_backward_flat(CudaBackend& be, UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& gy,
                         const Tensor& gx, double scalar);
bool binary_flat(CudaBackend& be, BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);

// norm_backward.cu: layer- and RMS-norm backward in one pass over x and gy (mean undefined for RMS
// norm), rows of at most 2048 columns with gx defined.
bool norm_backward_one_pass(CudaBackend& be, const Tensor& x, const Tensor& weight, const Tensor& mean,
                            const Tensor& rstd, const Tensor& gy, const Tensor& gx, const Tensor& gweight,
                            const Tensor& gbias);
// residual_norm.cu: the add_layer_norm row (forward) and its backward as one kernel each way, rows of
// at most 2048 columns, float32 and float64.
bool add_layer_norm_fused(CudaBackend& be, const Tensor& x, const Tensor& r, const Tensor& weight, const Tensor& bias,
                          double eps, const Tensor& s, const Tensor& y, const Tensor& mean, const Tensor& rstd);
bool add_layer_norm_backward_fused(CudaBackend& be, const Tensor& s, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd, const Tensor& gy, const Tensor& gs, const Tensor& gx,
                                   const Tensor& gweight, const Tensor& gbias);

// digest.cu: the recomputation check's digest of x's bytes (the digest row; the library's CUDA
// backend has none, so values on a GPU are not digested).
void digest(CudaBackend& be, const Tensor& x, const Tensor& out);

// gemm_epilogue.cpp: gemm_bias as one cuBLASLt call with the bias epilogue (false: no algorithm).
bool gemm_bias_epilogue(CudaBackend& be, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                        const Tensor& bias, const Tensor& c);

// bias_grad.cu: out[c] = the sum (mean) of column c of the contiguous [rows, cols] x, in slices of
// 512 rows with 16-byte loads (a reduce over the leading axes; false when the shape does not fit).
bool column_sums_sliced(CudaBackend& be, const Tensor& x, bool mean, const Tensor& out);

// cross_entropy.cu: the [N] form fused (the row read twice, online maximum and sum, lse written,
// nothing [N, C]) and its backward, a block per row (the kernel-list contract of cross_entropy).
void cross_entropy_online(CudaBackend& be, const Tensor& logits, const Tensor& targets, double label_smoothing,
                          int64_t ignore_index, const Tensor& losses, const Tensor& lse, const Tensor& scale);
void cross_entropy_backward_rows(CudaBackend& be, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                                 const Tensor& gloss, double label_smoothing, int64_t ignore_index,
                                 const Tensor& glogits);

// optimizer.cu: many parameters' updates in few launches (up to 24 parameters of one dtype each).
struct SgdUpdate {
  Tensor param, grad, momentum;
};
struct AdamWUpdate {
  Tensor param, grad, exp_avg, exp_avg_sq;
};
void sgd_steps(CudaBackend& be, const std::vector<SgdUpdate>& updates, const SgdStep& step);
void adamw_steps(CudaBackend& be, const std::vector<AdamWUpdate>& updates, const AdamWStep& step);

// grad_norm.cu: sum_squares in two launches for up to 256 contiguous tensors of one dtype (the
// float64 sum of every square: not the row's bits, a stated tolerance), scale_each in one.
bool sum_squares_gathered(CudaBackend& be, const TensorList& tensors, const Tensor& out);
bool scale_each_gathered(CudaBackend& be, const TensorList& tensors, double scale);

}  // namespace remat::candidates::cuda
