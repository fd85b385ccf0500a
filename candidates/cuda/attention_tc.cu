// Candidate: fused attention on tensor cores, float32, bf16 and f16, equal head sizes 32 and 64,
// for the attention and attention_backward rows, whose library kernels (src/tensor/cuda/attention.cu,
// on CUDA cores) would keep every other case. The harness checks it against them with a tolerance
// (the products are taken in another order and precision).
//
// Note [tiled attention on tensor cores]. The FlashAttention-2 scheme with blocks of four warps:
//   forward   a block takes 64 query rows of one (b, h), 16 per warp, and walks tiles of 64 keys
//             staged in shared memory; each warp computes its 16 x 64 scores S = Q K^T, keeps each
//             row's running maximum and (per lane, summed over the lane's quad at the end) its sum
//             of exp2 in float32 (online softmax: the output is rescaled when the maximum grows),
//             and adds P V into its 16 x D output in registers. Tiles above the causal diagonal are
//             never loaded. It writes the output and each row's log-sum-exp.
//   backward  delta = rowsum(dO o O) as before (attention.cu); then a block per tile of 64 keys
//             walks the query tiles in order with dK and dV of its keys in registers (S^T = K Q^T,
//             dP^T = V dO^T, dV += (P o Z)^T dO, dK += dS^T Q), and a block per tile of 64 queries
//             walks the key tiles in order with dQ in registers (S and dP again, dQ += dS K). No
//             two blocks write one element and no floating atomics are used: every gradient
//             element is one thread's sums in a fixed order, so runs give the same bits.
// Products: mma.sync m16n8k8 with TF32 operands and float32 accumulation, each operand split as
// x = big + small (big = tf32(x), small = tf32(x - big)) and a * b taken as a_small b_big +
// a_big b_small + a_big b_big (3xTF32): about float32's accuracy (the dropped a_small b_small is
// below 2^-22 relative). Fragment layouts are PTX's: lane = 4 g + t holds A (16 x 8) elements
// (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4), B (8 x 8) elements (t, g), (t + 4, g) and C (16 x
// 8) elements (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1). A probability tile in C layout
// becomes the A operand of the next product without moving: its 8 keys k are taken in the order
// 0, 2, 4, 6, 1, 3, 5, 7, and the B operand's rows are read in the same order.
//
// Note [16-bit attention on tensor cores]. For bf16 and f16 operands the same kernels (the same
// tiles, walks and orders, float32 tiles in shared memory holding the 16-bit values exactly, the
// online softmax, log-sum-exp and delta in float32, each output element rounded once) take their
// products as one mma.sync m16n8k16 with 16-bit operands and float32 accumulation instead of three
// TF32 ones. Q, K, V and dO are 16-bit values, so their products (S, dP) are exact products summed
// in float32; the probabilities P o Z and dS enter the next products rounded to the operand type,
// as FlashAttention-2 and cuDNN do, so these results are close to the float32 kernel's on the same
// values, not equal to them. Fragment layouts for k = 16: lane = 4 g + t holds A elements (g, 2t),
// (g, 2t + 1) in its first register, (g + 8, 2t..2t + 1) in the second, (g, 2t + 8..2t + 9) and
// (g + 8, 2t + 8..2t + 9) in the third and fourth; B elements (2t..2t + 1, g) and (2t + 8..2t + 9,
// g); C as for k = 8. Two C-layout tiles of 8 keys are then the A operand of 16 keys as they are.
// Neither the kernels nor cuDNN's fused attention (another possible candidate, not written) has run
// on a device.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "candidates/cuda/attention_tc.cuh"

