// The contraction order of a multi-operand einsum (see einsum_path.h).
//
// Cost model (as opt_einsum's): contracting two operands costs 2 x the product of the sizes of
// all their labels (one multiply-add per combination; the labels summed by the product appear in
// both), and the product keeps the labels that a remaining operand or the output still needs.
// Up to kEinsumOptimalLimit operands the order of least total cost is found exactly by dynamic
// programming over subsets (each subset's best split into two; 3^n work, 6561 splits for 8);
// above that, greedily: repeatedly contract the pair whose product removes the most elements
// (size(product) - size(a) - size(b) smallest), ties broken by fewer FLOPs, then by position.
// Above kEinsumGreedyLimit operands the greedy search (cubic in the count) gives way to a left to
// right order, linear; EinsumPath::method says which was used.
#include "nn/einsum_path.h"

#include <algorithm>
#include <limits>
#include <map>

#include "remat/nn/einsum.h"

namespace remat::nn::detail {

namespace {

bool contains(const Labels& labels, int l) { return std::find(labels.begin(), labels.end(), l) != labels.end(); }

double elements(const Labels& labels, const LabelSizes& sizes) {
  double n = 1;
  for (int l : labels) n *= static_cast<double>(sizes.at(l));
  return n;
}

Labels union_of(const Labels& a, const Labels& b) {
  Labels u = a;
  for (int l : b)
    if (!contains(u, l)) u.push_back(l);
  return u;
}

// The labels of `merged` that the output or any operand k with !inside(k) needs.
template <class Inside>
Labels kept_labels(const Labels& merged, Inside&& inside, const std::vector<Labels>& operands, const Labels& output) {
  Labels kept;
  for (int l : merged) {
    bool needed = contains(output, l);
    for (size_t k = 0; k < operands.size() && !needed; ++k)
      if (!inside(k) && contains(operands[k], l)) needed = true;
    if (needed) kept.push_back(l);
  }
  return kept;
}

std::vector<PairStep> optimal_order(const std::vector<Labels>& operands, const Labels& output,
                                    const LabelSizes& sizes) {
  const size_t n = operands.size();
  const uint32_t all = (1u << n) - 1;
  std::vector<Labels> labels(all + 1);
  std::vector<double> cost(all + 1, std::numeric_limits<double>::infinity());
  std::vector<uint32_t> split(all + 1, 0);
  for (uint32_t mask = 1; mask <= all; ++mask) {
    Labels merged;
    for (size_t k = 0; k < n; ++k)
      if (mask >> k & 1u) merged = union_of(merged, operands[k]);
    labels[mask] = kept_labels(merged, [mask](size_t k) { return (mask >> k & 1u) != 0; }, operands, output);
  }
  for (size_t k = 0; k < n; ++k) {
    cost[1u << k] = 0;
    labels[1u << k] = operands[k];  // an original operand keeps all its labels until contracted
  }
  // masks in increasing order: every proper submask comes first
  for (uint32_t mask = 1; mask <= all; ++mask) {
    if ((mask & (mask - 1)) == 0) continue;
    const uint32_t low = mask & (~mask + 1);
    for (uint32_t a = (mask - 1) & mask; a > 0; a = (a - 1) & mask) {
      if (!(a & low)) continue;  // each split once: the part holding the lowest operand
      const uint32_t b = mask ^ a;
      const double c = cost[a] + cost[b] + pair_flops(labels[a], labels[b], sizes);
      if (c < cost[mask]) {
        cost[mask] = c;
        split[mask] = a;
      }
    }
  }
  // post-order walk of the best tree, simulating the operand list
  std::vector<uint32_t> list;
  for (size_t k = 0; k < n; ++k) list.push_back(1u << k);
  std::vector<PairStep> steps;
  auto emit = [&](auto&& self, uint32_t mask) -> void {
    if ((mask & (mask - 1)) == 0) return;
    const uint32_t a = split[mask], b = mask ^ a;
    self(self, a);
    self(self, b);
    size_t i = static_cast<size_t>(std::find(list.begin(), list.end(), a) - list.begin());
    size_t j = static_cast<size_t>(std::find(list.begin(), list.end(), b) - list.begin());
    if (i > j) std::swap(i, j);
    PairStep step{i, j, labels[mask], pair_flops(labels[a], labels[b], sizes)};
    list.erase(list.begin() + static_cast<std::ptrdiff_t>(j));
    list.erase(list.begin() + static_cast<std::ptrdiff_t>(i));
    list.push_back(mask);
    steps.push_back(std::move(step));
  };
  emit(emit, all);
  return steps;
}

std::vector<PairStep> greedy_order(std::vector<Labels> current, const Labels& output, const LabelSizes& sizes) {
  std::vector<PairStep> steps;
  while (current.size() > 1) {
    double best_gain = std::numeric_limits<double>::infinity(), best_flops = best_gain;
    PairStep best;
    for (size_t i = 0; i < current.size(); ++i)
      for (size_t j = i + 1; j < current.size(); ++j) {
        const Labels kept = kept_labels(union_of(current[i], current[j]),
                                        [i, j](size_t k) { return k == i || k == j; }, current, output);
        const double gain =
            elements(kept, sizes) - elements(current[i], sizes) - elements(current[j], sizes);
        const double flops = pair_flops(current[i], current[j], sizes);
        if (gain < best_gain || (gain == best_gain && flops < best_flops)) {
          best_gain = gain;
          best_flops = flops;
          best = {i, j, kept, flops};
        }
      }
    current.erase(current.begin() + static_cast<std::ptrdiff_t>(best.second));
    current.erase(current.begin() + static_cast<std::ptrdiff_t>(best.first));
    current.push_back(best.result);
    steps.push_back(std::move(best));
  }
  return steps;
}

// Left to right: the running product with the next operand (linear work, for many operands).
std::vector<PairStep> sequential_order(const std::vector<Labels>& operands, const Labels& output,
                                       const LabelSizes& sizes) {
  std::map<int, size_t> later;  // label -> how many operands after the running product hold it
  for (const auto& labels : operands)
    for (int l : labels) ++later[l];
  for (int l : operands[0]) --later[l];
  std::vector<PairStep> steps;
  Labels product = operands[0];
  for (size_t k = 1; k < operands.size(); ++k) {
    for (int l : operands[k]) --later[l];
    Labels kept;
    for (int l : union_of(product, operands[k]))
      if (contains(output, l) || later[l] > 0) kept.push_back(l);
    // the current list is [k, ..., n-1, product] (the first step: [0, 1, ...]): pair its ends
    steps.push_back({0, k == 1 ? 1 : operands.size() - k, kept, pair_flops(product, operands[k], sizes)});
    product = std::move(kept);
  }
  return steps;
}

}  // namespace

double pair_flops(const Labels& a, const Labels& b, const LabelSizes& sizes) {
  return 2.0 * elements(union_of(a, b), sizes);
}

std::string label_name(int label) {
  if (label >= kEllipsisLabel) return "... axis " + std::to_string(label - kEllipsisLabel);
  return std::string("'") + static_cast<char>(label) + "'";
}

std::vector<PairStep> plan_contraction(const std::vector<Labels>& operands, const Labels& output,
                                       const LabelSizes& sizes, bool& optimal, std::string* method) {
  optimal = operands.size() <= static_cast<size_t>(kEinsumOptimalLimit);
  const bool greedy = !optimal && operands.size() <= static_cast<size_t>(kEinsumGreedyLimit);
  if (method) *method = optimal ? "optimal" : greedy ? "greedy" : "sequential";
  if (operands.size() < 2) return {};
  if (optimal) return optimal_order(operands, output, sizes);
  if (greedy) return greedy_order(operands, output, sizes);
  return sequential_order(operands, output, sizes);
}

}  // namespace remat::nn::detail
