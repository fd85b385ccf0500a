// CPU indexing kernels: embedding gather and its scatter-add backward, cross entropy (with label
// smoothing and an ignored target value) and dropout.
//
// Reproducibility: the embedding backward gives each table row to exactly one thread, which adds
// the gradient rows of its ids in increasing position order, so the sums do not depend on the
// thread count. Dropout draws element i's keep decision from the i-th word of the Philox stream,
// whatever thread computes it.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/row_ops.h"

namespace remat::cpu {

namespace {

void check_out(const Tensor& t, const char* op) {
  REMAT_ASSERT(t.is_contiguous(), op, ": output of shape ", shape_str(t.shape()), " is not contiguous");
}

// Throws (before any output is written) if an id lies outside [0, rows).
void check_ids(const int64_t* ids, int64_t n, int64_t rows, const char* op) {
  for (int64_t i = 0; i < n; ++i)
    REMAT_CHECK(ids[i] >= 0 && ids[i] < rows, op, ": id ", ids[i], " at position ", i,
                " is out of range for a table of ", rows, " rows");
}

// Throws unless every target is ignore_index or a class; returns the number of targets that are not ignored.
int64_t check_targets(const int64_t* targets, int64_t n, int64_t classes, int64_t ignore_index, const char* op) {
  int64_t counted = 0;
  for (int64_t r = 0; r < n; ++r) {
    int64_t t = targets[r];
    REMAT_CHECK(t == ignore_index || (t >= 0 && t < classes), op, ": target ", t, " at row ", r,
                " is out of range for ", classes, " classes (logits of shape [", n, ", ", classes, "], ignore_index ",
                ignore_index, ")");
    counted += t != ignore_index;
  }
  return counted;
}

// ---- cross entropy
//
// Forward row: the shift lse = logsumexp(x) (max, then the float64 sum of exp(x - max)) rounded to
// the row's dtype; the loss from logp = x - shift at the target and, with label smoothing, the row
// sum of logp. The kept form (Backend::cross_entropy_keeps_log_softmax): lse [N] gets the shift,
// and the smoothing sum reads logp from a scratch row; logp [N, C] gets the row of logp, and the
// sum reads it there (the same sum). Backward row: the softmax exp(x - shift), or exp(logp - 0)
// from the [N, C] form (x - 0 is x, so the same bits), minus the smoothed one-hot target, times the
// row's loss gradient. Hand-vectorised (row_ops.h), compiled per CPU level (cpu_level.h).

template <class T>
struct CrossEntropyArgs {
  const T* x;  // logits, or in the backward of the [N, C] form the log-softmax
  const int64_t* targets;
  double eps;
  int64_t ignore_index;
  T* losses;       // forward
  T* lse;          // forward output, backward input (const there); null in the [N, C] form
  T* logp;         // forward output in the [N, C] form, else null
  const T* gloss;  // backward
  T* glogits;      // backward output
  int64_t cols;
};

template <class T>
REMAT_SIMD_INLINE void cross_entropy_row(const CrossEntropyArgs<T>& a, int64_t r, T* __restrict scratch) {
  using namespace rowops;
  const int64_t cols = a.cols;
  const T* __restrict xr = a.x + r * cols;
  T m = rowops::max(xr, cols);
  if (m == -std::numeric_limits<T>::infinity()) m = T(0);
  const Acc<T> sum = exp_sum<T>(xr, m, nullptr, cols);
  const T shift = static_cast<T>(static_cast<Acc<T>>(m) + std::log(sum));
  if (a.lse) a.lse[r] = shift;
  T* __restrict lr = a.logp ? a.logp + r * cols : scratch;  // the row's logp, if kept or summed
  if (lr)
    map<T>(
        cols, [&](int64_t c) REMAT_ROW_LAMBDA { store(lr + c, load(xr + c) - shift); },
        [&](int64_t c) REMAT_ROW_LAMBDA { lr[c] = xr[c] - shift; });
  const int64_t t = a.targets[r];
  if (t == a.ignore_index) {
    a.losses[r] = T(0);
    return;
  }
  Acc<T> loss = 0;
  if (a.eps < 1.0) loss += static_cast<Acc<T>>(1.0 - a.eps) * -static_cast<Acc<T>>(xr[t] - shift);
  if (a.eps > 0.0)  // mean over classes of -logp
    loss += static_cast<Acc<T>>(a.eps) * -(rowops::sum(lr, cols) / static_cast<Acc<T>>(cols));
  a.losses[r] = static_cast<T>(loss);
}

// glogits = gloss[row] * (exp(x - lse) - ((1 - eps) * onehot(target) + eps / C)); 0 on ignored rows.
template <class T>
REMAT_SIMD_INLINE void cross_entropy_backward_row(const CrossEntropyArgs<T>& a, int64_t r) {
  using namespace rowops;
  const int64_t cols = a.cols;
  const T* __restrict xr = a.x + r * cols;
  T* __restrict out = a.glogits + r * cols;
  const int64_t t = a.targets[r];
  if (t == a.ignore_index) {
    std::fill(out, out + cols, T(0));
    return;
  }
  const T shift = a.lse ? a.lse[r] : T(0);
  const T uniform = static_cast<T>(a.eps / static_cast<double>(cols));
  const T on_target = static_cast<T>(1.0 - a.eps);
  const T g = a.gloss[r];
  map<T>(
      cols, [&](int64_t c) REMAT_ROW_LAMBDA { store(out + c, g * (simd::exp<T>(load(xr + c) - shift) - uniform)); },
      [&](int64_t c) REMAT_ROW_LAMBDA { out[c] = g * (simd::exp_scalar<T>(xr[c] - shift) - uniform); });
  out[t] -= g * on_target;
}

#define REMAT_CE_RANGES(T, suffix)                                                                \
  REMAT_CPU_LEVELS(void, cross_entropy_range_##suffix, (const CrossEntropyArgs<T>& a, int64_t r0, int64_t r1), \
                   (a, r0, r1)) {                                                                 \
    std::vector<T> scratch(a.eps > 0.0 && !a.logp ? static_cast<size_t>(a.cols) : 0);             \
    T* row = scratch.empty() ? nullptr : scratch.data();                                          \
    for (int64_t r = r0; r < r1; ++r) cross_entropy_row<T>(a, r, row);                            \
  }                                                                                               \
  REMAT_CPU_LEVELS(void, cross_entropy_backward_range_##suffix,                                   \
                   (const CrossEntropyArgs<T>& a, int64_t r0, int64_t r1), (a, r0, r1)) {         \
    for (int64_t r = r0; r < r1; ++r) cross_entropy_backward_row<T>(a, r);                       \
  }
REMAT_CE_RANGES(float, f32)
REMAT_CE_RANGES(double, f64)
#undef REMAT_CE_RANGES

// kept: lse [rows] or logp [rows, cols] (the forward's output), as its shape says.
template <class T>
void cross_entropy_rows(const T* x, const int64_t* targets, double eps, int64_t ignore_index, T* losses, T* kept,
                        bool log_softmax, int64_t rows, int64_t cols) {
  T* lse = log_softmax ? nullptr : kept;
  T* logp = log_softmax ? kept : nullptr;
  CrossEntropyArgs<T> a{x, targets, eps, ignore_index, losses, lse, logp, nullptr, nullptr, cols};
  for_row_ranges(rows, cols, [&](int64_t r0, int64_t r1) {
    if constexpr (sizeof(T) == 4) cross_entropy_range_f32(a, r0, r1);
    else cross_entropy_range_f64(a, r0, r1);
  });
}

// x: the logits with lse [rows], or the log-softmax [rows, cols] with lse null.
template <class T>
void cross_entropy_backward_rows(const T* x, const T* lse, const int64_t* targets, const T* gloss, double eps,
                                 int64_t ignore_index, T* glogits, int64_t rows, int64_t cols) {
  CrossEntropyArgs<T> a{x, targets, eps, ignore_index, nullptr, const_cast<T*>(lse), nullptr, gloss, glogits, cols};
  for_row_ranges(rows, cols, [&](int64_t r0, int64_t r1) {
    if constexpr (sizeof(T) == 4) cross_entropy_backward_range_f32(a, r0, r1);
    else cross_entropy_backward_range_f64(a, r0, r1);
  });
}

// ---- dropout

// Element i uses word (state.offset + i) of the stream, i.e. lane (offset + i) % 4 of Philox
// block (offset + i) / 4; each block is generated once and serves up to four elements.
template <class T>
void dropout_kernel(const T* x, T* y, int64_t n, double p, RngState state) {
  const T scale = static_cast<T>(1.0 / (1.0 - p));
  const uint64_t first_word = state.offset;
  const uint64_t first_block = first_word / 4;
  const uint64_t last_block = (first_word + static_cast<uint64_t>(n) - 1) / 4;
  const int64_t blocks = static_cast<int64_t>(last_block - first_block + 1);
  auto body = [&](int64_t b) {
    const uint64_t block = first_block + static_cast<uint64_t>(b);
    const Philox4 words = philox4x32(block, state.seed);
    for (int lane = 0; lane < 4; ++lane) {
      const uint64_t word = block * 4 + static_cast<uint64_t>(lane);
      if (word < first_word) continue;
      const uint64_t i = word - first_word;
      if (i >= static_cast<uint64_t>(n)) break;
      const bool keep = static_cast<double>(uniform_float(words.v[lane])) >= p;
      y[i] = keep ? x[i] * scale : T(0);
    }
  };
  if (n >= kParallelThreshold) {
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) body(b);
  } else {
    for (int64_t b = 0; b < blocks; ++b) body(b);
  }
}

}  // namespace

