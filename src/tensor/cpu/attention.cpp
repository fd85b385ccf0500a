// CPU fused attention, forward and backward (the FlashAttention scheme, Dao et al. 2022 and 2023,
// on a CPU): out = dropout(softmax(q k^T * scale, causal mask)) @ v without ever forming the
// [Tq, Tk] matrix of probabilities.
//
// Per (batch, head), queries are taken in blocks of kBlock rows and keys in blocks of kBlock
// columns. The forward walks a query block's key blocks keeping, per row, the running maximum m
// and sum l of exp(score - m) and the unnormalised output (online softmax: when m grows, l and
// the output are rescaled by exp(m_old - m_new)); it writes the output and the row's log-sum-exp
// lse = m + log(l). The backward walks key blocks (outer) and query blocks (inner), recomputes
// each tile's probabilities P = exp(score - lse), and accumulates
//   dV += (P o Z)^T dO,   dS = P o (Z o (dO V^T) - rowsum(dO o O)),   dQ += dS K * scale,
//   dK += dS^T Q * scale
// where Z is the dropout factor (keep / (1 - p), or 1). rowsum(dO o O) equals rowsum(P o dP)
// also with dropout, since O is the dropped output.
//
// Parallelism and reproducibility: OpenMP over batch x heads; one (b, h) is computed by one
// thread in a fixed order, so results are bitwise identical for any thread count, and the
// recomputation of a checkpoint region reproduces its first run exactly. Workspace (packed K^T,
// V^T, padded copies, tile buffers: O(T * D) per thread, never O(T^2)) comes from the accounted
// allocator.
//
// Vectorisation: the tile products are written with GCC vector extensions (32-byte vectors: 8
// floats or 4 doubles) and register-blocked two rows at a time; the per-(b, h) workers are
// compiled for each CPU level, x86-64-v4, -v3 and the baseline, one picked per process
// (cpu_level.h), like the elementwise kernels.
#include <cmath>
#include <cstring>
#include <limits>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/simd.h"

#define REMAT_INLINE REMAT_SIMD_INLINE

