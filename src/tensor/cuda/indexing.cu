// CUDA indexing kernels: embedding gather and its backward, cross entropy and its backward,
// mirroring src/tensor/cpu/indexing.cpp. Ids and targets are validated on the device: a kernel
// writes the first bad position into a flag (an integer atomicMin, whose result does not depend on
// order), the host reads the flag after the kernel and throws the CPU's remat::Error naming it,
// before any output is written. With REMAT_CUDA_FAST=async the flag is read at the next wait
// instead, and ids the host knows to be in range are not checked on the device (Note [deferred
// index checks] in activity.cpp).
//
// The embedding backward is a gather, not a scatter: a stable radix sort (CUB) orders positions
// by id, and for each distinct id one block adds the gradient rows of its positions, in position
// order, to the table row. No two blocks write the same row and no atomics add floats, so the
// sums are the same on every run.
#include <cmath>
#include <limits>
#include <cub/device/device_radix_sort.cuh>

#include "tensor/cuda/device_common.cuh"
#include "tensor/cuda/half.cuh"

namespace remat::cuda {

namespace {

constexpr unsigned long long kNone = ~0ull;

// flag[0] = the first i with ids[i] outside [0, rows) (kNone if none); flag[1] = the count of
// entries that are not `ignore` (cross entropy's rows that count).
__global__ void check_ids_kernel(const int64_t* ids, int64_t n, int64_t rows, bool use_ignore, int64_t ignore,
                                 unsigned long long* flag) {
  REMAT_GRID_LOOP(i, n) {
    const int64_t v = ids[i];
    if (use_ignore && v == ignore) continue;
    if (v < 0 || v >= rows) atomicMin(&flag[0], static_cast<unsigned long long>(i));
    if (use_ignore) atomicAdd(&flag[1], 1ull);
  }
}

struct IdCheck {
  int64_t bad = -1;     // the first bad position, or -1
  int64_t value = 0;    // the id there
  int64_t counted = 0;  // entries not ignored
};

// With REMAT_CUDA_FAST=async (Note [deferred index checks] in activity.cpp): whether `ids` need a
// check on the device at all, and if so the slot its kernel writes the first bad position to.
struct Deferred {
  bool on = false;                       // the async path
  unsigned long long* flag = nullptr;    // null: the host knows every id is in range
};
Deferred defer_check(CudaBackend& be, const Tensor& ids, int64_t bound, const char* op, bool target = false,
                     int64_t rows = 0, int64_t ignore_index = 0) {
  Deferred d;
  d.on = fast(Fast::async);
  if (!d.on || kernel::indices_known_within(ids, 0, bound)) return d;
  DeferredChecks::Check c;
  c.ids = ids, c.op = op, c.bound = bound, c.rows = rows, c.target = target, c.ignore_index = ignore_index;
  d.flag = be.deferred().add(be, std::move(c));
  return d;
}

IdCheck check_ids(CudaBackend& be, const Tensor& ids, int64_t rows, bool use_ignore, int64_t ignore) {
  IdCheck result;
  const int64_t n = ids.numel();
  if (n == 0) return result;
  be.count_wait();
  Tensor flag = be.scratch({2}, DType::i64);
  unsigned long long init[2] = {kNone, 0};
  check(cudaMemcpyAsync(ptr<int64_t>(flag), init, sizeof init, cudaMemcpyHostToDevice, be.stream()), "cudaMemcpyAsync");
  check_ids_kernel<<<grid_for(n), kThreads, 0, be.stream()>>>(
      ptr<int64_t>(ids), n, rows, use_ignore, ignore, reinterpret_cast<unsigned long long*>(ptr<int64_t>(flag)));
  check_launch("id check");
  unsigned long long host[2];
  check(cudaMemcpyAsync(host, ptr<int64_t>(flag), sizeof host, cudaMemcpyDeviceToHost, be.stream()), "cudaMemcpyAsync");
  note_launch("id check (copies)");
  check(cudaStreamSynchronize(be.stream()), "cudaStreamSynchronize");
  result.counted = static_cast<int64_t>(host[1]);
  if (host[0] != kNone) {
    result.bad = static_cast<int64_t>(host[0]);
    check(cudaMemcpy(&result.value, ptr<int64_t>(ids) + result.bad, sizeof(int64_t), cudaMemcpyDeviceToHost),
          "cudaMemcpy");
  }
  return result;
}

template <class T>
__global__ void embedding_kernel(const T* table, const int64_t* ids, T* out, int64_t n, int64_t dim) {
  REMAT_GRID_LOOP(i, n * dim) { out[i] = table[ids[i / dim] * dim + i % dim]; }
}
// The same with its check on the device (Fast::async): an id outside [0, rows) reads nothing,
// gives zeros, and its position goes to `flag`.
template <class T>
__global__ void embedding_checked_kernel(const T* table, const int64_t* ids, T* out, int64_t n, int64_t dim,
                                         int64_t rows, unsigned long long* flag) {
  REMAT_GRID_LOOP(i, n * dim) {
    const int64_t id = ids[i / dim];
    const bool ok = id >= 0 && id < rows;
    if (!ok && i % dim == 0) atomicMin(flag, static_cast<unsigned long long>(i / dim));
    out[i] = ok ? table[id * dim + i % dim] : convert<T>(0.0f);
  }
}

// For each sorted position s that starts a run of equal ids: gtable[id] += gout rows of the run,
// in position order (the stable sort keeps equal ids in position order).
// Checked (Fast::async): ids not known to be in range; a bad one (its deferred check fails) is skipped.
// 16-bit S: float sums of the widened rows, the table row rounded once (the float32 kernel's bits).
template <class S, bool Checked = false>
__global__ void embedding_backward_kernel(const int64_t* sorted_ids, const int64_t* positions, const S* gout, S* gtable,
                                          int64_t n, int64_t dim, int64_t rows) {
  using T = Compute<S>;
  for (int64_t s = blockIdx.x; s < n; s += gridDim.x) {
    const int64_t id = sorted_ids[s];
    if (s > 0 && sorted_ids[s - 1] == id) continue;
    if (Checked && (id < 0 || id >= rows)) continue;
    for (int64_t k = threadIdx.x; k < dim; k += blockDim.x) {
      T acc = convert<T>(gtable[id * dim + k]);
      for (int64_t e = s; e < n && sorted_ids[e] == id; ++e) acc += convert<T>(gout[positions[e] * dim + k]);
      gtable[id * dim + k] = convert<S>(acc);
    }
  }
}

__global__ void iota_kernel(int64_t* p, int64_t n) {
  REMAT_GRID_LOOP(i, n) { p[i] = i; }
}

// Forward row: logp = x - logsumexp(x); loss = (1 - eps) * -logp[t] + eps * mean(-logp); 0 if ignored.
// Checked (Fast::async): a target outside [0, cols) that is not `ignore` reads nothing, gives loss
// 0, and its row goes to `flag`; `counted` (when not null) receives the rows not ignored.
// Online (REMAT_CUDA_FAST=cross_entropy): the maximum and the sum of exponentials in one read of
// the row (each thread rescales its running sum when its maximum grows, the block then rescales
// the threads' sums to the row's maximum and adds them in its fixed order), so the row is read
// twice, not three times; the same formulas otherwise.
template <class S, class T = Compute<S>>
__device__ inline Acc<T> row_exp_sum(const S* xr, int64_t cols, T& m, T* shared_t, Acc<T>* shared) {
  T mine = -INFINITY;
  Acc<T> s = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const T v = convert<T>(xr[c]);
    if (v > mine) {
      s = (mine == -INFINITY ? Acc<T>(0) : s * exp(static_cast<Acc<T>>(mine) - static_cast<Acc<T>>(v))) + Acc<T>(1);
      mine = v;
    } else if (mine != -INFINITY || v != v) {  // -inf after -inf adds 0; a NaN spreads, as in two passes
      s += static_cast<Acc<T>>(exp(v - mine));
    }
  }
  m = block_max(mine, shared_t);
  if (m == -INFINITY) m = T(0);
  if (m == INFINITY) return static_cast<Acc<T>>(NAN);  // exp(inf - inf) in two passes (m is the block's)
  const Acc<T> scaled = mine == -INFINITY ? (s == s ? Acc<T>(0) : s)
                                          : s * exp(static_cast<Acc<T>>(mine) - static_cast<Acc<T>>(m));
  return block_sum(scaled, shared);
}

template <class S, bool Checked = false, bool Online = false>
__global__ void cross_entropy_kernel(const S* x, const int64_t* targets, double eps, int64_t ignore,
                                     Compute<S>* losses, S* logp, int64_t rows, int64_t cols,
                                     unsigned long long* flag = nullptr, unsigned long long* counted = nullptr) {
  using T = Compute<S>;
  __shared__ T shared_t[32];
  __shared__ Acc<T> shared[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const S* xr = x + r * cols;
    S* lr = logp + r * cols;
    T m = -INFINITY;
    Acc<T> sum = 0;
    if constexpr (Online) {
      sum = row_exp_sum(xr, cols, m, shared_t, shared);
    } else {
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = convert<T>(xr[c]) > m ? convert<T>(xr[c]) : m;
      m = block_max(m, shared_t);
      if (m == -INFINITY) m = T(0);
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += static_cast<Acc<T>>(exp(convert<T>(xr[c]) - m));
      sum = block_sum(sum, shared);
    }
    const T shift = static_cast<T>(static_cast<Acc<T>>(m) + log(sum));
    Acc<T> row_sum = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const T v = convert<T>(xr[c]) - shift;
      lr[c] = convert<S>(v);
      row_sum += static_cast<Acc<T>>(v);
    }
    if (eps > 0.0) row_sum = block_sum(row_sum, shared);
    if (threadIdx.x == 0) {
      const int64_t t = targets[r];
      if constexpr (Checked) {
        if (t != ignore && counted) atomicAdd(counted, 1ull);
        if (t != ignore && (t < 0 || t >= cols)) {
          if (flag) atomicMin(flag, static_cast<unsigned long long>(r));
          losses[r] = T(0);
          continue;
        }
      }
      if (t == ignore) {
        losses[r] = T(0);
      } else {
        Acc<T> loss = 0;
        if (eps < 1.0) loss += static_cast<Acc<T>>(1.0 - eps) * -static_cast<Acc<T>>(convert<T>(xr[t]) - shift);
        if (eps > 0.0) loss += static_cast<Acc<T>>(eps) * -(row_sum / static_cast<Acc<T>>(cols));
        losses[r] = static_cast<T>(loss);
      }
    }
  }
}