namespace remat::cuda::attention_detail {

namespace {

constexpr int kRows = 64;     // query rows (forward, dQ) or keys (dK, dV) per block
constexpr int kKeys = 64;     // keys (forward, dQ) or query rows (dK, dV) per tile walked
constexpr int kThreadsTc = 128;  // four warps, 16 rows each
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---- 3xTF32 products on the tensor cores

struct Split {
  uint32_t big, small;
};
__device__ inline uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
__device__ inline Split split(float x) {
  const uint32_t big = to_tf32(x);
  return {big, to_tf32(x - __uint_as_float(big))};
}
__device__ inline void mma_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// d += a b in float32 accuracy: the small terms first, then big by big.
__device__ inline void mma3(float (&d)[4], const Split (&a)[4], const Split (&b)[2]) {
  mma_tf32(d, a[0].small, a[1].small, a[2].small, a[3].small, b[0].big, b[1].big);
  mma_tf32(d, a[0].big, a[1].big, a[2].big, a[3].big, b[0].small, b[1].small);
  mma_tf32(d, a[0].big, a[1].big, a[2].big, a[3].big, b[0].big, b[1].big);
}

// ---- 16-bit products (Note [16-bit attention on tensor cores]): two floats rounded to S, packed
// with the lower index in the low half
template <class S>
__device__ inline uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<S, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&r, &v, sizeof r);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&r, &v, sizeof r);
  }
  return r;
}
// d += a b, a 16 x 16, b 16 x 8, in float32
template <class S>
__device__ inline void mma16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<S, __nv_bfloat16>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ---- fragments from shared memory (row-major tiles with leading dimension ld)

struct Lane {
  int g, t;  // lane = 4 g + t
};
__device__ inline Lane lane_of() {
  const int lane = threadIdx.x & 31;
  return {lane >> 2, lane & 3};
}
// A (16 x 8) = s[row0.., k0..]
__device__ inline void load_a(const float* s, int ld, int row0, int k0, Lane l, Split (&a)[4]) {
  a[0] = split(s[(row0 + l.g) * ld + k0 + l.t]);
  a[1] = split(s[(row0 + l.g + 8) * ld + k0 + l.t]);
  a[2] = split(s[(row0 + l.g) * ld + k0 + l.t + 4]);
  a[3] = split(s[(row0 + l.g + 8) * ld + k0 + l.t + 4]);
}
// B (8 x 8) = s[n0.., k0..]^T: a tile stored with n as its rows
__device__ inline void load_b_rows_n(const float* s, int ld, int n0, int k0, Lane l, Split (&b)[2]) {
  b[0] = split(s[(n0 + l.g) * ld + k0 + l.t]);
  b[1] = split(s[(n0 + l.g) * ld + k0 + l.t + 4]);
}
// B (8 x 8) = s[k0.., n0..], its 8 rows k in the order 0, 2, 4, 6, 1, 3, 5, 7 (the Note)
__device__ inline void load_b_rows_k(const float* s, int ld, int k0, int n0, Lane l, Split (&b)[2]) {
  b[0] = split(s[(k0 + 2 * l.t) * ld + n0 + l.g]);
  b[1] = split(s[(k0 + 2 * l.t + 1) * ld + n0 + l.g]);
}
// A from a C-layout tile c (16 x 8), its columns in the order 0, 2, 4, 6, 1, 3, 5, 7
__device__ inline void a_from_c(const float (&c)[4], Split (&a)[4]) {
  a[0] = split(c[0]);
  a[1] = split(c[2]);
  a[2] = split(c[1]);
  a[3] = split(c[3]);
}
// The same for k = 16 and 16-bit operands: A (16 x 16) = s[row0.., k0..]
template <class S>
__device__ inline void load_a16(const float* s, int ld, int row0, int k0, Lane l, uint32_t (&a)[4]) {
  const float* r0 = s + (row0 + l.g) * ld + k0 + 2 * l.t;
  const float* r8 = r0 + 8 * ld;
  a[0] = pack2<S>(r0[0], r0[1]);
  a[1] = pack2<S>(r8[0], r8[1]);
  a[2] = pack2<S>(r0[8], r0[9]);
  a[3] = pack2<S>(r8[8], r8[9]);
}
// B (16 x 8) = s[n0.., k0..]^T
template <class S>
__device__ inline void load_b16_rows_n(const float* s, int ld, int n0, int k0, Lane l, uint32_t (&b)[2]) {
  const float* r = s + (n0 + l.g) * ld + k0 + 2 * l.t;
  b[0] = pack2<S>(r[0], r[1]);
  b[1] = pack2<S>(r[8], r[9]);
}
// B (16 x 8) = s[k0.., n0..]
template <class S>
__device__ inline void load_b16_rows_k(const float* s, int ld, int k0, int n0, Lane l, uint32_t (&b)[2]) {
  const float* c = s + (k0 + 2 * l.t) * ld + n0 + l.g;
  b[0] = pack2<S>(c[0], c[ld]);
  b[1] = pack2<S>(c[8 * ld], c[9 * ld]);
}
// A (16 x 16) from the C-layout tiles of keys 0..7 (c0) and 8..15 (c1), in order
template <class S>
__device__ inline void a16_from_c(const float (&c0)[4], const float (&c1)[4], uint32_t (&a)[4]) {
  a[0] = pack2<S>(c0[0], c0[1]);
  a[1] = pack2<S>(c0[2], c0[3]);
  a[2] = pack2<S>(c1[0], c1[1]);
  a[3] = pack2<S>(c1[2], c1[3]);
}