namespace remat::cpu {

namespace {

template <class T>
struct Simd {
  using V = simd::Vec<T>;
  static constexpr int64_t W = simd::kWidth<T>;
};
using simd::load;
using simd::store;

// Tiles are kBlock = 4 vectors wide: 32 floats or 16 doubles.
template <class T>
constexpr int64_t kBlock = 4 * Simd<T>::W;

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// out[r][c] = sum_{e < depth} a[r * lda + e] * bt[e * ldb + c] for r < rows, c < kBlock.
// `a` is read element by element (it may be a strided input), `bt` by vectors.
template <class T>
REMAT_INLINE void tile_dots(const T* __restrict a, int64_t lda, int64_t rows, int64_t depth, const T* __restrict bt,
                            int64_t ldb, T* __restrict out) {
  using V = typename Simd<T>::V;
  constexpr int64_t W = Simd<T>::W, B = kBlock<T>;
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) {
    V x0 = {}, x1 = {}, x2 = {}, x3 = {}, y0 = {}, y1 = {}, y2 = {}, y3 = {};
    const T* a0 = a + r * lda;
    const T* a1 = a0 + lda;
    for (int64_t e = 0; e < depth; ++e) {
      const T* b = bt + e * ldb;
      const V b0 = load(b), b1 = load(b + W), b2 = load(b + 2 * W), b3 = load(b + 3 * W);
      const T s0 = a0[e], s1 = a1[e];
      x0 += s0 * b0, x1 += s0 * b1, x2 += s0 * b2, x3 += s0 * b3;
      y0 += s1 * b0, y1 += s1 * b1, y2 += s1 * b2, y3 += s1 * b3;
    }
    T* o = out + r * B;
    store(o, x0), store(o + W, x1), store(o + 2 * W, x2), store(o + 3 * W, x3);
    store(o + B, y0), store(o + B + W, y1), store(o + B + 2 * W, y2), store(o + B + 3 * W, y3);
  }
  for (; r < rows; ++r) {
    V x0 = {}, x1 = {}, x2 = {}, x3 = {};
    const T* a0 = a + r * lda;
    for (int64_t e = 0; e < depth; ++e) {
      const T* b = bt + e * ldb;
      const T s0 = a0[e];
      x0 += s0 * load(b), x1 += s0 * load(b + W), x2 += s0 * load(b + 2 * W), x3 += s0 * load(b + 3 * W);
    }
    T* o = out + r * B;
    store(o, x0), store(o + W, x1), store(o + 2 * W, x2), store(o + 3 * W, x3);
  }
}

// acc[r * ldacc + x] += sum_{c < cols} coef[r * ldcoef + c] * mat[c * ldm + x] for r < rows and
// x < NV vectors starting at x0 (rows two at a time, accumulators in registers).
template <class T, int NV>
REMAT_INLINE void tile_accumulate_chunk(T* __restrict acc, int64_t ldacc, const T* __restrict coef, int64_t ldcoef,
                                        int64_t rows, int64_t cols, const T* __restrict mat, int64_t ldm) {
  using V = typename Simd<T>::V;
  constexpr int64_t W = Simd<T>::W;
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) {
    V x[NV], y[NV];
    T* o0 = acc + r * ldacc;
    T* o1 = o0 + ldacc;
    for (int k = 0; k < NV; ++k) x[k] = load(o0 + k * W), y[k] = load(o1 + k * W);
    const T* c0 = coef + r * ldcoef;
    const T* c1 = c0 + ldcoef;
    for (int64_t c = 0; c < cols; ++c) {
      const T* m = mat + c * ldm;
      const T s0 = c0[c], s1 = c1[c];
      for (int k = 0; k < NV; ++k) {
        const V mv = load(m + k * W);
        x[k] += s0 * mv;
        y[k] += s1 * mv;
      }
    }
    for (int k = 0; k < NV; ++k) store(o0 + k * W, x[k]), store(o1 + k * W, y[k]);
  }
  for (; r < rows; ++r) {
    V x[NV];
    T* o0 = acc + r * ldacc;
    for (int k = 0; k < NV; ++k) x[k] = load(o0 + k * W);
    const T* c0 = coef + r * ldcoef;
    for (int64_t c = 0; c < cols; ++c) {
      const T* m = mat + c * ldm;
      const T s0 = c0[c];
      for (int k = 0; k < NV; ++k) x[k] += s0 * load(m + k * W);
    }
    for (int k = 0; k < NV; ++k) store(o0 + k * W, x[k]);
  }
}

// The same over nx columns (a multiple of the vector width), in chunks of up to four vectors.
template <class T>
REMAT_INLINE void tile_accumulate(T* acc, int64_t ldacc, const T* coef, int64_t ldcoef, int64_t rows, int64_t cols,
                                  const T* mat, int64_t ldm, int64_t nx) {
  constexpr int64_t W = Simd<T>::W;
  for (int64_t x0 = 0; x0 < nx; x0 += 4 * W) {
    switch ((nx - x0) / W) {
      case 1: tile_accumulate_chunk<T, 1>(acc + x0, ldacc, coef, ldcoef, rows, cols, mat + x0, ldm); break;
      case 2: tile_accumulate_chunk<T, 2>(acc + x0, ldacc, coef, ldcoef, rows, cols, mat + x0, ldm); break;
      case 3: tile_accumulate_chunk<T, 3>(acc + x0, ldacc, coef, ldcoef, rows, cols, mat + x0, ldm); break;
      default: tile_accumulate_chunk<T, 4>(acc + x0, ldacc, coef, ldcoef, rows, cols, mat + x0, ldm); break;
    }
  }
}

template <class T>
REMAT_INLINE typename Simd<T>::V exp_vector(typename Simd<T>::V x) {
  return simd::exp<T>(x);
}
template <class T>
REMAT_INLINE T exp_of(T x) {
  return simd::exp_scalar<T>(x);
}
using simd::lane_index;