// glogits = gloss[row] * (softmax - ((1 - eps) * onehot(target) + eps / C)); 0 on ignored rows.
template <class S, class T = Compute<S>>
__global__ void cross_entropy_backward_kernel(const S* logp, const int64_t* targets, const T* gloss, double eps,
                                              int64_t ignore, S* glogits, int64_t rows, int64_t cols) {
  const T uniform = static_cast<T>(eps / static_cast<double>(cols)), on_target = static_cast<T>(1.0 - eps);
  REMAT_GRID_LOOP(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols, t = targets[r];
    if (t == ignore) {
      glogits[i] = convert<S>(T(0));
      continue;
    }
    const T g = gloss[r];
    T v = g * (exp(convert<T>(logp[i])) - uniform);
    if (c == t) v -= g * on_target;
    glogits[i] = convert<S>(v);
  }
}

// The same, a block per row (REMAT_CUDA_FAST=cross_entropy): the row's target and gradient read
// once, 32-bit column indices; the same bits.
template <class S, class T = Compute<S>>
__global__ void cross_entropy_backward_rows(const S* logp, const int64_t* targets, const T* gloss, double eps,
                                            int64_t ignore, S* glogits, int64_t rows, int cols) {
  const T uniform = static_cast<T>(eps / static_cast<double>(cols)), on_target = static_cast<T>(1.0 - eps);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t t = targets[r];
    const S* lr = logp + r * cols;
    S* gr = glogits + r * cols;
    if (t == ignore) {
      for (int c = threadIdx.x; c < cols; c += blockDim.x) gr[c] = convert<S>(T(0));
      continue;
    }
    const T g = gloss[r];
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      T v = g * (exp(convert<T>(lr[c])) - uniform);
      if (c == t) v -= g * on_target;
      gr[c] = convert<S>(v);
    }
  }
}