void CpuKernels::embedding(const Tensor& table_in, const Tensor& ids_in, const Tensor& out) {
  check_out(out, "embedding");
  REMAT_ASSERT(table_in.dim() == 2 && ids_in.dtype() == DType::i64, "embedding: table ", shape_str(table_in.shape()),
               ", ids ", dtype_name(ids_in.dtype()));
  Tensor table = contiguous_input(table_in), ids = contiguous_input(ids_in);
  const int64_t rows = table.size(0), dim = table.size(1), n = ids.numel();
  const int64_t* id = ids.data<int64_t>();
  check_ids(id, n, rows, "embedding");
  if (n == 0 || dim == 0) return;
  dispatch_float(out.dtype(), "embedding", [&]<class T>() {
    const T* src = table.data<T>();
    T* dst = out.data<T>();
    auto body = [&](int64_t i) {
      std::memcpy(dst + i * dim, src + id[i] * dim, static_cast<size_t>(dim) * sizeof(T));
    };
    if (n > 1 && n * dim >= kParallelThreshold) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) body(i);
    } else {
      for (int64_t i = 0; i < n; ++i) body(i);
    }
  });
}

void CpuKernels::embedding_backward(const Tensor& ids_in, const Tensor& gout_in, const Tensor& gtable) {
  check_out(gtable, "embedding_backward");
  REMAT_ASSERT(gtable.dim() == 2 && ids_in.dtype() == DType::i64, "embedding_backward: gtable ",
               shape_str(gtable.shape()), ", ids ", dtype_name(ids_in.dtype()));
  Tensor ids = contiguous_input(ids_in), gout = contiguous_input(gout_in);
  const int64_t rows = gtable.size(0), dim = gtable.size(1), n = ids.numel();
  REMAT_ASSERT(gout.numel() == n * dim, "embedding_backward: gradient of shape ", shape_str(gout.shape()), " for ", n,
               " ids of dimension ", dim);
  const int64_t* id = ids.data<int64_t>();
  check_ids(id, n, rows, "embedding_backward");
  if (n == 0 || dim == 0) return;
  dispatch_float(gtable.dtype(), "embedding_backward", [&]<class T>() {
    const T* g = gout.data<T>();
    T* dst = gtable.data<T>();
    // Adds the gradient rows whose id lies in [lo, hi), in position order.
    auto add_range = [&](int64_t lo, int64_t hi) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t v = id[i];
        if (v < lo || v >= hi) continue;
        T* __restrict d = dst + v * dim;
        const T* __restrict s = g + i * dim;
#pragma omp simd
        for (int64_t k = 0; k < dim; ++k) d[k] += s[k];
      }
    };
    if (rows > 1 && n * dim >= kParallelThreshold) {
#pragma omp parallel
      {
        const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
        add_range(rows * t / threads, rows * (t + 1) / threads);
      }
    } else {
      add_range(0, rows);
    }
  });
}

