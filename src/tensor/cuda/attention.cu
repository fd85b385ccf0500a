// CUDA fused attention, forward and backward, never forming the [Tq, Tk] probabilities (the
// FlashAttention scheme, as the CPU's src/tensor/cpu/attention.cpp):
//   forward   a block takes 16 query rows of one (b, h), 4 per warp, and walks key tiles of 32
//             keys staged in shared memory; lane j scores key j of the tile, the warp keeps each
//             row's running maximum m and sum l (online softmax: the output accumulator is
//             rescaled by exp(m_old - m_new) when m grows) and lane t accumulates output columns
//             t, t + 32, ...; it writes out and lse = m + log(l).
//   backward  delta_i = rowsum(dO_i o O_i); then one warp per tile of 32 keys walks the query rows
//             in order, recomputes P = exp(score - lse) and accumulates dV += (P o Z)^T dO and
//             dK += dS^T Q * scale in shared memory, dS = P o (Z o (dO V^T) - delta); and one warp
//             per tile of 32 queries walks the keys in order and accumulates dQ += dS K * scale.
//             Each gradient element is written by one thread after a fixed sequence of additions:
//             no atomics. For equal head sizes of 8 to 64 (32 in float64) the row kernels run
//             instead: the same walks with each lane's gradient row in registers; the forward
//             unrolls its head loops for head sizes 32 and 64.
// Z is the dropout factor (keep / (1 - p) or 0) of word ((b * H + h) * Tq + i) * Tk + j of the
// dropout stream, as on the CPU. Warp sums use butterfly shuffles, which leave the same value in
// every lane. Head sizes D and Dv up to 256 (kMaxPerLane columns per lane). The kernels take the
// operands' storage type S and compute in T = Compute<S> (half.cuh): S itself for f32 and f64;
// float for bf16 and f16 (the backend option sixteen_bit), each element widened where it is loaded or
// staged, the same expressions and orders as the float32 kernels, the log-sum-exp and delta in
// float32, each gradient and output element rounded once.
#include <cmath>
#include <initializer_list>
#include <type_traits>

#include "tensor/cuda/attention.cuh"