// Rows [t0, t0 + 64) of a [B, H, T, D] operand into dst[64][ld], zero past `limit` (16-bit
// elements widened, exactly).
template <int D, class S>
__device__ inline void load_tile(const Operand<const S>& src, int64_t bh, int64_t heads, int64_t t0, int64_t limit,
                                 float* dst, int ld) {
  for (int x = threadIdx.x; x < kRows * D; x += kThreadsTc) {
    const int r = x / D, e = x % D;
    dst[r * ld + e] = t0 + r < limit ? convert<float>(src.row(bh, heads, t0 + r)[e]) : 0.0f;
  }
}
// 64 values of a [B * H, T] row vector (log-sum-exp, delta) into dst, zero past `limit`.
__device__ inline void load_row_values(const float* src, int64_t t0, int64_t limit, float* dst) {
  for (int x = threadIdx.x; x < kKeys; x += kThreadsTc) dst[x] = t0 + x < limit ? src[t0 + x] : 0.0f;
}

// a max in which a NaN wins (so a NaN score makes its row NaN, as in attention.cu)
__device__ inline float nan_max(float a, float b) { return b > a || b != b ? b : a; }

// The warp's two 16 x 64 tiles s = x[row0..] y^T and t = g[row0..] w^T (rows of D values; y and w
// 64 rows each), both in C layout: S and dP in the dQ kernel, S^T and dP^T in the dK/dV kernel.
template <int D>
__device__ inline void score_tiles(const float* x, const float* g, const float* y, const float* w, int ld, int row0,
                                   Lane l, float (&s)[8][4], float (&t)[8][4]) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = t[nt][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 8; ++kk) {
    Split xa[4], ga[4];
    load_a(x, ld, row0, kk * 8, l, xa);
    load_a(g, ld, row0, kk * 8, l, ga);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      Split b[2];
      load_b_rows_n(y, ld, nt * 8, kk * 8, l, b);
      mma3(s[nt], xa, b);
      load_b_rows_n(w, ld, nt * 8, kk * 8, l, b);
      mma3(t[nt], ga, b);
    }
  }
}

// acc (16 x D, C layout) += c (the warp's 16 x 64 tile in C layout) y (64 rows of D values): P V
// in the forward, (P o Z)^T dO and dS^T Q for dV and dK, dS K for dQ. Each acc element adds its 8
// key blocks in order.
template <int D>
__device__ inline void add_product(const float (&c)[8][4], const float* y, int ld, Lane l, float (&acc)[D / 8][4]) {
#pragma unroll
  for (int kb = 0; kb < 8; ++kb) {
    Split a[4];
    a_from_c(c[kb], a);
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      Split b[2];
      load_b_rows_k(y, ld, kb * 8, nt * 8, l, b);
      mma3(acc[nt], a, b);
    }
  }
}