// The [N] form (Note [what cross entropy keeps] in src/autodiff/ops/loss.cpp; the op keeps it
// with REMAT_CUDA_FAST=cross_entropy, the kernels above otherwise): the online row kernel's
// maximum and sum, each row's shift written to lse[r] and no [N, C] tensor; with smoothing the
// row is read once more for the sum of x - shift, added in the order the kernel above adds logp.
// So loss and shift are the bits of cross_entropy_kernel<T, Checked, true>.
template <class S, bool Checked = false>
__global__ void cross_entropy_lse_kernel(const S* x, const int64_t* targets, double eps, int64_t ignore,
                                         Compute<S>* losses, Compute<S>* lse, int64_t rows, int64_t cols,
                                         unsigned long long* flag = nullptr, unsigned long long* counted = nullptr) {
  using T = Compute<S>;
  __shared__ T shared_t[32];
  __shared__ Acc<T> shared[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const S* xr = x + r * cols;
    T m = -INFINITY;
    const Acc<T> sum = row_exp_sum(xr, cols, m, shared_t, shared);
    const T shift = static_cast<T>(static_cast<Acc<T>>(m) + log(sum));
    Acc<T> row_sum = 0;
    if (eps > 0.0) {
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) row_sum += static_cast<Acc<T>>(convert<T>(xr[c]) - shift);
      row_sum = block_sum(row_sum, shared);
    }
    if (threadIdx.x != 0) continue;
    lse[r] = shift;
    const int64_t t = targets[r];
    if constexpr (Checked) {
      if (t != ignore && counted) atomicAdd(counted, 1ull);
      if (t != ignore && (t < 0 || t >= cols)) {
        if (flag) atomicMin(flag, static_cast<unsigned long long>(r));
        losses[r] = T(0);
        continue;
      }
    }
    Acc<T> loss = 0;
    if (t != ignore && eps < 1.0)
      loss += static_cast<Acc<T>>(1.0 - eps) * -static_cast<Acc<T>>(convert<T>(xr[t]) - shift);
    if (t != ignore && eps > 0.0) loss += static_cast<Acc<T>>(eps) * -(row_sum / static_cast<Acc<T>>(cols));
    losses[r] = static_cast<T>(loss);
  }
}