namespace remat::cuda {

namespace {

using attention_detail::operand;
using attention_detail::Operand;
using attention_detail::Problem;

constexpr int kTile = 32;        // keys (forward, dK/dV) or queries (dQ) per tile: one per lane
constexpr int kRowsPerWarp = 4;  // forward
constexpr int kWarps = 4;        // forward
constexpr int kRowsPerBlock = kRowsPerWarp * kWarps;
constexpr int kMaxPerLane = 8;  // head size up to 32 * 8 = 256
constexpr int64_t kMaxHead = kTile * kMaxPerLane;

// Stages rows [t0, t0 + kTile) of `src` (width `width`, zero past `limit`) into dst[kTile][ld].
template <class S, class T>
__device__ inline void stage(const Operand<const S>& src, int64_t bh, int64_t heads, int64_t t0, int64_t limit,
                             int64_t width, T* dst, int64_t ld) {
  for (int64_t x = threadIdx.x; x < kTile * width; x += blockDim.x) {
    const int64_t r = x / width, e = x % width;
    dst[r * ld + e] = t0 + r < limit ? convert<T>(src.row(bh, heads, t0 + r)[e]) : T(0);
  }
}

// D > 0: equal head sizes d = dv = D known at compile time, so the head loops unroll.
template <class S, int D>
__global__ void forward_kernel(Problem<S> pb) {
  using T = Compute<S>;
  constexpr int kLanes = D > 0 ? (D + 31) / 32 : kMaxPerLane;  // output columns per lane
  const int64_t d = D > 0 ? D : pb.d, dv = D > 0 ? D : pb.dv;
  extern __shared__ unsigned char smem[];
  T* ks = reinterpret_cast<T*>(smem);  // [kTile][d + 1]
  T* vs = ks + kTile * (d + 1);        // [kTile][dv + 1]
  T* qs = vs + kTile * (dv + 1);       // [kRowsPerBlock][d]
  const int64_t bh = blockIdx.y, i0 = int64_t(blockIdx.x) * kRowsPerBlock;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t x = threadIdx.x; x < kRowsPerBlock * d; x += blockDim.x) {
    const int64_t r = x / d, e = x % d;
    qs[x] = i0 + r < pb.tq ? convert<T>(pb.q.row(bh, pb.heads, i0 + r)[e]) : T(0);
  }
  T m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kLanes];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    m[r] = -INFINITY, l[r] = T(0);
#pragma unroll
    for (int t = 0; t < kLanes; ++t) acc[r][t] = T(0);
  }
  const int64_t key_end = pb.causal ? min(pb.tk, i0 + kRowsPerBlock) : pb.tk;
  for (int64_t j0 = 0; j0 < key_end; j0 += kTile) {
    __syncthreads();
    stage(pb.k, bh, pb.heads, j0, pb.tk, d, ks, d + 1);
    stage(pb.v, bh, pb.heads, j0, pb.tk, dv, vs, dv + 1);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t row = warp * kRowsPerWarp + r, i = i0 + row;
      if (i >= pb.tq) continue;  // uniform within the warp
      const int64_t j = j0 + lane;
      const bool valid = pb.visible(i, j);
      T s = -INFINITY;
      if (valid) {
        T dot = 0;
        for (int64_t e = 0; e < d; ++e) dot += qs[row * d + e] * ks[lane * (d + 1) + e];
        s = dot * pb.scale;
      }
      const T mx = warp_max(s);
      // a NaN score makes the row NaN (it must not leave m at -inf and skip the tile's keys)
      const T m_new = mx > m[r] || mx != mx ? mx : m[r];
      if (m_new == -INFINITY) continue;   // nothing visible yet
      const T alpha = exp(m[r] - m_new);  // 0 on the first tile (m = -inf)
      const T pj = valid ? exp(s - m_new) : T(0);
      l[r] = l[r] * alpha + warp_sum(pj);
      m[r] = m_new;
      const T pz = valid ? pj * pb.dropout_factor(bh, i, j) : T(0);
#pragma unroll
      for (int t = 0; t < kLanes; ++t) acc[r][t] *= alpha;
      for (int jj = 0; jj < kTile; ++jj) {
        const T w = __shfl_sync(0xffffffffu, pz, jj);
#pragma unroll
        for (int t = 0; t < kLanes; ++t) {
          const int64_t c = lane + 32 * t;
          if (c < dv) acc[r][t] += w * vs[jj * (dv + 1) + c];
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t i = i0 + warp * kRowsPerWarp + r;
    if (i >= pb.tq) continue;
    const T inv = T(1) / l[r];
    S* dst = pb.o.row(bh, pb.heads, i);
#pragma unroll
    for (int t = 0; t < kLanes; ++t) {
      const int64_t c = lane + 32 * t;
      if (c < dv) dst[c] = convert<S>(acc[r][t] * inv);
    }
    if (lane == 0) pb.lse_out[bh * pb.tq + i] = m[r] + log(l[r]);
  }
}

// delta[bh * tq + i] = sum over e of gout[i][e] * out[i][e]; one warp per row.
template <class S>
__global__ void delta_kernel(Problem<S> pb, int64_t rows) {
  using T = Compute<S>;
  const int lane = threadIdx.x & 31;
  for (int64_t x = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5; x < rows;
       x += (int64_t(gridDim.x) * blockDim.x) >> 5) {
    const int64_t bh = x / pb.tq, i = x % pb.tq;
    const S* g = pb.gout.row(bh, pb.heads, i);
    const S* o = pb.out.row(bh, pb.heads, i);
    Acc<T> s = 0;
    for (int64_t e = lane; e < pb.dv; e += 32) s += static_cast<Acc<T>>(convert<T>(g[e]) * convert<T>(o[e]));
    s = warp_sum(s);
    if (lane == 0) pb.delta[x] = static_cast<T>(s);
  }
}

// The score, probability and dS of (i, j) for a lane: q_i . k_j from the given rows, in global
// (storage type) or shared memory (arithmetic type).
template <class T>
struct Grad {
  T pz, ds;
};
template <class S, class Q, class K, class G, class V, class T = Compute<S>>
__device__ inline Grad<T> grad_of(const Problem<S>& pb, int64_t bh, int64_t i, int64_t j, const Q* qi, const K* kj,
                                  const G* gi, const V* vj, T lse_i, T delta_i) {
  if (!pb.visible(i, j)) return {T(0), T(0)};
  const int64_t d = pb.d, dv = pb.dv;
  T s = 0;
#pragma unroll
  for (int64_t e = 0; e < d; ++e) s += convert<T>(qi[e]) * convert<T>(kj[e]);
  const T p = exp(s * pb.scale - lse_i);
  T dp = 0;
#pragma unroll
  for (int64_t e = 0; e < dv; ++e) dp += convert<T>(gi[e]) * convert<T>(vj[e]);
  const T z = pb.dropout_factor(bh, i, j);
  return {p * z, p * (z * dp - delta_i)};
}

// dK and dV of one tile of 32 keys (one warp): query rows in order.
template <class S>
__global__ void dkdv_kernel(Problem<S> pb) {
  using T = Compute<S>;
  extern __shared__ unsigned char smem[];
  T* ks = reinterpret_cast<T*>(smem);  // [kTile][d + 1]
  T* vs = ks + kTile * (pb.d + 1);     // [kTile][dv + 1]
  T* dk = vs + kTile * (pb.dv + 1);    // [kTile][d]
  T* dv = dk + kTile * pb.d;           // [kTile][dv]
  const int64_t bh = blockIdx.y, j0 = int64_t(blockIdx.x) * kTile;
  const int lane = threadIdx.x;
  stage(pb.k, bh, pb.heads, j0, pb.tk, pb.d, ks, pb.d + 1);
  stage(pb.v, bh, pb.heads, j0, pb.tk, pb.dv, vs, pb.dv + 1);
  for (int64_t x = lane; x < kTile * pb.d; x += 32) dk[x] = T(0);
  for (int64_t x = lane; x < kTile * pb.dv; x += 32) dv[x] = T(0);
  __syncwarp();
  const int64_t j = j0 + lane;
  for (int64_t i = pb.causal ? j0 : 0; i < pb.tq; ++i) {
    const S* qi = pb.q.row(bh, pb.heads, i);
    const S* gi = pb.gout.row(bh, pb.heads, i);
    const Grad<T> g = grad_of(pb, bh, i, j, qi, ks + lane * (pb.d + 1), gi, vs + lane * (pb.dv + 1),
                              pb.lse[bh * pb.tq + i], pb.delta[bh * pb.tq + i]);
    T gc[kMaxPerLane], qc[kMaxPerLane];
#pragma unroll
    for (int t = 0; t < kMaxPerLane; ++t) {
      const int64_t c = lane + 32 * t;
      gc[t] = c < pb.dv ? convert<T>(gi[c]) : T(0);
      qc[t] = c < pb.d ? convert<T>(qi[c]) : T(0);
    }
    for (int jj = 0; jj < kTile; ++jj) {
      const T pz = __shfl_sync(0xffffffffu, g.pz, jj), ds = __shfl_sync(0xffffffffu, g.ds, jj);
#pragma unroll
      for (int t = 0; t < kMaxPerLane; ++t) {
        const int64_t c = lane + 32 * t;
        if (c < pb.dv) dv[jj * pb.dv + c] += pz * gc[t];
        if (c < pb.d) dk[jj * pb.d + c] += ds * qc[t];
      }
    }
  }
  __syncwarp();
  for (int jj = 0; jj < kTile && j0 + jj < pb.tk; ++jj) {
    S* gk = pb.gk.row(bh, pb.heads, j0 + jj);
    S* gv = pb.gv.row(bh, pb.heads, j0 + jj);
    for (int64_t c = lane; c < pb.d; c += 32) gk[c] = convert<S>(dk[jj * pb.d + c] * pb.scale);
    for (int64_t c = lane; c < pb.dv; c += 32) gv[c] = convert<S>(dv[jj * pb.dv + c]);
  }
}

// dQ of one tile of 32 queries (one warp): keys in order.
template <class S>
__global__ void dq_kernel(Problem<S> pb) {
  using T = Compute<S>;
  extern __shared__ unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);  // [kTile][d + 1]
  T* gs = qs + kTile * (pb.d + 1);     // [kTile][dv + 1]
  T* dq = gs + kTile * (pb.dv + 1);    // [kTile][d]
  const int64_t bh = blockIdx.y, i0 = int64_t(blockIdx.x) * kTile;
  const int lane = threadIdx.x;
  stage(pb.q, bh, pb.heads, i0, pb.tq, pb.d, qs, pb.d + 1);
  stage(pb.gout, bh, pb.heads, i0, pb.tq, pb.dv, gs, pb.dv + 1);
  for (int64_t x = lane; x < kTile * pb.d; x += 32) dq[x] = T(0);
  __syncwarp();
  const int64_t i = i0 + lane;
  const T lse_i = i < pb.tq ? pb.lse[bh * pb.tq + i] : T(0), delta_i = i < pb.tq ? pb.delta[bh * pb.tq + i] : T(0);
  const int64_t key_end = pb.causal ? min(pb.tk, i0 + kTile) : pb.tk;
  for (int64_t j = 0; j < key_end; ++j) {
    const S* kj = pb.k.row(bh, pb.heads, j);
    const S* vj = pb.v.row(bh, pb.heads, j);
    Grad<T> g{T(0), T(0)};
    if (i < pb.tq) g = grad_of(pb, bh, i, j, qs + lane * (pb.d + 1), kj, gs + lane * (pb.dv + 1), vj, lse_i, delta_i);
    T kc[kMaxPerLane];
#pragma unroll
    for (int t = 0; t < kMaxPerLane; ++t) kc[t] = lane + 32 * t < pb.d ? convert<T>(kj[lane + 32 * t]) : T(0);
    for (int ii = 0; ii < kTile; ++ii) {
      const T ds = __shfl_sync(0xffffffffu, g.ds, ii);
#pragma unroll
      for (int t = 0; t < kMaxPerLane; ++t)
        if (lane + 32 * t < pb.d) dq[ii * pb.d + lane + 32 * t] += ds * kc[t];
    }
  }
  __syncwarp();
  for (int ii = 0; ii < kTile && i0 + ii < pb.tq; ++ii) {
    S* gq = pb.gq.row(bh, pb.heads, i0 + ii);
    for (int64_t c = lane; c < pb.d; c += 32) gq[c] = convert<S>(dq[ii * pb.d + c] * pb.scale);
  }
}

