// CUDA indexing kernels: embedding gather and its backward, cross entropy and its backward,
// mirroring src/tensor/cpu/indexing.cpp. Ids and targets are validated on the device: a kernel
// writes the first bad position into a flag (an integer atomicMin, whose result does not depend on
// order), the host reads the flag after the kernel and throws the CPU's remat::Error naming it,
// before any output is written. With the backend option async the flag is read at the next wait
// instead, and ids the host knows to be in range are not checked on the device (Note [deferred
// index checks] in activity.cpp). Cross entropy keeps each row's log-sum-exp, computed by kernels
// that have passed a device check (Note [cross entropy from checked kernels]).
//
// The embedding backward is a gather, not a scatter: a stable radix sort (CUB) orders positions
// by id, and for each distinct id one block adds the gradient rows of its positions, in position
// order, to the table row. No two blocks write the same row and no atomics add floats, so the
// sums are the same on every run.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
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

// With the option async (Note [deferred index checks] in activity.cpp): whether `ids` need a
// check on the device at all, and if so the slot its kernel writes the first bad position to.
struct Deferred {
  bool on = false;                       // the async path
  unsigned long long* flag = nullptr;    // null: the host knows every id is in range
};
Deferred defer_check(CudaBackend& be, const Tensor& ids, int64_t bound, const char* op, bool target = false,
                     int64_t rows = 0, int64_t ignore_index = 0) {
  Deferred d;
  d.on = be.options().async;
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
// The same with its check on the device (the option async): an id outside [0, rows) reads nothing,
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
// Checked (the option async): ids not known to be in range; a bad one (its deferred check fails) is skipped.
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
// Checked (the option async): a target outside [0, cols) that is not `ignore` reads nothing, gives
// loss 0, and its row goes to `flag`; `counted` (when not null) receives the rows not ignored.
template <class S, bool Checked = false>
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
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = convert<T>(xr[c]) > m ? convert<T>(xr[c]) : m;
    m = block_max(m, shared_t);
    if (m == -INFINITY) m = T(0);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += static_cast<Acc<T>>(exp(convert<T>(xr[c]) - m));
    sum = block_sum(sum, shared);
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

// scale = 1 / counted (rounded from float64, as the CPU's fill), or 0 when every row is ignored.
template <class T>
__global__ void mean_weight_kernel(const unsigned long long* counted, T* scale) {
  const unsigned long long c = *counted;
  *scale = c > 0 ? static_cast<T>(1.0 / static_cast<double>(c)) : T(0);
}

// The first bad position into a deferred check's slot (the option async), without waiting.
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

// Note [cross entropy from checked kernels]. The row's contract keeps lse [N] for the backward
// (Note [what cross entropy keeps] in src/autodiff/ops/loss.cpp). The kernels that have passed a
// device check keep the [N, C] log-softmax instead: cross_entropy_kernel writes the losses and
// logp = x - shift (shift each row's log-sum-exp, in the arithmetic type T), and the backward
// kernel reads logp. Until the fused kernels (candidates/cuda/cross_entropy.cu) pass a check, the
// backend composes the row from checked kernels:
//   - forward: cross_entropy_kernel into a scratch logp, dropped at once (the losses, the targets'
//     check and the mean's weight as before); then lse, from the reduction, elementwise and copy
//     kernels in the arithmetic of the kernel's shift: m = the row's maximum, at least the lowest
//     finite T (an all -inf row: the kernel takes m = 0; either way shift = -inf); the sum of
//     exp(x - m) in T, widened, added in float64 by the reduction kernel (thread t adds elements t,
//     t + 256, ... in order, then the block's fixed tree: the kernel's order); log, + m in float64,
//     rounded to T. For rows of more than 32 classes that is the kernel's shift, bit for bit (the
//     reduction sums a shorter row in a loop: the same value within rounding);
//   - backward: logp = x - lse in T, rounded to the logits' dtype (the log-softmax the forward
//     kernel wrote, bit for bit where lse is its shift), then the checked backward kernel.
// So the gradients are those of the last device-checked path, and nothing [N, C] lives between
// the forward and the backward. The lse and backward steps run on slices of rows whose scratch
// stays under kSliceBytes; the forward kernel's scratch logp is [N, C] in the logits' dtype while
// it runs.

namespace {

constexpr int64_t kSliceBytes = int64_t{256} << 20;

// Rows [r0, r0 + n) of the contiguous [rows, cols] t (a view: no copy).
Tensor rows_of(const Tensor& t, int64_t r0, int64_t n) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage();
  impl->dtype = t.dtype();
  impl->offset = t.offset() + r0 * (t.dim() == 2 ? t.size(1) : 1);
  impl->shape = t.dim() == 2 ? Shape{n, t.size(1)} : Shape{n, 1};
  impl->strides = t.dim() == 2 ? Strides{t.size(1), 1} : Strides{1, 1};
  return Tensor(impl);
}

// Rows per slice: `bytes_per_row` of scratch each, under kSliceBytes (at least one row).
int64_t slice_rows(int64_t rows, int64_t bytes_per_row) {
  return std::max<int64_t>(1, std::min<int64_t>(rows, kSliceBytes / std::max<int64_t>(1, bytes_per_row)));
}

// lse [rows] (T = accumulate_dtype of the logits' dtype) of the contiguous logits [rows, cols]:
// the shift of cross_entropy_kernel, by checked kernels (the Note above).
void log_sum_exp(CudaBackend& be, const Tensor& logits, const Tensor& lse) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  const DType t = accumulate_dtype(logits.dtype());
  const bool widen = t != logits.dtype(), wide_sum = t != DType::f64;
  Tensor lowest = be.scratch({1}, t);
  be.fill(lowest, t == DType::f64 ? -std::numeric_limits<double>::max() : -std::numeric_limits<float>::max());
  const int64_t per_row = cols * (static_cast<int64_t>(dtype_size(t)) * (widen ? 2 : 1) + (wide_sum ? 8 : 0));
  const int64_t step = slice_rows(rows, per_row);
  for (int64_t r0 = 0; r0 < rows; r0 += step) {
    const int64_t n = std::min(step, rows - r0);
    Tensor x = rows_of(logits, r0, n);
    if (widen) {
      Tensor xt = be.scratch({n, cols}, t);
      be.copy(x, xt);
      x = xt;
    }
    Tensor m = be.scratch({n, 1}, t);
    be.reduce(ReduceOp::max, x, {1}, m);
    be.binary(BinaryOp::maximum, m, lowest, m);
    Tensor e = be.scratch({n, cols}, t);
    be.binary(BinaryOp::sub, x, m, e);
    be.unary(UnaryOp::exp, e, e, 0.0);
    Tensor sum = be.scratch({n, 1}, DType::f64);
    if (wide_sum) {
      Tensor e64 = be.scratch({n, cols}, DType::f64);
      be.copy(e, e64);
      be.reduce(ReduceOp::sum, e64, {1}, sum);
    } else {
      be.reduce(ReduceOp::sum, e, {1}, sum);
    }
    be.unary(UnaryOp::log, sum, sum, 0.0);
    Tensor shift = m;  // m + log(sum) in float64
    if (wide_sum) {
      shift = be.scratch({n, 1}, DType::f64);
      be.copy(m, shift);
    }
    be.binary(BinaryOp::add, shift, sum, shift);
    be.copy(shift, rows_of(lse, r0, n));
  }
}

}  // namespace