void CpuKernels::cross_entropy(const Tensor& logits_in, const Tensor& targets_in, double label_smoothing,
                               int64_t ignore_index, const Tensor& losses, const Tensor& kept, const Tensor& scale) {
  check_out(losses, "cross_entropy");
  check_out(kept, "cross_entropy");
  check_out(scale, "cross_entropy");
  const bool log_softmax = kept.dim() == 2;
  const bool kept_fits = log_softmax ? kept.shape() == logits_in.shape()
                                     : kept.dim() == 1 && logits_in.dim() == 2 && kept.size(0) == logits_in.size(0);
  REMAT_ASSERT(logits_in.dim() == 2 && targets_in.dtype() == DType::i64 && targets_in.numel() == logits_in.size(0) &&
                   kept_fits && kept.dtype() == logits_in.dtype(),
               "cross_entropy: logits ", shape_str(logits_in.shape()), ", targets ", shape_str(targets_in.shape()),
               ", kept ", dtype_name(kept.dtype()), " ", shape_str(kept.shape()));
  Tensor logits = contiguous_input(logits_in), targets = contiguous_input(targets_in);
  const int64_t rows = logits.size(0), cols = logits.size(1);
  const int64_t* t = targets.data<int64_t>();
  const int64_t counted = check_targets(t, rows, cols, ignore_index, "cross_entropy");
  cpu_backend().fill(scale, counted > 0 ? 1.0 / static_cast<double>(counted) : 0.0);
  if (rows == 0) return;
  dispatch_float(logits.dtype(), "cross_entropy", [&]<class T>() {
    cross_entropy_rows<T>(logits.data<T>(), t, label_smoothing, ignore_index, losses.data<T>(), kept.data<T>(),
                          log_softmax, rows, cols);
  });
}

