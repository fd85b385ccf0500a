// remat/nn/einsum.h - Einstein summation over one or two operands.
//
//   Tensor y = remat::nn::einsum("bij,jk->bik", {x, w});        // batched x @ w
//   Tensor s = remat::nn::einsum("bhqd,bhkd->bhqk", {q, k});    // attention scores
//   Tensor t = remat::nn::einsum("ij->ji", {a});                // a permutation (a view)
//   Tensor d = remat::nn::einsum("i,i->", {a, b});              // a dot product (rank 0)
//
// Indices are letters (a-z, A-Z); spaces are ignored. Without "->" the output is the indices
// that occur exactly once, in alphabetical order (as NumPy). Every index must have the same size
// wherever it occurs (no broadcasting of size-1 axes). Not supported, with a remat::Error naming
// the spec and the offending index: traces or diagonals (an index repeated within one operand),
// ellipses ("..."), more than two operands, an output index that no operand has, or one repeated
// in the output.
//
// Lowering (two operands): indices of one operand that are neither in the other nor in the
// output are summed away first; the rest are grouped as batch (both operands and output), m
// (first operand and output), n (second operand and output) and contracted k (both operands,
// not the output); each operand is permuted and reshaped to [batch, m, k] / [batch, k, n] (or
// their transposes, whichever is already contiguous, so common patterns copy nothing), one
// batched matmul computes [batch, m, n], which is reshaped and permuted to the output order.
// It is built from differentiable ops, so its backward pass is automatic.
#pragma once

#include <string>

#include "remat/tensor.h"

namespace remat::nn {

Tensor einsum(const std::string& spec, const TensorList& operands);

}  // namespace remat::nn
