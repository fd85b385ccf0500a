// Internal: the contraction order of an einsum over three or more operands (einsum_path.cpp).
// Works on index labels and sizes only (no tensors). Labels are ints: letters by their character
// code, ellipsis axes from kEllipsisLabel up.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace remat::nn::detail {

inline constexpr int kEllipsisLabel = 1000;

using Labels = std::vector<int>;
using LabelSizes = std::map<int, int64_t>;

struct PairStep {
  size_t first = 0, second = 0;  // positions in the current operand list (first < second)
  Labels result;                 // the labels the product keeps (needed later or in the output)
  double flops = 0;              // 2 x the product of the sizes of every label of the two operands
};

// The pairwise contraction order for operands with these (unique) labels: the exact optimum of
// total FLOPs for up to kEinsumOptimalLimit operands (dynamic programming over subsets), the
// greedy rule of opt_einsum above that, left to right above kEinsumGreedyLimit. Each step removes operands `first` and `second` from the
// current list and appends their product at its end; after n - 1 steps one operand is left,
// whose labels are the output's (in some order).
std::vector<PairStep> plan_contraction(const std::vector<Labels>& operands, const Labels& output,
                                       const LabelSizes& sizes, bool& optimal, std::string* method = nullptr);

// FLOPs of contracting operands with labels a and b: 2 x the product of the sizes of a | b.
double pair_flops(const Labels& a, const Labels& b, const LabelSizes& sizes);

std::string label_name(int label);

}  // namespace remat::nn::detail