// score_tiles and add_product with 16-bit operands S: k = 16 a product, the A operand of
// add_product two C-layout tiles of 8 keys as they are (Note [16-bit attention on tensor cores]).
template <int D, class S>
__device__ inline void score_tiles_16(const float* x, const float* g, const float* y, const float* w, int ld,
                                      int row0, Lane l, float (&s)[8][4], float (&t)[8][4]) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = t[nt][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t xa[4], ga[4];
    load_a16<S>(x, ld, row0, kk * 16, l, xa);
    load_a16<S>(g, ld, row0, kk * 16, l, ga);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      uint32_t b[2];
      load_b16_rows_n<S>(y, ld, nt * 8, kk * 16, l, b);
      mma16<S>(s[nt], xa, b);
      load_b16_rows_n<S>(w, ld, nt * 8, kk * 16, l, b);
      mma16<S>(t[nt], ga, b);
    }
  }
}
template <int D, class S>
__device__ inline void add_product_16(const float (&c)[8][4], const float* y, int ld, Lane l, float (&acc)[D / 8][4]) {
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) {
    uint32_t a[4];
    a16_from_c<S>(c[2 * kb], c[2 * kb + 1], a);
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      uint32_t b[2];
      load_b16_rows_k<S>(y, ld, kb * 16, nt * 8, l, b);
      mma16<S>(acc[nt], a, b);
    }
  }
}

// The products of storage type S: 3xTF32 for float, one 16-bit product for bf16 and f16.
template <int D, class S>
__device__ inline void score_tiles_of(const float* x, const float* g, const float* y, const float* w, int ld,
                                      int row0, Lane l, float (&s)[8][4], float (&t)[8][4]) {
  if constexpr (is_half_v<S>) score_tiles_16<D, S>(x, g, y, w, ld, row0, l, s, t);
  else score_tiles<D>(x, g, y, w, ld, row0, l, s, t);
}
template <int D, class S>
__device__ inline void add_product_of(const float (&c)[8][4], const float* y, int ld, Lane l, float (&acc)[D / 8][4]) {
  if constexpr (is_half_v<S>) add_product_16<D, S>(c, y, ld, l, acc);
  else add_product<D>(c, y, ld, l, acc);
}

// ---- forward