// Its backward, a block per row as cross_entropy_backward_rows: exp(x - lse[row]), the bits of
// exp(logp) for the logp the kernel above would have written. I: the column index (int where the
// row allows, as there).
template <class S, class I, class T = Compute<S>>
__global__ void cross_entropy_backward_lse(const S* x, const T* lse, const int64_t* targets, const T* gloss, double eps,
                                           int64_t ignore, S* glogits, int64_t rows, I cols) {
  const T uniform = static_cast<T>(eps / static_cast<double>(cols)), on_target = static_cast<T>(1.0 - eps);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t t = targets[r];
    const S* xr = x + r * cols;
    S* gr = glogits + r * cols;
    if (t == ignore) {
      for (I c = threadIdx.x; c < cols; c += blockDim.x) gr[c] = convert<S>(T(0));
      continue;
    }
    const T g = gloss[r], shift = lse[r];
    for (I c = threadIdx.x; c < cols; c += blockDim.x) {
      T v = g * (exp(convert<T>(xr[c]) - shift) - uniform);
      if (c == t) v -= g * on_target;
      gr[c] = convert<S>(v);
    }
  }
}

// scale = 1 / counted (rounded from float64, as the CPU's fill), or 0 when every row is ignored.
template <class T>
__global__ void mean_weight_kernel(const unsigned long long* counted, T* scale) {
  const unsigned long long c = *counted;
  *scale = c > 0 ? static_cast<T>(1.0 / static_cast<double>(c)) : T(0);
}