void CudaBackend::cross_entropy(const Tensor& logits_in, const Tensor& targets_in, double label_smoothing,
                                int64_t ignore_index, const Tensor& losses, const Tensor& lse, const Tensor& scale) {
  for (const Tensor* t : {&losses, &lse, &scale}) check_out(*t, "cross_entropy");
  REMAT_ASSERT(logits_in.dim() == 2 && targets_in.dtype() == DType::i64 && targets_in.numel() == logits_in.size(0) &&
                   lse.numel() == logits_in.size(0) && lse.dtype() == accumulate_dtype(logits_in.dtype()) &&
                   losses.dtype() == accumulate_dtype(logits_in.dtype()) && scale.dtype() == losses.dtype(),
               "cross_entropy: logits ", shape_str(logits_in.shape()), ", targets ", shape_str(targets_in.shape()),
               ", kept ", dtype_name(lse.dtype()), " ", shape_str(lse.shape()));
  DeviceGuard guard(device_);
  Tensor logits = contiguous(logits_in), targets = contiguous(targets_in);
  const int64_t rows = logits.size(0), cols = logits.size(1);
  if (!options_.async) {
    const IdCheck c = check_ids(*this, targets, cols, true, ignore_index);
    if (c.bad >= 0) throw_bad_target(c, rows, cols, ignore_index, "cross_entropy");
    fill(scale, c.counted > 0 ? 1.0 / static_cast<double>(c.counted) : 0.0);
    if (rows == 0) return;
    {
      Tensor logp = scratch(logits.shape(), logits.dtype());
      dispatch_storage(logits.dtype(), "cross_entropy", [&]<class S>() {
        cross_entropy_kernel<S><<<grid_for(rows, 1), kThreads, 0, stream_>>>(
            ptr<S>(logits), ptr<int64_t>(targets), label_smoothing, ignore_index, ptr<Compute<S>>(losses), ptr<S>(logp),
            rows, cols, nullptr, nullptr);
      });
      check_launch("cross_entropy");
    }
    return log_sum_exp(*this, logits, lse);
  }
  // the option async: targets checked in the row kernel, the mean's weight counted on the device
  // unless the host knows every target is a class (then every row counts)
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
  {
    Tensor logp = scratch(logits.shape(), logits.dtype());
    dispatch_storage(logits.dtype(), "cross_entropy", [&]<class S>() {
      using T = Compute<S>;
      cross_entropy_kernel<S, true><<<grid_for(rows, 1), kThreads, 0, stream_>>>(
          ptr<S>(logits), ptr<int64_t>(targets), label_smoothing, ignore_index, ptr<T>(losses), ptr<S>(logp), rows,
          cols, d.flag, count);
      check_launch("cross_entropy");
      if (count) {
        mean_weight_kernel<T><<<1, 1, 0, stream_>>>(count, ptr<T>(scale));
        check_launch("cross_entropy (mean weight)");
      }
    });
  }
  log_sum_exp(*this, logits, lse);
}