template <class S, int D>
__global__ void __launch_bounds__(kThreadsTc) forward_tc_kernel(Problem<S> pb) {
#if __CUDA_ARCH__ >= 800
  constexpr int kLd = D + 4, kK = D / 8;
  extern __shared__ float smem[];
  float* qs = smem;              // [64][kLd]
  float* ks = qs + kRows * kLd;  // [64][kLd]
  float* vs = ks + kKeys * kLd;  // [64][kLd]
  const Lane l = lane_of();
  const int warp = threadIdx.x >> 5;
  const int64_t bh = blockIdx.y, i0 = int64_t(gridDim.x - 1 - blockIdx.x) * kRows;  // long causal rows first
  load_tile<D>(pb.q, bh, pb.heads, i0, pb.tq, qs, kLd);
  __syncthreads();
  constexpr bool kHalf = is_half_v<S>;
  Split qa[kHalf ? 1 : kK][4];  // the 16-bit products read Q's fragments from shared memory
  if constexpr (!kHalf) {
#pragma unroll
    for (int kk = 0; kk < kK; ++kk) load_a(qs, kLd, warp * 16, kk * 8, l, qa[kk]);
  }
  float o[kK][4];
#pragma unroll
  for (int nt = 0; nt < kK; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.0f, 0.0f};  // per row g, g + 8 (lsum: this lane's part)
  const int64_t rows[2] = {i0 + warp * 16 + l.g, i0 + warp * 16 + l.g + 8};
  const float scale2 = pb.scale * kLog2e;
  const int64_t key_end = pb.causal ? min(pb.tk, i0 + kRows) : pb.tk;
  for (int64_t j0 = 0; j0 < key_end; j0 += kKeys) {
    __syncthreads();
    load_tile<D>(pb.k, bh, pb.heads, j0, pb.tk, ks, kLd);
    load_tile<D>(pb.v, bh, pb.heads, j0, pb.tk, vs, kLd);
    __syncthreads();
    float s[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
      if constexpr (kHalf) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          uint32_t a[4], b[2];
          load_a16<S>(qs, kLd, warp * 16, kk * 16, l, a);
          load_b16_rows_n<S>(ks, kLd, nt * 8, kk * 16, l, b);
          mma16<S>(s[nt], a, b);
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < kK; ++kk) {
          Split b[2];
          load_b_rows_n(ks, kLd, nt * 8, kk * 8, l, b);
          mma3(s[nt], qa[kk], b);
        }
      }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t i = rows[e >> 1], j = j0 + nt * 8 + 2 * l.t + (e & 1);
        const float v = i < pb.tq && pb.visible(i, j) ? s[nt][e] * scale2 : -INFINITY;
        s[nt][e] = v;
        mx[e >> 1] = nan_max(mx[e >> 1], v);
      }
    float alpha[2], base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = nan_max(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = nan_max(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = nan_max(m[r], mx[r]);
      base[r] = m_new == -INFINITY ? 0.0f : m_new;  // nothing visible yet: every p is 0
      alpha[r] = exp2f(m[r] - base[r]);             // 0 on the first visible tile
      m[r] = m_new;
      lsum[r] *= alpha[r];
    }
#pragma unroll
    for (int nt = 0; nt < kK; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[nt][e] *= alpha[e >> 1];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[nt][e] - base[e >> 1]);
        lsum[e >> 1] += p;
        const int64_t i = rows[e >> 1], j = j0 + nt * 8 + 2 * l.t + (e & 1);
        s[nt][e] = pb.p > 0.0 && p != 0.0f ? p * pb.dropout_factor(bh, i, j) : p;
      }
    add_product_of<D, S>(s, vs, kLd, l, o);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lsum[r] += __shfl_xor_sync(0xffffffffu, lsum[r], 1);
    lsum[r] += __shfl_xor_sync(0xffffffffu, lsum[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = rows[r];
    if (i >= pb.tq) continue;
    const float inv = 1.0f / lsum[r];
    S* dst = pb.o.row(bh, pb.heads, i);
#pragma unroll
    for (int nt = 0; nt < kK; ++nt) {
      dst[nt * 8 + 2 * l.t] = convert<S>(o[nt][2 * r] * inv);
      dst[nt * 8 + 2 * l.t + 1] = convert<S>(o[nt][2 * r + 1] * inv);
    }
    if (l.t == 0) pb.lse_out[bh * pb.tq + i] = (m[r] + log2f(lsum[r])) * kLn2;
  }
#endif
}

// ---- backward: dK and dV of a tile of keys

template <class S, int D>
__global__ void __launch_bounds__(kThreadsTc) dkdv_tc_kernel(Problem<S> pb) {
#if __CUDA_ARCH__ >= 800
  constexpr int kLd = D + 4, kK = D / 8;
  extern __shared__ float smem[];
  float* ks = smem;               // [64 keys][kLd]
  float* vs = ks + kRows * kLd;   // [64 keys][kLd]
  float* qs = vs + kRows * kLd;   // [64 queries][kLd]
  float* gs = qs + kKeys * kLd;   // [64 queries][kLd]
  float* lse_s = gs + kKeys * kLd;  // [64]
  float* delta_s = lse_s + kKeys;   // [64]
  const Lane l = lane_of();
  const int warp = threadIdx.x >> 5;
  const int64_t bh = blockIdx.y, j0 = int64_t(blockIdx.x) * kRows;
  load_tile<D>(pb.k, bh, pb.heads, j0, pb.tk, ks, kLd);
  load_tile<D>(pb.v, bh, pb.heads, j0, pb.tk, vs, kLd);
  float dk[kK][4], dv[kK][4];
#pragma unroll
  for (int nt = 0; nt < kK; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[nt][e] = dv[nt][e] = 0.0f;
  const int64_t keys[2] = {j0 + warp * 16 + l.g, j0 + warp * 16 + l.g + 8};
  const float scale2 = pb.scale * kLog2e;
  for (int64_t i0 = pb.causal ? j0 : 0; i0 < pb.tq; i0 += kKeys) {
    __syncthreads();
    load_tile<D>(pb.q, bh, pb.heads, i0, pb.tq, qs, kLd);
    load_tile<D>(pb.gout, bh, pb.heads, i0, pb.tq, gs, kLd);
    load_row_values(pb.lse + bh * pb.tq, i0, pb.tq, lse_s);
    load_row_values(pb.delta + bh * pb.tq, i0, pb.tq, delta_s);
    __syncthreads();
    float st[8][4], dpt[8][4];  // S^T and dP^T: 16 keys x 64 queries
    score_tiles_of<D, S>(ks, vs, qs, gs, kLd, warp * 16, l, st, dpt);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = nt * 8 + 2 * l.t + (e & 1);
        const int64_t i = i0 + c, j = keys[e >> 1];
        float pz = 0.0f, ds = 0.0f;
        if (i < pb.tq && pb.visible(i, j)) {
          const float p = exp2f(st[nt][e] * scale2 - lse_s[c] * kLog2e);
          const float z = pb.dropout_factor(bh, i, j);
          pz = p * z;
          ds = p * (z * dpt[nt][e] - delta_s[c]);
        }
        st[nt][e] = pz;
        dpt[nt][e] = ds;
      }
    add_product_of<D, S>(st, gs, kLd, l, dv);
    add_product_of<D, S>(dpt, qs, kLd, l, dk);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t j = keys[r];
    if (j >= pb.tk) continue;
    S* gk = pb.gk.row(bh, pb.heads, j);
    S* gv = pb.gv.row(bh, pb.heads, j);
#pragma unroll
    for (int nt = 0; nt < kK; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        gk[nt * 8 + 2 * l.t + c] = convert<S>(dk[nt][2 * r + c] * pb.scale);
        gv[nt * 8 + 2 * l.t + c] = convert<S>(dv[nt][2 * r + c]);
      }
  }
#endif
}