// The first bad position into a deferred check's slot (Fast::async), without waiting.
__global__ void first_bad_kernel(const int64_t* ids, int64_t n, int64_t rows, bool use_ignore, int64_t ignore,
                                 unsigned long long* flag) {
  REMAT_GRID_LOOP(i, n) {
    const int64_t v = ids[i];
    if (use_ignore && v == ignore) continue;
    if (v < 0 || v >= rows) atomicMin(flag, static_cast<unsigned long long>(i));
  }
}
void check_ids_deferred(CudaBackend& be, const Tensor& ids, int64_t rows, bool use_ignore, int64_t ignore,
                        unsigned long long* flag) {
  const int64_t n = ids.numel();
  if (n == 0 || flag == nullptr) return;
  first_bad_kernel<<<grid_for(n), kThreads, 0, be.stream()>>>(ptr<int64_t>(ids), n, rows, use_ignore, ignore, flag);
  check_launch("id check (deferred)");
}

void check_out(const Tensor& t, const char* op) {
  REMAT_ASSERT(t.is_contiguous(), op, ": output of shape ", shape_str(t.shape()), " is not contiguous");
}

void throw_bad_id(const IdCheck& c, int64_t rows, const char* op) {
  throw Error(
      detail::concat(op, ": id ", c.value, " at position ", c.bad, " is out of range for a table of ", rows, " rows"));
}

void throw_bad_target(const IdCheck& c, int64_t n, int64_t classes, int64_t ignore_index, const char* op) {
  throw Error(detail::concat(op, ": target ", c.value, " at row ", c.bad, " is out of range for ", classes,
                             " classes (logits of shape [", n, ", ", classes, "], ignore_index ", ignore_index, ")"));
}

}  // namespace

void CudaBackend::embedding(const Tensor& table_in, const Tensor& ids_in, const Tensor& out) {
  check_out(out, "embedding");
  REMAT_ASSERT(table_in.dim() == 2 && ids_in.dtype() == DType::i64 && table_in.dtype() == out.dtype(),
               "embedding: table ", dtype_name(table_in.dtype()), " ", shape_str(table_in.shape()), ", ids ",
               dtype_name(ids_in.dtype()), ", out ", dtype_name(out.dtype()));
  DeviceGuard guard(device_);
  Tensor table = contiguous(table_in), ids = contiguous(ids_in);
  const int64_t rows = table.size(0), dim = table.size(1), n = ids.numel();
  const Deferred d = defer_check(*this, ids, rows, "embedding");
  if (!d.on) {
    const IdCheck c = check_ids(*this, ids, rows, false, 0);
    if (c.bad >= 0) throw_bad_id(c, rows, "embedding");
  }
  if (n == 0 || dim == 0) return;
  dispatch_storage(out.dtype(), "embedding", [&]<class T>() {
    if (d.flag)
      embedding_checked_kernel<T><<<grid_for(n * dim), kThreads, 0, stream_>>>(ptr<T>(table), ptr<int64_t>(ids),
                                                                               ptr<T>(out), n, dim, rows, d.flag);
    else
      embedding_kernel<T>
          <<<grid_for(n * dim), kThreads, 0, stream_>>>(ptr<T>(table), ptr<int64_t>(ids), ptr<T>(out), n, dim);
  });
  check_launch("embedding");
}

