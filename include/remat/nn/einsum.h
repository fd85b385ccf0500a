// remat/nn/einsum.h - Einstein summation over any number of operands, and the Einsum layer.
//
//   Tensor y = remat::nn::einsum("bij,jk->bik", {x, w});              // batched x @ w
//   Tensor s = remat::nn::einsum("bhqd,bhkd->bhqk", {q, k});          // attention scores
//   Tensor t = remat::nn::einsum("ii->", {a});                        // trace
//   Tensor d = remat::nn::einsum("ii->i", {a});                       // diagonal (a view)
//   Tensor z = remat::nn::einsum("...ij,...jk->...ik", {a, b});       // broadcast batch axes
//   Tensor c = remat::nn::einsum("ab,bc,cd,de->ae", {m1, m2, m3, m4});  // contraction order chosen by cost
//   auto layer = std::make_shared<remat::nn::Einsum>("bsi,ijk,kl->bsjl", std::vector<Shape>{{8, 4, 6}, {6, 5}});
//
// Spec. Indices are letters (a-z, A-Z); spaces are ignored; "..." (at most once per term)
// stands for the axes an operand has beyond its letters, aligned from the right across operands
// and broadcast NumPy-style (a size-1 axis stretches). Without "->" the output is the ellipsis
// axes followed by the letters that occur exactly once, alphabetically (as NumPy). A letter must
// have the same size wherever it occurs (letters do not broadcast). An index repeated within one
// operand takes its diagonal ("ii->i"); an index in no output is summed, whether it occurs once
// ("ij->i") or in several operands; ellipsis axes absent from an explicit output are summed too.
// Errors (remat::Error, naming the spec and the offending index or operand): an output index no
// operand has, one repeated in the output, a size mismatch, a rank that does not match a term,
// other characters, operands of different or non-floating dtypes.
//
// Lowering. Per operand, repeated indices become diagonal views (remat::diagonal), broadcast
// size-1 ellipsis axes are dropped, and indices no other operand and not the output has are
// summed. The operands are then contracted pairwise in the order einsum_path() returns: the
// least total FLOPs for up to kEinsumOptimalLimit operands (exhaustive, by dynamic programming,
// as opt_einsum's "optimal"), greedy above (opt_einsum's "greedy"). Each pairwise step groups
// the indices into batch (both operands, still needed), m and n (one operand each, still needed)
// and k (both, summed), lays each operand out as [batch, m, k] / [batch, k, n] (or transposed,
// whichever is already contiguous, so common patterns copy nothing) and runs one batched
// matmul; a step that sums nothing (an outer or elementwise product) is a broadcasting multiply.
// Everything is built from differentiable ops, so the backward pass is automatic.
#pragma once

#include <string>
#include <vector>

#include "remat/nn/module.h"
#include "remat/tensor.h"

namespace remat::nn {

Tensor einsum(const std::string& spec, const TensorList& operands);

// Up to this many operands the contraction order is exactly optimal; above it, greedy; above
// kEinsumGreedyLimit, left to right (the greedy search's work grows as the cube of the count).
inline constexpr int kEinsumOptimalLimit = 8;
inline constexpr int kEinsumGreedyLimit = 64;

// The pairwise contraction order einsum() uses for operands of these shapes (opt_einsum's
// contract_path). Each step removes operands `first` < `second` from the current list and
// appends their product at its end.
struct EinsumStep {
  size_t first = 0, second = 0;
  std::string result;  // the product's indices, e.g. "ik" ("..." axes written as '.')
  double flops = 0;    // 2 x the product of the sizes of both operands' indices
};
struct EinsumPath {
  std::vector<EinsumStep> steps;
  double flops = 0;        // total over the steps
  bool optimal = false;    // exact optimum (false: greedy)
  std::string method;      // "optimal", "greedy" or "sequential"
};
EinsumPath einsum_path(const std::string& spec, const std::vector<Shape>& shapes);

// A layer y = einsum(spec, {x, weights...}): the spec's first term is the input, the others are
// the layer's own parameters, named "weight" when there is one, else "weight0", "weight1", ...
// (their terms may not use "..."). Each weight ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in the product of the sizes
// of its indices that are not in the output (those it sums over), or 1 if none.
//   Einsum("bi,ij->bj", {{4, 3}})   is a Linear(4 -> 3) without bias, with weight [4, 3].
class Einsum : public Module {
 public:
  Einsum(std::string spec, std::vector<Shape> weight_shapes, DType dtype = DType::f32);
  std::string type_name() const override;
  const std::string& spec() const { return spec_; }
  TensorList weights;

 protected:
  Tensor forward_impl(const Tensor& x) override;

 private:
  std::string spec_;
};

}  // namespace remat::nn