// ---- backward: dQ of a tile of queries

template <class S, int D>
__global__ void __launch_bounds__(kThreadsTc) dq_tc_kernel(Problem<S> pb) {
#if __CUDA_ARCH__ >= 800
  constexpr int kLd = D + 4, kK = D / 8;
  extern __shared__ float smem[];
  float* qs = smem;              // [64 queries][kLd]
  float* gs = qs + kRows * kLd;  // [64 queries][kLd]
  float* ks = gs + kRows * kLd;  // [64 keys][kLd]
  float* vs = ks + kKeys * kLd;  // [64 keys][kLd]
  const Lane l = lane_of();
  const int warp = threadIdx.x >> 5;
  const int64_t bh = blockIdx.y, i0 = int64_t(gridDim.x - 1 - blockIdx.x) * kRows;
  load_tile<D>(pb.q, bh, pb.heads, i0, pb.tq, qs, kLd);
  load_tile<D>(pb.gout, bh, pb.heads, i0, pb.tq, gs, kLd);
  const int64_t rows[2] = {i0 + warp * 16 + l.g, i0 + warp * 16 + l.g + 8};
  float lse2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lse2[r] = rows[r] < pb.tq ? pb.lse[bh * pb.tq + rows[r]] * kLog2e : 0.0f;
    delta[r] = rows[r] < pb.tq ? pb.delta[bh * pb.tq + rows[r]] : 0.0f;
  }
  float dq[kK][4];
#pragma unroll
  for (int nt = 0; nt < kK; ++nt) dq[nt][0] = dq[nt][1] = dq[nt][2] = dq[nt][3] = 0.0f;
  const float scale2 = pb.scale * kLog2e;
  const int64_t key_end = pb.causal ? min(pb.tk, i0 + kRows) : pb.tk;
  for (int64_t j0 = 0; j0 < key_end; j0 += kKeys) {
    __syncthreads();
    load_tile<D>(pb.k, bh, pb.heads, j0, pb.tk, ks, kLd);
    load_tile<D>(pb.v, bh, pb.heads, j0, pb.tk, vs, kLd);
    __syncthreads();
    float s[8][4], dp[8][4];  // S and dP: 16 queries x 64 keys
    score_tiles_of<D, S>(qs, gs, ks, vs, kLd, warp * 16, l, s, dp);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t i = rows[e >> 1], j = j0 + nt * 8 + 2 * l.t + (e & 1);
        float ds = 0.0f;
        if (i < pb.tq && pb.visible(i, j)) {
          const float p = exp2f(s[nt][e] * scale2 - lse2[e >> 1]);
          ds = p * (pb.dropout_factor(bh, i, j) * dp[nt][e] - delta[e >> 1]);
        }
        s[nt][e] = ds;
      }
    add_product_of<D, S>(s, ks, kLd, l, dq);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = rows[r];
    if (i >= pb.tq) continue;
    S* gq = pb.gq.row(bh, pb.heads, i);