void CudaBackend::embedding_backward(const Tensor& ids_in, const Tensor& gout_in, const Tensor& gtable) {
  check_out(gtable, "embedding_backward");
  REMAT_ASSERT(gtable.dim() == 2 && ids_in.dtype() == DType::i64, "embedding_backward: gtable ",
               shape_str(gtable.shape()), ", ids ", dtype_name(ids_in.dtype()));
  DeviceGuard guard(device_);
  Tensor ids = contiguous(ids_in), gout = contiguous(gout_in);
  const int64_t rows = gtable.size(0), dim = gtable.size(1), n = ids.numel();
  REMAT_ASSERT(gout.numel() == n * dim && gout.dtype() == gtable.dtype(), "embedding_backward: gradient ",
               dtype_name(gout.dtype()), " of shape ", shape_str(gout.shape()), " for ", n, " ids of dimension ", dim,
               " into ", dtype_name(gtable.dtype()));
  const Deferred d = defer_check(*this, ids, rows, "embedding_backward");
  if (d.on) {
    check_ids_deferred(*this, ids, rows, false, 0, d.flag);
  } else {
    const IdCheck c = check_ids(*this, ids, rows, false, 0);
    if (c.bad >= 0) throw_bad_id(c, rows, "embedding_backward");
  }
  if (n == 0 || dim == 0) return;
  REMAT_CHECK(n <= std::numeric_limits<int>::max(), "embedding_backward on cuda: ", n, " ids exceed 2^31 - 1");
  // sort (id, position) pairs by id; ids lie in [0, rows), so only their low bits are keys (ids not
  // known to lie there are sorted on all their bits, so that a bad one cannot split a run)
  int end_bit = 1;
  while (end_bit < 63 && (int64_t{1} << end_bit) < rows) ++end_bit;
  if (d.flag) end_bit = 64;
  Tensor positions = scratch({n}, DType::i64), sorted_ids = scratch({n}, DType::i64),
         sorted_positions = scratch({n}, DType::i64);
  iota_kernel<<<grid_for(n), kThreads, 0, stream_>>>(ptr<int64_t>(positions), n);
  check_launch("embedding_backward (positions)");
  size_t temp_bytes = 0;
  check(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, ptr<int64_t>(ids), ptr<int64_t>(sorted_ids),
                                        ptr<int64_t>(positions), ptr<int64_t>(sorted_positions), static_cast<int>(n), 0,
                                        end_bit, stream_),
        "cub::DeviceRadixSort::SortPairs (size)");
  Tensor temp = scratch({static_cast<int64_t>((temp_bytes + 7) / 8 + 1)}, DType::i64);
  check(cub::DeviceRadixSort::SortPairs(temp.storage()->data(), temp_bytes, ptr<int64_t>(ids), ptr<int64_t>(sorted_ids),
                                        ptr<int64_t>(positions), ptr<int64_t>(sorted_positions), static_cast<int>(n), 0,
                                        end_bit, stream_),
        "cub::DeviceRadixSort::SortPairs");
  note_launch("embedding_backward (sort)");
  dispatch_storage(gtable.dtype(), "embedding_backward", [&]<class T>() {
    if (d.flag)
      embedding_backward_kernel<T, true><<<grid_for(n, 1), 128, 0, stream_>>>(
          ptr<int64_t>(sorted_ids), ptr<int64_t>(sorted_positions), ptr<T>(gout), ptr<T>(gtable), n, dim, rows);
    else
      embedding_backward_kernel<T><<<grid_for(n, 1), 128, 0, stream_>>>(
          ptr<int64_t>(sorted_ids), ptr<int64_t>(sorted_positions), ptr<T>(gout), ptr<T>(gtable), n, dim, rows);
  });
  check_launch("embedding_backward");
}