// Scales a row of kBlock scores in place, sets the columns from `valid` on to -inf (masked or
// past the last key) and returns the largest of the row and `running_max`.
template <class T>
REMAT_INLINE T scale_mask_max(T* __restrict row, T scale, int64_t valid, T running_max) {
  using V = typename Simd<T>::V;
  constexpr int64_t W = Simd<T>::W;
  const V neg_inf = V{} - std::numeric_limits<T>::infinity();
  const V idx = lane_index<T>();
  const T limit = static_cast<T>(valid);
  V mx = V{} + running_max;
  for (int64_t k = 0; k < 4; ++k) {
    V x = load(row + k * W) * scale;
    x = idx + static_cast<T>(k * W) < limit ? x : neg_inf;
    store(row + k * W, x);
    mx = x > mx ? x : mx;
  }
  T m = mx[0];
  for (int i = 1; i < W; ++i) m = mx[i] > m ? mx[i] : m;
  return m;
}

// row[c] = exp(row[c] - shift) over a row of kBlock; returns the row's sum (fixed order).
template <class T>
REMAT_INLINE T exp_shifted_sum(T* __restrict row, T shift) {
  using V = typename Simd<T>::V;
  constexpr int64_t W = Simd<T>::W;
  V sum = {};
  for (int64_t k = 0; k < 4; ++k) {
    const V p = exp_vector<T>(load(row + k * W) - shift);
    store(row + k * W, p);
    sum += p;
  }
  T total = sum[0];
  for (int i = 1; i < W; ++i) total += sum[i];
  return total;
}

// A [B, H, T, X] operand with unit stride along X.
template <class T>
struct Operand {
  T* data = nullptr;
  int64_t sb = 0, sh = 0, st = 0;
  T* at(int64_t b, int64_t h) const { return data + b * sb + h * sh; }
};

template <class T>
Operand<T> operand(const Tensor& t) {
  return {t.data<T>(), t.strides()[0], t.strides()[1], t.strides()[2]};
}

template <class T>
struct Problem {
  int64_t batch, heads, tq, tk, d, dv;
  bool causal;
  T scale;
  double dropout_p;
  RngState state;
  Operand<T> q, k, v, out, gout, gq, gk, gv;
  T* lse = nullptr;  // [B, H, Tq] contiguous
  // padded sizes
  int64_t tqp, tkp, dp, dvp;
};

// Keys a query row sees within the key block starting at j0 (cols keys): all of them, or under
// the causal mask (key j visible from query i iff j <= i) those up to the row's own position.
REMAT_INLINE int64_t visible_keys(bool causal, int64_t i, int64_t j0, int64_t cols) {
  if (!causal) return cols;
  const int64_t n = i - j0 + 1;
  return n < 0 ? 0 : (n < cols ? n : cols);
}

// Dropout factors for probabilities (i, j0 .. j0 + cols) of (b, h): keep / (1 - p), or 0.
// Word ((b * H + h) * Tq + i) * Tk + j of the stream, the same words as dropout() on the
// [B, H, Tq, Tk] probabilities would use.
template <class T>
REMAT_INLINE void dropout_factors(const Problem<T>& pb, int64_t bh, int64_t i, int64_t j0, int64_t cols, T* z) {
  const T scale = static_cast<T>(1.0 / (1.0 - pb.dropout_p));
  const uint64_t first = pb.state.offset + (static_cast<uint64_t>(bh * pb.tq + i) * static_cast<uint64_t>(pb.tk)) +
                         static_cast<uint64_t>(j0);
  uint64_t block = first / 4;
  Philox4 words = philox4x32(block, pb.state.seed);
  for (int64_t c = 0; c < cols; ++c) {
    const uint64_t word = first + static_cast<uint64_t>(c);
    if (word / 4 != block) {
      block = word / 4;
      words = philox4x32(block, pb.state.seed);
    }
    const bool keep = static_cast<double>(uniform_float(words.v[word % 4])) >= pb.dropout_p;
    z[c] = keep ? scale : T(0);
  }
}

