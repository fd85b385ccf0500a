// CPU reductions over chosen axes. The input is viewed as [outer, reduced] (reduced axes last)
// or [reduced, inner] (reduced axes first); any other layout is first copied into the
// [outer, reduced] order. Sums of f32 accumulate in f64.
#include <cmath>
#include <limits>
#include <numeric>

#include "tensor/cpu/cpu_backend.h"

namespace remat::cpu {

namespace {

template <class T>
void reduce_rows(ReduceOp op, const T* x, int64_t outer, int64_t n, void* out_raw) {
  auto body = [&](int64_t r) {
    const T* row = x + r * n;
    if (op == ReduceOp::sum || op == ReduceOp::mean) {
      Acc<T> acc = 0;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < n; ++i) acc += row[i];
      if (op == ReduceOp::mean) acc /= static_cast<Acc<T>>(n);
      static_cast<T*>(out_raw)[r] = static_cast<T>(acc);
    } else {
      T best = -std::numeric_limits<T>::infinity();
      int64_t arg = 0;
      for (int64_t i = 0; i < n; ++i)
        if (row[i] > best || (std::isnan(row[i]) && !std::isnan(best))) best = row[i], arg = i;
      if (op == ReduceOp::max)
        static_cast<T*>(out_raw)[r] = best;
      else
        static_cast<int64_t*>(out_raw)[r] = arg;
    }
  };
  if (outer * n >= kParallelThreshold && outer > 1) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < outer; ++r) body(r);
  } else {
    for (int64_t r = 0; r < outer; ++r) body(r);
  }
}

template <class T>
void reduce_columns(ReduceOp op, const T* x, int64_t n, int64_t inner, void* out_raw) {
  // out[j] = reduce_i x[i, j]; parallel over blocks of j, i in order (deterministic).
  constexpr int64_t kBlock = 256;
  int64_t blocks = (inner + kBlock - 1) / kBlock;
  auto body = [&](int64_t blk) {
    int64_t j0 = blk * kBlock, j1 = std::min(inner, j0 + kBlock);
    if (op == ReduceOp::sum || op == ReduceOp::mean) {
      Acc<T> acc[kBlock] = {};
      for (int64_t i = 0; i < n; ++i) {
        const T* row = x + i * inner;
#pragma omp simd
        for (int64_t j = j0; j < j1; ++j) acc[j - j0] += row[j];
      }
      T* out = static_cast<T*>(out_raw);
      for (int64_t j = j0; j < j1; ++j)
        out[j] = static_cast<T>(op == ReduceOp::mean ? acc[j - j0] / static_cast<Acc<T>>(n) : acc[j - j0]);
    } else {
      T best[kBlock];
      int64_t arg[kBlock] = {};
      for (int64_t j = j0; j < j1; ++j) best[j - j0] = -std::numeric_limits<T>::infinity();
      for (int64_t i = 0; i < n; ++i) {
        const T* row = x + i * inner;
        for (int64_t j = j0; j < j1; ++j)
          if (row[j] > best[j - j0] || (std::isnan(row[j]) && !std::isnan(best[j - j0])))
            best[j - j0] = row[j], arg[j - j0] = i;
      }
      for (int64_t j = j0; j < j1; ++j) {
        if (op == ReduceOp::max)
          static_cast<T*>(out_raw)[j] = best[j - j0];
        else
          static_cast<int64_t*>(out_raw)[j] = arg[j - j0];
      }
    }
  };
  if (n * inner >= kParallelThreshold && blocks > 1) {
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) body(b);
  } else {
    for (int64_t b = 0; b < blocks; ++b) body(b);
  }
}

}  // namespace

void CpuKernels::reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out) {
  REMAT_ASSERT(out.is_contiguous());
  const int64_t rank = x.dim();
  std::vector<bool> reduced(static_cast<size_t>(rank), false);
  for (auto a : axes) reduced[static_cast<size_t>(a)] = true;
  int64_t n = 1;
  for (auto a : axes) n *= x.shape()[a];
  int64_t rest = x.numel() / std::max<int64_t>(n, 1);
  if (x.numel() == 0) {
    REMAT_CHECK(op == ReduceOp::sum || op == ReduceOp::mean || out.numel() == 0, "max/argmax of an empty tensor");
    fill(out, op == ReduceOp::mean ? std::nan("") : 0.0);
    return;
  }
  // Is x already [kept..., reduced...] or [reduced..., kept...] in contiguous order?
  bool trailing = true, leading = true;
  {
    bool seen_reduced = false, seen_kept = false;
    for (int64_t i = 0; i < rank; ++i) {
      if (reduced[i]) seen_reduced = true;
      else if (seen_reduced) trailing = false;
      if (!reduced[i]) seen_kept = true;
      else if (seen_kept) leading = false;
    }
  }
  Tensor src = x;
  bool columns = false;
  if (x.is_contiguous() && leading && !trailing) {
    columns = true;
  } else if (!(x.is_contiguous() && trailing)) {
    // permute to [kept..., reduced...] and copy
    std::vector<int64_t> order;
    for (int64_t i = 0; i < rank; ++i)
      if (!reduced[i]) order.push_back(i);
    for (int64_t i = 0; i < rank; ++i)
      if (reduced[i]) order.push_back(i);
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = x.storage();
    impl->offset = x.offset();
    impl->dtype = x.dtype();
    for (auto o : order) {
      impl->shape.push_back(x.shape()[o]);
      impl->strides.push_back(x.strides()[o]);
    }
    Tensor permuted(impl);
    src = Tensor::empty(permuted.shape(), x.dtype(), memory::Tag::other, x.device());
    copy(permuted, src);
  }
  dispatch_float(x.dtype(), "reduce", [&]<class scalar_t>() {
    const scalar_t* xd = src.data<scalar_t>();
    if (columns)
      reduce_columns<scalar_t>(op, xd, n, rest, out.raw_data());
    else
      reduce_rows<scalar_t>(op, xd, rest, n, out.raw_data());
  });
}

}  // namespace remat::cpu