// The backward for equal head sizes D = d = dv known at compile time (GPT-2's 64 among them): a
// lane owns one key (dK, dV) or one query (dQ) and keeps that row's gradient in registers; the
// other side's rows are staged 32 at a time in shared memory, read there by every lane at once,
// and the loops over the head are unrolled. Each gradient element is summed over the rows in
// ascending order, as in dkdv_kernel and dq_kernel, but the compiled arithmetic is not the same
// (a training run's gradient digest differs in the last bits), so a head size always takes one
// path: the row kernels where an instance exists, else the generic ones.
template <class S, int D>
__global__ void dkdv_rows_kernel(Problem<S> pb) {
  using T = Compute<S>;
  __shared__ T ks[kTile][D + 1], vs[kTile][D + 1], qs[kTile][D], gs[kTile][D], lse_s[kTile], delta_s[kTile];
  const int64_t bh = blockIdx.y, j0 = int64_t(blockIdx.x) * kTile;
  const int lane = threadIdx.x;
  const int64_t j = j0 + lane;
  stage(pb.k, bh, pb.heads, j0, pb.tk, D, &ks[0][0], D + 1);
  stage(pb.v, bh, pb.heads, j0, pb.tk, D, &vs[0][0], D + 1);
  T dk[D], dv[D];
#pragma unroll
  for (int e = 0; e < D; ++e) dk[e] = T(0), dv[e] = T(0);
  for (int64_t i0 = pb.causal ? j0 : 0; i0 < pb.tq; i0 += kTile) {
    __syncwarp();
    stage(pb.q, bh, pb.heads, i0, pb.tq, D, &qs[0][0], D);
    stage(pb.gout, bh, pb.heads, i0, pb.tq, D, &gs[0][0], D);
    lse_s[lane] = i0 + lane < pb.tq ? pb.lse[bh * pb.tq + i0 + lane] : T(0);
    delta_s[lane] = i0 + lane < pb.tq ? pb.delta[bh * pb.tq + i0 + lane] : T(0);
    __syncwarp();
    const int rows = static_cast<int>(min(int64_t(kTile), pb.tq - i0));
    for (int r = 0; r < rows; ++r) {
      const int64_t i = i0 + r;
      T pz = T(0), ds = T(0);
      if (pb.visible(i, j)) {
        T sc = 0, dp = 0;
#pragma unroll
        for (int e = 0; e < D; ++e) sc += qs[r][e] * ks[lane][e];
        const T p = exp(sc * pb.scale - lse_s[r]);
#pragma unroll
        for (int e = 0; e < D; ++e) dp += gs[r][e] * vs[lane][e];
        const T z = pb.dropout_factor(bh, i, j);
        pz = p * z, ds = p * (z * dp - delta_s[r]);
      }
#pragma unroll
      for (int e = 0; e < D; ++e) {
        dv[e] += pz * gs[r][e];
        dk[e] += ds * qs[r][e];
      }
    }
  }
  if (j >= pb.tk) return;
  S* gk = pb.gk.row(bh, pb.heads, j);
  S* gv = pb.gv.row(bh, pb.heads, j);
#pragma unroll
  for (int e = 0; e < D; ++e) gk[e] = convert<S>(dk[e] * pb.scale), gv[e] = convert<S>(dv[e]);
}