// ---- forward of one (b, h)
//
// Workspace: kt [D][Tkp] (K transposed, zero columns past Tk), vp [Tkp][Dvp] (V, zero padded),
// s [kB][kB] scores/probabilities, pz [kB][kB] dropped probabilities, oacc [kB][Dvp], m, l [kB].
template <class T>
size_t forward_workspace(const Problem<T>& pb) {
  constexpr int64_t B = kBlock<T>;
  return static_cast<size_t>(pb.d * pb.tkp + pb.tkp * pb.dvp + 2 * B * B + B * pb.dvp + 2 * B);
}

template <class T>
REMAT_INLINE void attention_forward_one(const Problem<T>& pb, int64_t bh, T* ws) {
  constexpr int64_t B = kBlock<T>;
  const int64_t b = bh / pb.heads, h = bh % pb.heads;
  const T* q = pb.q.at(b, h);
  const T* k = pb.k.at(b, h);
  const T* v = pb.v.at(b, h);
  T* out = pb.out.at(b, h);
  T* lse = pb.lse + bh * pb.tq;
  const int64_t d = pb.d, dv = pb.dv, tk = pb.tk, tkp = pb.tkp, dvp = pb.dvp;
  const bool dropout = pb.dropout_p > 0.0;

  T* kt = ws;                 // [d][tkp]
  T* vp = kt + d * tkp;       // [tkp][dvp]
  T* s = vp + tkp * dvp;      // [B][B]
  T* pz = s + B * B;          // [B][B]
  T* oacc = pz + B * B;       // [B][dvp]
  T* m = oacc + B * dvp;      // [B]
  T* l = m + B;               // [B]

  for (int64_t e = 0; e < d; ++e) {
    T* row = kt + e * tkp;
    for (int64_t j = 0; j < tk; ++j) row[j] = k[j * pb.k.st + e];
    for (int64_t j = tk; j < tkp; ++j) row[j] = T(0);
  }
  for (int64_t j = 0; j < tkp; ++j) {
    T* row = vp + j * dvp;
    if (j < tk)
      for (int64_t x = 0; x < dv; ++x) row[x] = v[j * pb.v.st + x];
    for (int64_t x = j < tk ? dv : 0; x < dvp; ++x) row[x] = T(0);
  }

  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (int64_t i0 = 0; i0 < pb.tq; i0 += B) {
    const int64_t rows = std::min(B, pb.tq - i0);
    for (int64_t r = 0; r < rows; ++r) m[r] = neg_inf, l[r] = T(0);
    std::fill(oacc, oacc + rows * dvp, T(0));
    const int64_t key_end = pb.causal ? std::min(tk, i0 + rows) : tk;
    for (int64_t j0 = 0; j0 < key_end; j0 += B) {
      const int64_t cols = std::min(B, tk - j0);
      tile_dots<T>(q + i0 * pb.q.st, pb.q.st, rows, d, kt + j0, tkp, s);
      for (int64_t r = 0; r < rows; ++r) {
        T* sr = s + r * B;
        const int64_t valid = visible_keys(pb.causal, i0 + r, j0, cols);
        const T mx = scale_mask_max(sr, pb.scale, valid, m[r]);
        const T alpha = exp_of(m[r] - mx);  // 0 on the first block (m = -inf)
        const T sum = exp_shifted_sum(sr, mx);
        l[r] = l[r] * alpha + sum;
        m[r] = mx;
        T* o = oacc + r * dvp;
        if (alpha != T(1)) {
#pragma omp simd
          for (int64_t x = 0; x < dvp; ++x) o[x] *= alpha;
        }
        if (dropout) {
          T* zr = pz + r * B;
          dropout_factors(pb, bh, i0 + r, j0, cols, zr);
          for (int64_t c = 0; c < cols; ++c) zr[c] *= sr[c];
        }
      }
      tile_accumulate<T>(oacc, dvp, dropout ? pz : s, B, rows, cols, vp + j0 * dvp, dvp, dvp);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const T inv = T(1) / l[r];
      const T* o = oacc + r * dvp;
      T* dst = out + (i0 + r) * pb.out.st;
      for (int64_t x = 0; x < dv; ++x) dst[x] = o[x] * inv;
      lse[i0 + r] = m[r] + std::log(l[r]);
    }
  }
}