void CudaBackend::cross_entropy_backward(const Tensor& logits_in, const Tensor& lse_in, const Tensor& targets_in,
                                         const Tensor& gloss_in, double label_smoothing, int64_t ignore_index,
                                         const Tensor& glogits) {
  check_out(glogits, "cross_entropy_backward");
  DeviceGuard guard(device_);
  Tensor logits = contiguous(logits_in), lse = contiguous(lse_in), targets = contiguous(targets_in),
         gloss = contiguous(gloss_in);
  const DType t = accumulate_dtype(logits.dtype());
  REMAT_ASSERT(logits.dim() == 2 && logits.shape() == glogits.shape() && targets.numel() == logits.size(0) &&
                   gloss.numel() == logits.size(0) && gloss.dtype() == t && glogits.dtype() == logits.dtype() &&
                   lse.numel() == logits.size(0) && lse.dtype() == t,
               "cross_entropy_backward: logits ", shape_str(logits.shape()), ", kept ", shape_str(lse.shape()),
               ", targets ", shape_str(targets.shape()), ", gloss ", shape_str(gloss.shape()));
  const int64_t rows = logits.size(0), cols = logits.size(1);
  const Deferred d = defer_check(*this, targets, cols, "cross_entropy_backward", true, rows, ignore_index);
  if (d.on) {
    check_ids_deferred(*this, targets, cols, true, ignore_index, d.flag);  // the kernel below reads only in-row
  } else {
    const IdCheck c = check_ids(*this, targets, cols, true, ignore_index);
    if (c.bad >= 0) throw_bad_target(c, rows, cols, ignore_index, "cross_entropy_backward");
  }
  if (rows == 0 || cols == 0) return;
  const bool widen = t != logits.dtype();
  const int64_t per_row = cols * static_cast<int64_t>(dtype_size(logits.dtype()) + (widen ? dtype_size(t) : 0));
  const int64_t step = slice_rows(rows, per_row);
  for (int64_t r0 = 0; r0 < rows; r0 += step) {
    const int64_t n = std::min(step, rows - r0);
    Tensor logp = scratch({n, cols}, logits.dtype());
    if (widen) {  // x - lse in float32, rounded once
      Tensor wide = scratch({n, cols}, t);
      copy(rows_of(logits, r0, n), wide);
      binary(BinaryOp::sub, wide, rows_of(lse, r0, n), wide);
      copy(wide, logp);
    } else {
      binary(BinaryOp::sub, rows_of(logits, r0, n), rows_of(lse, r0, n), logp);
    }
    dispatch_storage(glogits.dtype(), "cross_entropy_backward", [&]<class S>() {
      cross_entropy_backward_kernel<S><<<grid_for(n * cols), kThreads, 0, stream_>>>(
          ptr<S>(logp), ptr<int64_t>(targets) + r0, ptr<Compute<S>>(gloss) + r0, label_smoothing, ignore_index,
          ptr<S>(glogits) + r0 * cols, n, cols);
    });
    check_launch("cross_entropy_backward");
  }
}

}  // namespace remat::cuda