template <class S, int D>
__global__ void dq_rows_kernel(Problem<S> pb) {
  using T = Compute<S>;
  __shared__ T qs[kTile][D + 1], gs[kTile][D + 1], ks[kTile][D], vs[kTile][D];
  const int64_t bh = blockIdx.y, i0 = int64_t(blockIdx.x) * kTile;
  const int lane = threadIdx.x;
  const int64_t i = i0 + lane;
  stage(pb.q, bh, pb.heads, i0, pb.tq, D, &qs[0][0], D + 1);
  stage(pb.gout, bh, pb.heads, i0, pb.tq, D, &gs[0][0], D + 1);
  const T lse_i = i < pb.tq ? pb.lse[bh * pb.tq + i] : T(0), delta_i = i < pb.tq ? pb.delta[bh * pb.tq + i] : T(0);
  T dq[D];
#pragma unroll
  for (int e = 0; e < D; ++e) dq[e] = T(0);
  const int64_t key_end = pb.causal ? min(pb.tk, i0 + kTile) : pb.tk;
  for (int64_t j0 = 0; j0 < key_end; j0 += kTile) {
    __syncwarp();
    stage(pb.k, bh, pb.heads, j0, pb.tk, D, &ks[0][0], D);
    stage(pb.v, bh, pb.heads, j0, pb.tk, D, &vs[0][0], D);
    __syncwarp();
    const int keys = static_cast<int>(min(int64_t(kTile), key_end - j0));
    for (int c = 0; c < keys; ++c) {
      const int64_t j = j0 + c;
      T ds = T(0);
      if (i < pb.tq && pb.visible(i, j)) {
        T sc = 0, dp = 0;
#pragma unroll
        for (int e = 0; e < D; ++e) sc += qs[lane][e] * ks[c][e];
        const T p = exp(sc * pb.scale - lse_i);
#pragma unroll
        for (int e = 0; e < D; ++e) dp += gs[lane][e] * vs[c][e];
        ds = p * (pb.dropout_factor(bh, i, j) * dp - delta_i);
      }
#pragma unroll
      for (int e = 0; e < D; ++e) dq[e] += ds * ks[c][e];
    }
  }
  if (i >= pb.tq) return;
  S* gq = pb.gq.row(bh, pb.heads, i);
#pragma unroll
  for (int e = 0; e < D; ++e) gq[e] = convert<S>(dq[e] * pb.scale);
}