// ---- backward of one (b, h)
//
// Workspace: kt [D][Tkp], vt [Dv][Tkp], kp [Tkp][Dp], qp [Tqp][Dp], dop [Tqp][Dvp],
// dq [Tqp][Dp], drow [Tqp], tiles p, a^T, dpd, ds, ds^T, z [kB][kB], dk [kB][Dp], dv [kB][Dvp].
template <class T>
size_t backward_workspace(const Problem<T>& pb) {
  constexpr int64_t B = kBlock<T>;
  return static_cast<size_t>(pb.d * pb.tkp + pb.dv * pb.tkp + pb.tkp * pb.dp + 2 * pb.tqp * pb.dp +
                             pb.tqp * pb.dvp + pb.tqp + 6 * B * B + B * pb.dp + B * pb.dvp);
}

// The backward's workspace, carved out of `ws` (backward_workspace's layout).
template <class T>
struct BackwardWorkspace {
  T *kt, *vt, *kp, *qp, *dq, *dop, *drow, *p, *at, *dpd, *ds, *dst, *z, *dkacc, *dvacc;
  REMAT_INLINE BackwardWorkspace(const Problem<T>& pb, T* ws) {
    constexpr int64_t B = kBlock<T>;
    const int64_t d = pb.d, dv = pb.dv, tkp = pb.tkp, dp = pb.dp, dvp = pb.dvp;
    kt = ws;                    // [d][tkp]
    vt = kt + d * tkp;          // [dv][tkp]
    kp = vt + dv * tkp;         // [tkp][dp]
    qp = kp + tkp * dp;         // [tqp][dp]
    dq = qp + pb.tqp * dp;      // [tqp][dp]
    dop = dq + pb.tqp * dp;     // [tqp][dvp]
    drow = dop + pb.tqp * dvp;  // [tqp]
    p = drow + pb.tqp;          // [B][B]
    at = p + B * B;             // [B][B] (P o Z)^T
    dpd = at + B * B;           // [B][B]
    ds = dpd + B * B;           // [B][B]
    dst = ds + B * B;           // [B][B]
    z = dst + B * B;            // [B][B]
    dkacc = z + B * B;          // [B][dp]
    dvacc = dkacc + B * dp;     // [B][dvp]
  }
};

// Rows 0..n-1 of `src` (stride st, `width` columns) as columns of dst [width][np], zero past n.
template <class T>
REMAT_INLINE void pack_transposed(const T* src, int64_t st, int64_t n, int64_t width, int64_t np, T* dstp) {
  for (int64_t e = 0; e < width; ++e) {
    T* row = dstp + e * np;
    for (int64_t j = 0; j < n; ++j) row[j] = src[j * st + e];
    for (int64_t j = n; j < np; ++j) row[j] = T(0);
  }
}

// Rows 0..n-1 of `src` (stride st, `width` columns) into dst [np][wp], zero padded.
template <class T>
REMAT_INLINE void pack_rows(const T* src, int64_t st, int64_t n, int64_t width, int64_t np, int64_t wp, T* dstp) {
  for (int64_t j = 0; j < np; ++j) {
    T* row = dstp + j * wp;
    int64_t x = 0;
    if (j < n)
      for (; x < width; ++x) row[x] = src[j * st + x];
    for (; x < wp; ++x) row[x] = T(0);
  }
}

