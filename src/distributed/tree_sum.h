// Internal: the fixed order in which a step's micro-batch gradients are added, whatever the number
// of ranks (Note [the micro-batch tree] in data_parallel.cpp).
//
//   TreeStack<Tensor> stack;                              // one rank's micro-batches, in order
//   for (int64_t i = begin; i < end; ++i) stack.push({i, 1}, gradient(i), add);
//   std::vector<Block> pieces = stack.blocks();           // == blocks_of(begin, end)
//   Tensor total = stack.fold(add);                       // one rank: the step's sum
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "remat/error.h"

namespace remat::distributed::internal {

// Micro-batches [begin, begin + size) of a step, by global index: a node of the tree when size is
// a power of two and begin a multiple of it.
struct Block {
  int64_t begin = 0, size = 1;
  bool operator==(const Block&) const = default;
};

// Two neighbours that are the two halves of one node: they are added (left + right) into it.
inline bool siblings(const Block& left, const Block& right) {
  return left.size == right.size && left.begin % (2 * left.size) == 0 && left.begin + left.size == right.begin;
}

// The nodes [begin, end) splits into: the largest aligned power-of-two block at each position.
inline std::vector<Block> blocks_of(int64_t begin, int64_t end) {
  std::vector<Block> out;
  while (begin < end) {
    int64_t size = 1;
    while (begin % (2 * size) == 0 && begin + 2 * size <= end) size *= 2;
    out.push_back({begin, size});
    begin += size;
  }
  return out;
}

// A binary counter of partial sums: push the values of consecutive blocks in order; two siblings
// on top are added into their parent at once. fold() adds what is left, the largest block first:
// ((b0 + b1) + b2) + ... The result depends only on the blocks' range, not on how the leaves were
// grouped into the blocks pushed (each pushed block must be a node: pushing its leaves one by one
// would have built it).
template <class T>
class TreeStack {
 public:
  template <class Add>  // add(left, right): left = left + right
  void push(Block block, T value, Add&& add) {
    REMAT_ASSERT(entries_.empty() || entries_.back().first.begin + entries_.back().first.size == block.begin,
                 "micro-batch blocks pushed out of order");
    entries_.emplace_back(block, std::move(value));
    while (entries_.size() >= 2 && siblings(entries_[entries_.size() - 2].first, entries_.back().first)) {
      auto right = std::move(entries_.back());
      entries_.pop_back();
      auto& left = entries_.back();
      add(left.second, right.second);
      left.first.size *= 2;
    }
  }
  template <class Add>
  T fold(Add&& add) {
    REMAT_ASSERT(!entries_.empty(), "a sum of no micro-batches");
    T total = std::move(entries_.front().second);
    for (size_t i = 1; i < entries_.size(); ++i) add(total, entries_[i].second);
    entries_.clear();
    return total;
  }
  std::vector<Block> blocks() const {
    std::vector<Block> out;
    for (const auto& e : entries_) out.push_back(e.first);
    return out;
  }
  std::vector<T> take_values() {
    std::vector<T> out;
    for (auto& e : entries_) out.push_back(std::move(e.second));
    entries_.clear();
    return out;
  }
  bool empty() const { return entries_.empty(); }

 private:
  std::vector<std::pair<Block, T>> entries_;
};

}  // namespace remat::distributed::internal