// Runs the row kernels when the head size has an instance (registers hold 2 D values a lane, so
// float64 stops at 32), and says whether it did.
template <class T, int D>
bool backward_rows_at(const Problem<T>& pb, int64_t bh, cudaStream_t stream) {
  if (pb.d != D || pb.dv != D) return false;
  if (pb.tk > 0) {
    dkdv_rows_kernel<T, D><<<dim3(static_cast<unsigned>((pb.tk + kTile - 1) / kTile), static_cast<unsigned>(bh)), kTile,
                             0, stream>>>(pb);
    check_launch("attention_backward (dk, dv)");
  }
  dq_rows_kernel<T, D>
      <<<dim3(static_cast<unsigned>((pb.tq + kTile - 1) / kTile), static_cast<unsigned>(bh)), kTile, 0, stream>>>(pb);
  check_launch("attention_backward (dq)");
  return true;
}

template <class T>
bool backward_rows(const Problem<T>& pb, int64_t bh, cudaStream_t stream) {
  if (backward_rows_at<T, 8>(pb, bh, stream) || backward_rows_at<T, 16>(pb, bh, stream) ||
      backward_rows_at<T, 32>(pb, bh, stream))
    return true;
  if constexpr (sizeof(Compute<T>) == 4) return backward_rows_at<T, 64>(pb, bh, stream);
  return false;
}