// The operands of (b, h) packed into the workspace, dQ zeroed, and drow[i] = dO[i] . O[i].
template <class T>
REMAT_INLINE void pack_backward_operands(const Problem<T>& pb, int64_t b, int64_t h, const BackwardWorkspace<T>& w) {
  const T* q = pb.q.at(b, h);
  const T* k = pb.k.at(b, h);
  const T* v = pb.v.at(b, h);
  const T* o = pb.out.at(b, h);
  const T* go = pb.gout.at(b, h);
  const int64_t d = pb.d, dv = pb.dv, tq = pb.tq, tk = pb.tk, tkp = pb.tkp, dp = pb.dp, dvp = pb.dvp;
  pack_transposed(k, pb.k.st, tk, d, tkp, w.kt);
  pack_transposed(v, pb.v.st, tk, dv, tkp, w.vt);
  pack_rows(k, pb.k.st, tk, d, tkp, dp, w.kp);
  pack_rows(q, pb.q.st, tq, d, pb.tqp, dp, w.qp);
  pack_rows(go, pb.gout.st, tq, dv, pb.tqp, dvp, w.dop);
  std::fill(w.dq, w.dq + pb.tqp * dp, T(0));
  for (int64_t i = 0; i < tq; ++i) {
    Acc<T> sum = 0;
    const T* orow = o + i * pb.out.st;
    const T* grow = w.dop + i * dvp;
    for (int64_t x = 0; x < dv; ++x) sum += static_cast<Acc<T>>(grow[x]) * static_cast<Acc<T>>(orow[x]);
    w.drow[i] = static_cast<T>(sum);
  }
}

// One tile: query rows i0.. (rows) against key columns j0.. (cols). Recomputes the probabilities,
// adds to dV and dK of the key block (dvacc, dkacc) and to dQ.
template <class T>
REMAT_INLINE void backward_tile(const Problem<T>& pb, int64_t bh, const BackwardWorkspace<T>& w, int64_t i0,
                                int64_t rows, int64_t j0, int64_t cols) {
  constexpr int64_t B = kBlock<T>;
  const T* lse = pb.lse + bh * pb.tq;
  const int64_t d = pb.d, dv = pb.dv, tkp = pb.tkp, dp = pb.dp, dvp = pb.dvp;
  const bool dropout = pb.dropout_p > 0.0;
  T *p = w.p, *at = w.at, *z = w.z;
  tile_dots<T>(w.qp + i0 * dp, dp, rows, d, w.kt + j0, tkp, p);
  for (int64_t r = 0; r < rows; ++r) {
    T* pr = p + r * B;
    const int64_t valid = visible_keys(pb.causal, i0 + r, j0, cols);
    scale_mask_max(pr, pb.scale, valid, T(0));
    exp_shifted_sum(pr, lse[i0 + r]);
    if (dropout) dropout_factors(pb, bh, i0 + r, j0, cols, z + r * B);
    for (int64_t c = 0; c < cols; ++c) at[c * B + r] = dropout ? pr[c] * z[r * B + c] : pr[c];
  }
  // dV[c] += sum_r (P o Z)[r][c] * dO[r]
  tile_accumulate<T>(w.dvacc, dvp, at, B, cols, rows, w.dop + i0 * dvp, dvp, dvp);
  // dP~[r][c] = dO[r] . V[c]
  tile_dots<T>(w.dop + i0 * dvp, dvp, rows, dv, w.vt + j0, tkp, w.dpd);
  for (int64_t r = 0; r < rows; ++r) {
    const T* pr = p + r * B;
    const T* gr = w.dpd + r * B;
    const T* zr = z + r * B;
    T* dsr = w.ds + r * B;
    const T dr = w.drow[i0 + r];
    const T scale = pb.scale;
    for (int64_t c = 0; c < cols; ++c) {
      const T dp_rc = dropout ? gr[c] * zr[c] : gr[c];
      const T value = pr[c] * (dp_rc - dr) * scale;
      dsr[c] = value;
      w.dst[c * B + r] = value;
    }
  }
  // dQ[r] += sum_c dS[r][c] * K[c];  dK[c] += sum_r dS[r][c] * Q[r]
  tile_accumulate<T>(w.dq + i0 * dp, dp, w.ds, B, rows, cols, w.kp + j0 * dp, dp, dp);
  tile_accumulate<T>(w.dkacc, dp, w.dst, B, cols, rows, w.qp + i0 * dp, dp, dp);
}