#pragma unroll
    for (int nt = 0; nt < kK; ++nt) {
      gq[nt * 8 + 2 * l.t] = convert<S>(dq[nt][2 * r] * pb.scale);
      gq[nt * 8 + 2 * l.t + 1] = convert<S>(dq[nt][2 * r + 1] * pb.scale);
    }
  }
#endif
}

// ---- launches

template <class Kernel, class S>
void launch_tc(Kernel kernel, unsigned tiles, int64_t bh, size_t bytes, cudaStream_t stream, const Problem<S>& pb,
               const char* what) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
        "cudaFuncSetAttribute");
  kernel<<<dim3(tiles, static_cast<unsigned>(bh)), kThreadsTc, bytes, stream>>>(pb);
  check_launch(what);
}

unsigned tiles_of(int64_t n) { return static_cast<unsigned>((n + kRows - 1) / kRows); }
size_t tile_bytes(int64_t d) { return sizeof(float) * static_cast<size_t>(kRows * (d + 4)); }

}  // namespace

bool takes_tc(int64_t d, int64_t dv, int64_t tq, int64_t tk, int64_t bh, int device) {
  if (d != dv || (d != 32 && d != 64) || tq == 0 || tk == 0 || bh > 65535) return false;
  int major = 0;
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
  return major >= 8;
}

template <class S>
bool forward_tc(const Problem<S>& pb, int64_t bh, cudaStream_t stream, int device) {
  if (!takes_tc(pb.d, pb.dv, pb.tq, pb.tk, bh, device)) return false;
  const size_t bytes = 3 * tile_bytes(pb.d);
  if (pb.d == 64) launch_tc(forward_tc_kernel<S, 64>, tiles_of(pb.tq), bh, bytes, stream, pb, "attention (tensor cores)");
  else launch_tc(forward_tc_kernel<S, 32>, tiles_of(pb.tq), bh, bytes, stream, pb, "attention (tensor cores)");
  return true;
}

template <class S>
bool backward_tc(const Problem<S>& pb, int64_t bh, cudaStream_t stream, int device) {
  if (!takes_tc(pb.d, pb.dv, pb.tq, pb.tk, bh, device)) return false;
  const size_t kv_bytes = 4 * tile_bytes(pb.d) + 2 * kKeys * sizeof(float), q_bytes = 4 * tile_bytes(pb.d);
  const char* kv = "attention_backward (dk, dv, tensor cores)";
  const char* q = "attention_backward (dq, tensor cores)";
  if (pb.d == 64) {
    launch_tc(dkdv_tc_kernel<S, 64>, tiles_of(pb.tk), bh, kv_bytes, stream, pb, kv);
    launch_tc(dq_tc_kernel<S, 64>, tiles_of(pb.tq), bh, q_bytes, stream, pb, q);
  } else {
    launch_tc(dkdv_tc_kernel<S, 32>, tiles_of(pb.tk), bh, kv_bytes, stream, pb, kv);
    launch_tc(dq_tc_kernel<S, 32>, tiles_of(pb.tq), bh, q_bytes, stream, pb, q);
  }
  return true;
}

#define REMAT_TC_INSTANCES(S)                                                       \
  template bool forward_tc<S>(const Problem<S>&, int64_t, cudaStream_t, int);  \
  template bool backward_tc<S>(const Problem<S>&, int64_t, cudaStream_t, int);
REMAT_TC_INSTANCES(float)
REMAT_TC_INSTANCES(__nv_bfloat16)
REMAT_TC_INSTANCES(__half)
#undef REMAT_TC_INSTANCES

}  // namespace remat::cuda::attention_detail