void check_unit_last(const Tensor& t, const char* what) {
  REMAT_ASSERT(!t.defined() || t.numel() == 0 || t.strides().back() == 1, "attention: ", what, " of shape ",
               shape_str(t.shape()), " needs unit stride along its last axis");
}

template <class T>
Problem<T> make_problem(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params) {
  Problem<T> pb;
  pb.heads = q.size(1), pb.tq = q.size(2), pb.tk = k.size(2), pb.d = q.size(3), pb.dv = v.size(3);
  REMAT_CHECK(pb.d <= kMaxHead && pb.dv <= kMaxHead, "attention on cuda: head sizes ", pb.d, " and ", pb.dv,
              " exceed the supported ", kMaxHead);
  pb.q = operand<const T>(q), pb.k = operand<const T>(k), pb.v = operand<const T>(v);
  pb.scale = static_cast<Compute<T>>(params.scale);
  pb.causal = params.causal;
  pb.p = params.dropout_p;
  pb.keep_scale = static_cast<Compute<T>>(1.0 / (1.0 - params.dropout_p));
  pb.seed = params.dropout_state.seed, pb.offset = params.dropout_state.offset;
  return pb;
}

// Launches `kernel` with `bytes` of dynamic shared memory, raising the kernel's limit when needed.
template <class Kernel, class T>
void launch(Kernel kernel, dim3 grid, int threads, size_t bytes, cudaStream_t stream, int device, const Problem<T>& pb,
            const char* what) {
  int optin = 0;
  check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute");
  REMAT_CHECK(bytes <= static_cast<size_t>(optin), "attention on cuda: head sizes ", pb.d, " and ", pb.dv, " need ",
              bytes, " bytes of shared memory per block; the device has ", optin);
  if (bytes > 48 * 1024)
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
          "cudaFuncSetAttribute");
  kernel<<<grid, threads, bytes, stream>>>(pb);
  check_launch(what);
}

// The kernels take q's dtype for the [B, H, T, D] operands and accumulate_dtype's for lse.
void check_dtypes(const char* op, const Tensor& q, std::initializer_list<const Tensor*> operands, const Tensor& lse) {
  for (const Tensor* t : operands)
    REMAT_ASSERT(!t->defined() || t->dtype() == q.dtype(), op, ": an operand of dtype ", dtype_name(t->dtype()),
                 " beside ", dtype_name(q.dtype()));
  REMAT_ASSERT(lse.dtype() == accumulate_dtype(q.dtype()), op, ": log-sum-exp of dtype ", dtype_name(lse.dtype()),
               " for ", dtype_name(q.dtype()));
}

Tensor unit_last_stride(CudaBackend& be, const Tensor& t) {
  if (t.numel() == 0 || t.strides().back() == 1) return t;
  return be.contiguous(t);
}

}  // namespace