template <class T>
REMAT_INLINE void attention_backward_one(const Problem<T>& pb, int64_t bh, T* ws) {
  constexpr int64_t B = kBlock<T>;
  const int64_t b = bh / pb.heads, h = bh % pb.heads;
  const int64_t d = pb.d, dv = pb.dv, tq = pb.tq, tk = pb.tk, dp = pb.dp, dvp = pb.dvp;
  const BackwardWorkspace<T> w(pb, ws);
  pack_backward_operands(pb, b, h, w);
  for (int64_t j0 = 0; j0 < tk; j0 += B) {
    const int64_t cols = std::min(B, tk - j0);
    std::fill(w.dkacc, w.dkacc + cols * dp, T(0));
    std::fill(w.dvacc, w.dvacc + cols * dvp, T(0));
    // under the causal mask, queries before j0 see no key of this block
    for (int64_t i0 = pb.causal ? j0 / B * B : 0; i0 < tq; i0 += B)
      backward_tile(pb, bh, w, i0, std::min(B, tq - i0), j0, cols);
    T* gk = pb.gk.at(b, h);
    T* gv = pb.gv.at(b, h);
    for (int64_t c = 0; c < cols; ++c) {
      std::memcpy(gk + (j0 + c) * pb.gk.st, w.dkacc + c * dp, static_cast<size_t>(d) * sizeof(T));
      std::memcpy(gv + (j0 + c) * pb.gv.st, w.dvacc + c * dvp, static_cast<size_t>(dv) * sizeof(T));
    }
  }
  T* gq = pb.gq.at(b, h);
  for (int64_t i = 0; i < tq; ++i) std::memcpy(gq + i * pb.gq.st, w.dq + i * dp, static_cast<size_t>(d) * sizeof(T));
}

// The per-(b, h) workers, compiled for each level (cpu_level.h).
REMAT_CPU_LEVELS(void, attention_forward_f32, (const Problem<float>& pb, int64_t bh, float* ws), (pb, bh, ws)) {
  attention_forward_one<float>(pb, bh, ws);
}
REMAT_CPU_LEVELS(void, attention_forward_f64, (const Problem<double>& pb, int64_t bh, double* ws), (pb, bh, ws)) {
  attention_forward_one<double>(pb, bh, ws);
}
REMAT_CPU_LEVELS(void, attention_backward_f32, (const Problem<float>& pb, int64_t bh, float* ws), (pb, bh, ws)) {
  attention_backward_one<float>(pb, bh, ws);
}
REMAT_CPU_LEVELS(void, attention_backward_f64, (const Problem<double>& pb, int64_t bh, double* ws), (pb, bh, ws)) {
  attention_backward_one<double>(pb, bh, ws);
}

template <class T>
void run_forward(const Problem<T>& pb, int64_t bh, T* ws) {
  if constexpr (sizeof(T) == 4) attention_forward_f32(pb, bh, ws);
  else attention_forward_f64(pb, bh, ws);
}
template <class T>
void run_backward(const Problem<T>& pb, int64_t bh, T* ws) {
  if constexpr (sizeof(T) == 4) attention_backward_f32(pb, bh, ws);
  else attention_backward_f64(pb, bh, ws);
}

template <class T>
Problem<T> make_problem(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const AttentionParams& params) {
  Problem<T> pb{};
  pb.batch = q.size(0), pb.heads = q.size(1), pb.tq = q.size(2), pb.tk = k.size(2), pb.d = q.size(3),
  pb.dv = v.size(3);
  pb.causal = params.causal;
  pb.scale = static_cast<T>(params.scale);
  pb.dropout_p = params.dropout_p;
  pb.state = params.dropout_state;
  pb.q = operand<T>(q), pb.k = operand<T>(k), pb.v = operand<T>(v), pb.out = operand<T>(out);
  pb.lse = lse.data<T>();
  constexpr int64_t B = kBlock<T>, W = Simd<T>::W;
  pb.tqp = round_up(pb.tq, B), pb.tkp = round_up(pb.tk, B), pb.dp = round_up(pb.d, W), pb.dvp = round_up(pb.dv, W);
  return pb;
}