// kept: the [N, C] log-softmax, written by the kernels checked on a device (the two-pass row
// kernel, or the online one with REMAT_CUDA_FAST=cross_entropy), or lse [N] (the switch's form,
// cross_entropy_lse_kernel), as its shape says.
void CudaBackend::cross_entropy(const Tensor& logits_in, const Tensor& targets_in, double label_smoothing,
                                int64_t ignore_index, const Tensor& losses, const Tensor& kept, const Tensor& scale) {
  for (const Tensor* t : {&losses, &kept, &scale}) check_out(*t, "cross_entropy");
  const bool lse_form = kept.dim() == 1;
  REMAT_ASSERT(logits_in.dim() == 2 && targets_in.dtype() == DType::i64 && targets_in.numel() == logits_in.size(0) &&
                   (lse_form ? kept.numel() == logits_in.size(0) : kept.shape() == logits_in.shape()) &&
                   kept.dtype() == (lse_form ? accumulate_dtype(logits_in.dtype()) : logits_in.dtype()) &&
                   losses.dtype() == accumulate_dtype(logits_in.dtype()) && scale.dtype() == losses.dtype(),
               "cross_entropy: logits ", shape_str(logits_in.shape()), ", targets ", shape_str(targets_in.shape()),
               ", kept ", dtype_name(kept.dtype()), " ", shape_str(kept.shape()));
  const char* name = lse_form                    ? "cross_entropy (lse)"
                     : fast(Fast::cross_entropy) ? "cross_entropy (online)"
                                                 : "cross_entropy";
  DeviceGuard guard(device_);
  Tensor logits = contiguous(logits_in), targets = contiguous(targets_in);
  const int64_t rows = logits.size(0), cols = logits.size(1);
  if (!fast(Fast::async)) {
    const IdCheck c = check_ids(*this, targets, cols, true, ignore_index);
    if (c.bad >= 0) throw_bad_target(c, rows, cols, ignore_index, "cross_entropy");
    fill(scale, c.counted > 0 ? 1.0 / static_cast<double>(c.counted) : 0.0);
    if (rows == 0) return;
    dispatch_storage(logits.dtype(), "cross_entropy", [&]<class S>() {
      using T = Compute<S>;
      if (lse_form) {
        cross_entropy_lse_kernel<S><<<grid_for(rows, 1), kThreads, 0, stream_>>>(
            ptr<S>(logits), ptr<int64_t>(targets), label_smoothing, ignore_index, ptr<T>(losses), ptr<T>(kept), rows,
            cols, nullptr, nullptr);
        return;
      }
      auto kernel = fast(Fast::cross_entropy) ? cross_entropy_kernel<S, false, true> : cross_entropy_kernel<S>;
      kernel<<<grid_for(rows, 1), kThreads, 0, stream_>>>(ptr<S>(logits), ptr<int64_t>(targets), label_smoothing,
                                                         ignore_index, ptr<T>(losses), ptr<S>(kept), rows, cols,
                                                         nullptr, nullptr);
    });
    check_launch(name);
    return;
  }
  // Fast::async: targets checked in the row kernel, the mean's weight counted on the device unless
  // the host knows every target is a class (then every row counts)
  const Deferred d = defer_check(*this, targets, cols, "cross_entropy", true, rows, ignore_index);
  const bool all_count = d.flag == nullptr && !(ignore_index >= 0 && ignore_index < cols);
  if (all_count) fill(scale, rows > 0 ? 1.0 / static_cast<double>(rows) : 0.0);
  if (rows == 0) {
    if (!all_count) fill(scale, 0.0);
    return;
  }
  Tensor counted;
  if (!all_count) {
    counted = scratch({1}, DType::i64);
    check(cudaMemsetAsync(ptr<int64_t>(counted), 0, sizeof(int64_t), stream_), "cudaMemsetAsync");
    note_launch("cross_entropy (count reset)");
  }
  auto* count = all_count ? nullptr : reinterpret_cast<unsigned long long*>(ptr<int64_t>(counted));
  dispatch_storage(logits.dtype(), "cross_entropy", [&]<class S>() {
    using T = Compute<S>;
    if (lse_form) {
      cross_entropy_lse_kernel<S, true><<<grid_for(rows, 1), kThreads, 0, stream_>>>(
          ptr<S>(logits), ptr<int64_t>(targets), label_smoothing, ignore_index, ptr<T>(losses), ptr<T>(kept), rows,
          cols, d.flag, count);
    } else {
      auto kernel = fast(Fast::cross_entropy) ? cross_entropy_kernel<S, true, true> : cross_entropy_kernel<S, true>;
      kernel<<<grid_for(rows, 1), kThreads, 0, stream_>>>(ptr<S>(logits), ptr<int64_t>(targets), label_smoothing,
                                                         ignore_index, ptr<T>(losses), ptr<S>(kept), rows, cols,
                                                         d.flag, count);
    }
    check_launch(name);
    if (count) {
      mean_weight_kernel<T><<<1, 1, 0, stream_>>>(count, ptr<T>(scale));
      check_launch("cross_entropy (mean weight)");
    }
  });
}