void CudaBackend::attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const AttentionParams& params,
                            const Tensor& out, const Tensor& lse) {
  check_unit_last(out, "output");
  REMAT_ASSERT(lse.is_contiguous(), "attention: log-sum-exp must be contiguous");
  if (out.numel() == 0) return;
  DeviceGuard guard(device_);
  Tensor q = unit_last_stride(*this, q_in), k = unit_last_stride(*this, k_in), v = unit_last_stride(*this, v_in);
  check_dtypes("attention", q, {&k, &v, &out}, lse);
  dispatch_storage(q.dtype(), "attention", [&]<class T>() {
    Problem<T> pb = make_problem<T>(q, k, v, params);
    pb.o = operand<T>(out);
    pb.lse_out = ptr<Compute<T>>(lse);
    const int64_t bh = q.size(0) * q.size(1);
    REMAT_CHECK(bh <= 65535, "attention on cuda: batch x heads = ", bh, " exceeds 65535");
    const size_t bytes =
        sizeof(Compute<T>) * static_cast<size_t>(kTile * (pb.d + 1) + kTile * (pb.dv + 1) + kRowsPerBlock * pb.d);
    const dim3 grid(static_cast<unsigned>((pb.tq + kRowsPerBlock - 1) / kRowsPerBlock), static_cast<unsigned>(bh));
    const int threads = 32 * kWarps;
    const int same = pb.d == pb.dv ? static_cast<int>(pb.d) : 0;
    if (same == 64) launch(forward_kernel<T, 64>, grid, threads, bytes, stream_, device_, pb, "attention");
    else if (same == 32) launch(forward_kernel<T, 32>, grid, threads, bytes, stream_, device_, pb, "attention");
    else launch(forward_kernel<T, 0>, grid, threads, bytes, stream_, device_, pb, "attention");
  });
}

void CudaBackend::attention_backward(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& out_in,
                                     const Tensor& lse, const Tensor& gout_in, const AttentionParams& params,
                                     const Tensor& gq, const Tensor& gk, const Tensor& gv) {
  check_unit_last(gq, "query gradient");
  check_unit_last(gk, "key gradient");
  check_unit_last(gv, "value gradient");
  REMAT_ASSERT(lse.is_contiguous(), "attention_backward: log-sum-exp must be contiguous");
  DeviceGuard guard(device_);
  if (gout_in.numel() == 0) {  // no queries or an empty value size: the gradients are zero
    for (const Tensor* g : {&gq, &gk, &gv})
      if (g->numel() > 0) fill(*g, 0.0);
    return;
  }
  Tensor q = unit_last_stride(*this, q_in), k = unit_last_stride(*this, k_in), v = unit_last_stride(*this, v_in),
         out = unit_last_stride(*this, out_in), gout = unit_last_stride(*this, gout_in);
  check_dtypes("attention_backward", q, {&k, &v, &out, &gout, &gq, &gk, &gv}, lse);
  dispatch_storage(q.dtype(), "attention_backward", [&]<class T>() {
    Problem<T> pb = make_problem<T>(q, k, v, params);
    pb.out = operand<const T>(out), pb.gout = operand<const T>(gout);
    pb.gq = operand<T>(gq), pb.gk = operand<T>(gk), pb.gv = operand<T>(gv);
    pb.lse = ptr<Compute<T>>(lse);
    const int64_t bh = q.size(0) * q.size(1);
    REMAT_CHECK(bh <= 65535, "attention on cuda: batch x heads = ", bh, " exceeds 65535");
    Tensor delta = scratch(Shape{bh, pb.tq}, accumulate_dtype(q.dtype()));
    pb.delta = ptr<Compute<T>>(delta);
    delta_kernel<T><<<grid_for(bh * pb.tq * 32), kThreads, 0, stream_>>>(pb, bh * pb.tq);
    check_launch("attention_backward (delta)");
    if (backward_rows(pb, bh, stream_)) return;
    if (pb.tk > 0) {
      const size_t kv_bytes = sizeof(Compute<T>) * static_cast<size_t>(kTile * (2 * pb.d + 1) + kTile * (2 * pb.dv + 1));
      const dim3 kv_grid(static_cast<unsigned>((pb.tk + kTile - 1) / kTile), static_cast<unsigned>(bh));
      launch(dkdv_kernel<T>, kv_grid, 32, kv_bytes, stream_, device_, pb, "attention_backward (dk, dv)");
    }
    const size_t q_bytes = sizeof(Compute<T>) * static_cast<size_t>(kTile * (2 * pb.d + 1) + kTile * (pb.dv + 1));
    const dim3 q_grid(static_cast<unsigned>((pb.tq + kTile - 1) / kTile), static_cast<unsigned>(bh));
    launch(dq_kernel<T>, q_grid, 32, q_bytes, stream_, device_, pb, "attention_backward (dq)");
  });
}

}  // namespace remat::cuda