void CpuKernels::cross_entropy_backward(const Tensor& logits_in, const Tensor& kept_in, const Tensor& targets_in,
                                        const Tensor& gloss_in, double label_smoothing, int64_t ignore_index,
                                        const Tensor& glogits) {
  check_out(glogits, "cross_entropy_backward");
  const bool log_softmax = kept_in.dim() == 2;
  Tensor kept = contiguous_input(kept_in), targets = contiguous_input(targets_in), gloss = contiguous_input(gloss_in);
  Tensor logits = log_softmax ? kept : contiguous_input(logits_in);  // what exp reads (less lse)
  const bool lse_fits = log_softmax || (kept.dim() == 1 && logits.dim() == 2 && kept.size(0) == logits.size(0) &&
                                        kept.dtype() == logits.dtype());
  REMAT_ASSERT(logits.dim() == 2 && logits.shape() == glogits.shape() && logits.dtype() == glogits.dtype() &&
                   lse_fits && targets.numel() == logits.size(0) && gloss.numel() == logits.size(0),
               "cross_entropy_backward: logits ", shape_str(logits_in.defined() ? logits_in.shape() : Shape{}),
               ", kept ", shape_str(kept.shape()), ", targets ", shape_str(targets.shape()), ", gloss ",
               shape_str(gloss.shape()));
  const int64_t rows = logits.size(0), cols = logits.size(1);
  const int64_t* t = targets.data<int64_t>();
  check_targets(t, rows, cols, ignore_index, "cross_entropy_backward");
  if (rows == 0 || cols == 0) return;
  dispatch_float(glogits.dtype(), "cross_entropy_backward", [&]<class T>() {
    cross_entropy_backward_rows<T>(logits.data<T>(), log_softmax ? nullptr : kept.data<T>(), t, gloss.data<T>(),
                                   label_smoothing, ignore_index, glogits.data<T>(), rows, cols);
  });
}

void CpuKernels::dropout(const Tensor& x_in, double p, RngState state, const Tensor& y) {
  check_out(y, "dropout");
  REMAT_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability ", p, " is outside [0, 1]");
  const int64_t n = y.numel();
  if (n == 0) return;
  if (p == 0.0) {
    copy(x_in, y);
    return;
  }
  if (p == 1.0) {
    fill(y, 0.0);
    return;
  }
  Tensor x = contiguous_input(x_in);
  dispatch_float(y.dtype(), "dropout", [&]<class T>() { dropout_kernel<T>(x.data<T>(), y.data<T>(), n, p, state); });
}

}  // namespace remat::cpu