// kept: the [N, C] log-softmax (logits_in unread) or lse [N] with the logits, as its shape says.
void CudaBackend::cross_entropy_backward(const Tensor& logits_in, const Tensor& kept_in, const Tensor& targets_in,
                                         const Tensor& gloss_in, double label_smoothing, int64_t ignore_index,
                                         const Tensor& glogits) {
  check_out(glogits, "cross_entropy_backward");
  DeviceGuard guard(device_);
  const bool lse_form = kept_in.dim() == 1;
  Tensor logp = lse_form ? Tensor() : contiguous(kept_in), targets = contiguous(targets_in),
         gloss = contiguous(gloss_in);
  Tensor logits = lse_form ? contiguous(logits_in) : Tensor(), lse = lse_form ? contiguous(kept_in) : Tensor();
  const Tensor& x = lse_form ? logits : logp;  // what exp reads, less lse in the [N] form
  REMAT_ASSERT(x.dim() == 2 && x.shape() == glogits.shape() && targets.numel() == x.size(0) &&
                   gloss.numel() == x.size(0) && gloss.dtype() == accumulate_dtype(x.dtype()) &&
                   glogits.dtype() == x.dtype() &&
                   (!lse_form || (lse.numel() == x.size(0) && lse.dtype() == accumulate_dtype(x.dtype()))),
               "cross_entropy_backward: ", lse_form ? "logits " : "logp ", shape_str(x.shape()), ", kept ",
               shape_str(kept_in.shape()), ", targets ", shape_str(targets.shape()), ", gloss ",
               shape_str(gloss.shape()));
  const int64_t rows = x.size(0), cols = x.size(1);
  const Deferred d = defer_check(*this, targets, cols, "cross_entropy_backward", true, rows, ignore_index);
  if (d.on) {
    check_ids_deferred(*this, targets, cols, true, ignore_index, d.flag);  // the kernel below reads only in-row
  } else {
    const IdCheck c = check_ids(*this, targets, cols, true, ignore_index);
    if (c.bad >= 0) throw_bad_target(c, rows, cols, ignore_index, "cross_entropy_backward");
  }
  if (rows == 0 || cols == 0) return;
  dispatch_storage(glogits.dtype(), "cross_entropy_backward", [&]<class S>() {
    using T = Compute<S>;
    if (lse_form) {
      const unsigned grid = grid_for(rows, 1);
      if (cols <= std::numeric_limits<int>::max())
        cross_entropy_backward_lse<S, int><<<grid, kThreads, 0, stream_>>>(
            ptr<S>(logits), ptr<T>(lse), ptr<int64_t>(targets), ptr<T>(gloss), label_smoothing, ignore_index,
            ptr<S>(glogits), rows, static_cast<int>(cols));
      else
        cross_entropy_backward_lse<S, int64_t><<<grid, kThreads, 0, stream_>>>(
            ptr<S>(logits), ptr<T>(lse), ptr<int64_t>(targets), ptr<T>(gloss), label_smoothing, ignore_index,
            ptr<S>(glogits), rows, cols);
      return check_launch("cross_entropy_backward (lse)");
    }
    if (fast(Fast::cross_entropy) && cols <= std::numeric_limits<int>::max()) {
      cross_entropy_backward_rows<S><<<grid_for(rows, 1), kThreads, 0, stream_>>>(
          ptr<S>(logp), ptr<int64_t>(targets), ptr<T>(gloss), label_smoothing, ignore_index, ptr<S>(glogits), rows,
          static_cast<int>(cols));
      return check_launch("cross_entropy_backward (rows)");
    }
    cross_entropy_backward_kernel<S><<<grid_for(rows * cols), kThreads, 0, stream_>>>(
        ptr<S>(logp), ptr<int64_t>(targets), ptr<T>(gloss), label_smoothing, ignore_index, ptr<S>(glogits), rows, cols);
    check_launch("cross_entropy_backward");
  });
}

}  // namespace remat::cuda