// Runs worker(bh, workspace) for every (b, h), in parallel when the work pays for the threads.
template <class T, class Worker>
void for_each_head(const Problem<T>& pb, size_t workspace, Worker&& worker) {
  const int64_t n = pb.batch * pb.heads;
  const double work = static_cast<double>(n) * static_cast<double>(pb.tq) * static_cast<double>(pb.tk) *
                      static_cast<double>(pb.d + pb.dv);
  int threads = work >= 1 << 18 ? std::min<int64_t>(omp_get_max_threads(), n) : 1;
  if (threads < 1) threads = 1;
  const size_t per_thread = round_up(static_cast<int64_t>(workspace), 64 / static_cast<int64_t>(sizeof(T)));
  Tensor scratch = Tensor::empty({static_cast<int64_t>(per_thread) * threads}, sizeof(T) == 4 ? DType::f32 : DType::f64);
  T* base = scratch.data<T>();
  if (threads == 1) {
    for (int64_t bh = 0; bh < n; ++bh) worker(bh, base);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t bh = 0; bh < n; ++bh) worker(bh, base + per_thread * static_cast<size_t>(omp_get_thread_num()));
}

void check_attention_out(const Tensor& t, const char* what) {
  REMAT_ASSERT(!t.defined() || t.numel() == 0 || t.strides().back() == 1, "attention: ", what, " of shape ",
               shape_str(t.shape()), " needs unit stride along its last axis");
}

// Inputs with a non-unit stride along the last axis are copied (the op never passes such).
Tensor unit_last_stride(const Tensor& t) {
  if (t.numel() == 0 || t.strides().back() == 1) return t;
  return contiguous_input(t);
}

}  // namespace

void CpuKernels::attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const AttentionParams& params,
                           const Tensor& out, const Tensor& lse) {
  check_attention_out(out, "output");
  REMAT_ASSERT(lse.is_contiguous(), "attention: log-sum-exp must be contiguous");
  if (out.numel() == 0) return;
  Tensor q = unit_last_stride(q_in), k = unit_last_stride(k_in), v = unit_last_stride(v_in);
  dispatch_float(q.dtype(), "attention", [&]<class T>() {
    Problem<T> pb = make_problem<T>(q, k, v, out, lse, params);
    for_each_head(pb, forward_workspace(pb), [&](int64_t bh, T* ws) { run_forward(pb, bh, ws); });
  });
}

void CpuKernels::attention_backward(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& out_in,
                                    const Tensor& lse, const Tensor& gout_in, const AttentionParams& params,
                                    const Tensor& gq, const Tensor& gk, const Tensor& gv) {
  check_attention_out(gq, "query gradient");
  check_attention_out(gk, "key gradient");
  check_attention_out(gv, "value gradient");
  REMAT_ASSERT(lse.is_contiguous(), "attention_backward: log-sum-exp must be contiguous");
  Tensor q = unit_last_stride(q_in), k = unit_last_stride(k_in), v = unit_last_stride(v_in),
         out = unit_last_stride(out_in), gout = unit_last_stride(gout_in);
  dispatch_float(q.dtype(), "attention_backward", [&]<class T>() {
    if (gout.numel() == 0) {  // no queries or an empty value size: the output is empty, its gradients zero
      for (const Tensor* g : {&gq, &gk, &gv})
        if (g->numel() > 0) fill(*g, 0.0);
      return;
    }
    Problem<T> pb = make_problem<T>(q, k, v, out, lse, params);
    pb.gout = operand<T>(gout), pb.gq = operand<T>(gq), pb.gk = operand<T>(gk), pb.gv = operand<T>(gv);
    for_each_head(pb, backward_workspace(pb), [&](int64_t bh, T* ws) { run_backward(pb, bh, ws); });
  });
}

}  // namespace remat::cpu
