// The CUDA candidates (candidates/cuda/candidates.h) as harness entries: for each, the library's
// kernel for its row and the candidate on the same inputs, at GPT-2 small's shapes (timed) and at
// shapes that reach each candidate's edges (odd sizes, float64, 16-bit, what it declines).
#include "candidates/cuda_candidates.h"

#include <cmath>
#include <string>
#include <vector>

#include "candidates/cuda/candidates.h"
#include "remat/random.h"

namespace remat::candidates {

namespace {

namespace cc = remat::candidates::cuda;
using remat::cuda::CudaBackend;

struct Maker {
  Device device;
  CudaBackend& be;
  uint64_t seed = 1;
  Tensor normal(const Shape& shape, DType dtype, double stddev = 1.0) {
    return randn(shape, dtype, RngState{seed++, 0}, 0.0, stddev, device);
  }
  Tensor empty(const Shape& shape, DType dtype) { return Tensor::empty(shape, dtype, memory::Tag::other, device); }
  bool sixteen_bit() const { return be.holds(DType::bf16); }
  Tensor ids(int64_t n, int64_t bound) {
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = (i * 7919 + static_cast<int64_t>(seed)) % bound;
    ++seed;
    return from_indices(v, {n}, device);
  }
};

std::string dims(const Shape& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) out += (i ? " x " : "") + std::to_string(s[i]);
  return out;
}

// ---- attention (tensor cores)

Case attention_case(Maker m, std::string name, bool timed, int64_t b, int64_t h, int64_t tq, int64_t tk, int64_t d,
                    DType dtype, bool causal, double dropout) {
  return {std::move(name), timed, [=]() mutable {
            Tensor q = m.normal({b, h, tq, d}, dtype), k = m.normal({b, h, tk, d}, dtype),
                   v = m.normal({b, h, tk, d}, dtype), gout = m.normal({b, h, tq, d}, dtype);
            AttentionParams p{causal, 1.0 / std::sqrt(static_cast<double>(d)), dropout, RngState{7, 0}};
            const DType acc = accumulate_dtype(dtype);
            Tensor out = m.empty({b, h, tq, d}, dtype), lse = m.empty({b, h, tq}, acc);
            m.be.attention(q, k, v, p, out, lse);  // the library's forward: the backwards' input
            CudaBackend* const backend_ptr = &m.be;  // captured by the closures below
            Maker mk = m;
            auto outputs = [=](bool candidate) mutable -> TensorList {
              CudaBackend& be = *backend_ptr;
              Tensor o = mk.empty({b, h, tq, d}, dtype), l = mk.empty({b, h, tq}, acc);
              Tensor gq = mk.empty(q.shape(), dtype), gk = mk.empty(k.shape(), dtype), gv = mk.empty(v.shape(), dtype);
              if (!candidate) {
                be.attention(q, k, v, p, o, l);
                be.attention_backward(q, k, v, out, lse, gout, p, gq, gk, gv);
              } else if (!cc::attention_tc(be, q, k, v, p, o, l) ||
                         !cc::attention_backward_tc(be, q, k, v, out, lse, gout, p, gq, gk, gv)) {
                return {};
              }
              return {o, l, gq, gk, gv};
            };
            return Trial{[=]() mutable { return outputs(false); }, [=]() mutable { return outputs(true); }, {}};
          }};
}

Candidate attention_tc(const Maker& m, bool sixteen_bit) {
  Candidate c;
  c.replaces = "attention, attention_backward (attention.cu)";
  c.what = "tiled attention on tensor cores, head sizes 32 and 64";
  if (!sixteen_bit) {
    c.name = "attention_tc";
    c.agreement = Agreement::within(1e-4, 1e-3, "3xTF32 products (about float32's accuracy), summed in another order");
    c.cases = {attention_case(m, "GPT-2 small, f32: 8 x 12 x 1024 x 64, causal", true, 8, 12, 1024, 1024, 64,
                              DType::f32, true, 0.0),
               attention_case(m, "f32: 2 x 3 x 77 x 32, causal, dropout 0.1", false, 2, 3, 77, 77, 32, DType::f32, true,
                              0.1),
               attention_case(m, "f32: 1 x 2 x 100 x 64 against 130 keys", false, 1, 2, 100, 130, 64, DType::f32,
                              false, 0.0),
               attention_case(m, "f32: head size 48 (declined)", false, 1, 2, 64, 64, 48, DType::f32, true, 0.0)};
  } else {
    c.name = "attention_tc_16bit";
    c.agreement = Agreement::within(
        3e-2, 3e-2, "bf16 products of the probabilities and dS rounded to bf16, against float32 arithmetic on bf16 values");
    c.cases = {attention_case(m, "GPT-2 small, bf16: 8 x 12 x 1024 x 64, causal", true, 8, 12, 1024, 1024, 64,
                              DType::bf16, true, 0.0),
               attention_case(m, "f16: 2 x 3 x 77 x 32, causal", false, 2, 3, 77, 77, 32, DType::f16, true, 0.0)};
  }
  return c;
}

// ---- elementwise (flat kernels)

Case unary_case(Maker m, std::string name, bool timed, const Shape& shape, DType dtype, UnaryOp op, bool backward,
                bool offset) {
  return {std::move(name), timed, [=]() mutable {
            Tensor x = m.normal({shape[0] * shape[1] + (offset ? 1 : 0)}, dtype);
            if (offset) x = x.slice(0, 1, x.numel());  // one element past a 16-byte boundary
            x = x.reshape(shape);
            Tensor y = m.empty(shape, dtype), gy = m.normal(shape, dtype);
            m.be.unary(op, x, y, 0.0);
            CudaBackend* const backend_ptr = &m.be;  // captured by the closures below
            Maker mk = m;
            auto outputs = [=](bool candidate) mutable -> TensorList {
              CudaBackend& be = *backend_ptr;
              Tensor out = mk.empty(shape, dtype);
              if (!candidate) {
                backward ? be.unary_backward(op, x, y, gy, out, 0.0) : be.unary(op, x, out, 0.0);
                return {out};
              }
              const bool took = backward ? cc::unary_backward_flat(be, op, x, y, gy, out, 0.0)
                                         : cc::unary_flat(be, op, x, out, 0.0);
              return took ? TensorList{out} : TensorList{};
            };
            return Trial{[=]() mutable { return outputs(false); }, [=]() mutable { return outputs(true); }, {}};
          }};
}

Case binary_case(Maker m, std::string name, bool timed, const Shape& shape, DType dtype, BinaryOp op) {
  return {std::move(name), timed, [=]() mutable {
            Tensor a = m.normal(shape, dtype), b = m.normal(shape, dtype);
            CudaBackend* const backend_ptr = &m.be;  // captured by the closures below
            Maker mk = m;
            auto outputs = [=](bool candidate) mutable -> TensorList {
              CudaBackend& be = *backend_ptr;
              Tensor out = mk.empty(shape, dtype);
              if (candidate) return cc::binary_flat(be, op, a, b, out) ? TensorList{out} : TensorList{};
              be.binary(op, a, b, out);
              return {out};
            };
            return Trial{[=]() mutable { return outputs(false); }, [=]() mutable { return outputs(true); }, {}};
          }};
}

Candidate elementwise(const Maker& m) {
  Candidate c{"elementwise_flat", "unary, unary_backward, binary (elementwise.cu)",
              "contiguous operands: 32-bit indices, 16-byte loads and stores", Agreement::bits(), {}};
  const Shape mlp{8 * 1024, 3072};
  c.cases = {unary_case(m, "GPT-2 small MLP, gelu, f32: " + dims(mlp), true, mlp, DType::f32, UnaryOp::gelu, false, false),
             unary_case(m, "GPT-2 small MLP, gelu backward, f32: " + dims(mlp), true, mlp, DType::f32, UnaryOp::gelu,
                        true, false),
             binary_case(m, "GPT-2 small residual add, f32: 8192 x 768", true, {8192, 768}, DType::f32, BinaryOp::add),
             unary_case(m, "tanh, f64: 37 x 41", false, {37, 41}, DType::f64, UnaryOp::tanh, false, false),
             binary_case(m, "maximum, f32: 3 x 1001", false, {3, 1001}, DType::f32, BinaryOp::maximum),
             unary_case(m, "exp, f32, unaligned (declined)", false, {4, 64}, DType::f32, UnaryOp::exp, false, true)};
  return c;
}

// ---- norms

Case norm_backward_case(Maker m, std::string name, bool timed, int64_t rows, int64_t cols, DType dtype, bool rms) {
  return {std::move(name), timed, [=]() mutable {
            const DType acc = accumulate_dtype(dtype);
            Tensor x = m.normal({rows, cols}, dtype), w = m.normal({cols}, dtype), b = m.normal({cols}, dtype);
            Tensor gy = m.normal({rows, cols}, dtype), y = m.empty({rows, cols}, dtype);
            Tensor mean = rms ? Tensor() : m.empty({rows}, acc), rstd = m.empty({rows}, acc);
            if (rms) m.be.rms_norm(x, w, 1e-5, y, rstd);
            else m.be.layer_norm(x, w, b, 1e-5, y, mean, rstd);
            CudaBackend* const backend_ptr = &m.be;  // captured by the closures below
            Maker mk = m;
            auto outputs = [=](bool candidate) mutable -> TensorList {
              CudaBackend& be = *backend_ptr;
              Tensor gx = mk.empty({rows, cols}, dtype), gw = mk.empty({cols}, dtype);
              Tensor gb = rms ? Tensor() : mk.empty({cols}, dtype);
              if (candidate) {
                if (!cc::norm_backward_one_pass(be, x, w, mean, rstd, gy, gx, gw, gb)) return {};
              } else if (rms) {
                be.rms_norm_backward(x, w, rstd, gy, gx, gw);
              } else {
                be.layer_norm_backward(x, w, mean, rstd, gy, gx, gw, gb);
              }
              return rms ? TensorList{gx, gw} : TensorList{gx, gw, gb};
            };
            return Trial{[=]() mutable { return outputs(false); }, [=]() mutable { return outputs(true); }, {}};
          }};
}

Candidate norm_backward(const Maker& m) {
  Candidate c{"norm_backward_one_pass", "layer_norm_backward, rms_norm_backward (rows.cu)",
              "the input gradient and the parameter sums' chunks in one pass over x and gy", Agreement::bits(), {}};
  c.cases = {norm_backward_case(m, "GPT-2 small layer norm, f32: 8192 x 768", true, 8192, 768, DType::f32, false),
             norm_backward_case(m, "RMS norm, f32: 1000 x 2048", false, 1000, 2048, DType::f32, true),
             norm_backward_case(m, "layer norm, f64: 37 x 100", false, 37, 100, DType::f64, false),
             norm_backward_case(m, "layer norm, f32: 64 x 2049 (declined)", false, 64, 2049, DType::f32, false)};
  return c;
}

Case residual_norm_case(Maker m, std::string name, bool timed, int64_t rows, int64_t cols, DType dtype) {
  return {std::move(name), timed, [=]() mutable {
            Tensor x = m.normal({rows, cols}, dtype), r = m.normal({rows, cols}, dtype), w = m.normal({cols}, dtype),
                   b = m.normal({cols}, dtype), gy = m.normal({rows, cols}, dtype), gs = m.normal({rows, cols}, dtype);
            CudaBackend* const backend_ptr = &m.be;  // captured by the closures below
            Maker mk = m;
            auto outputs = [=](bool candidate) mutable -> TensorList {
              CudaBackend& be = *backend_ptr;
              Tensor s = mk.empty({rows, cols}, dtype), y = mk.empty({rows, cols}, dtype), mean = mk.empty({rows}, dtype),
                     rstd = mk.empty({rows}, dtype), gx = mk.empty({rows, cols}, dtype), gw = mk.empty({cols}, dtype),
                     gb = mk.empty({cols}, dtype);
              if (!candidate) {
                be.add_layer_norm(x, r, w, b, 1e-5, s, y, mean, rstd);
                be.add_layer_norm_backward(s, w, mean, rstd, gy, gs, gx, gw, gb);
              } else if (!cc::add_layer_norm_fused(be, x, r, w, b, 1e-5, s, y, mean, rstd) ||
                         !cc::add_layer_norm_backward_fused(be, s, w, mean, rstd, gy, gs, gx, gw, gb)) {
                return {};
              }
              return {s, y, mean, rstd, gx, gw, gb};
            };
            return Trial{[=]() mutable { return outputs(false); }, [=]() mutable { return outputs(true); }, {}};
          }};
}

Candidate residual_norm(const Maker& m) {
  Candidate c{"residual_norm", "add_layer_norm, add_layer_norm_backward (rows.cu: binary then layer_norm)",
              "the residual add fused into layer norm, one kernel each way", Agreement::bits(), {}};
  c.cases = {residual_norm_case(m, "GPT-2 small block, f32: 8192 x 768", true, 8192, 768, DType::f32),
             residual_norm_case(m, "f64: 33 x 300", false, 33, 300, DType::f64),
             residual_norm_case(m, "f32: 16 x 4096 (declined)", false, 16, 4096, DType::f32)};
  return c;
}

// ---- the digest (the library has none on CUDA: the CPU's digest of the same bytes is the reference)

Case digest_case(Maker m, std::string name, bool timed, const Shape& shape, DType dtype, bool transposed) {
  return {std::move(name), timed, [=]() mutable {
            Tensor x = dtype == DType::i64 ? m.ids(shape[0] * shape[1], 1000).reshape(shape) : m.normal(shape, dtype);
            if (transposed) x = x.transpose(0, 1);
            CudaBackend* const backend_ptr = &m.be;  // captured by the closures below
            Maker mk = m;
            auto library = [=]() {
              Tensor host = x.to(kCpu), out = Tensor::empty({1}, DType::i64);
              cpu_backend().digest(host, out);
              return TensorList{out};
            };
            auto candidate = [=]() mutable {
              CudaBackend& be = *backend_ptr;
              Tensor out = mk.empty({1}, DType::i64);
              cc::digest(be, x, out);
              return TensorList{out};
            };
            return Trial{library, candidate, {}};
          }};
}

Candidate digest(const Maker& m) {
  Candidate c{"digest", "digest (none on CUDA: the recomputation check skips device values)",
              "the recomputation check's digest on the device, 8 bytes read back", Agreement::bits(), {}};
  c.cases = {digest_case(m, "GPT-2 small activation, f32: 8192 x 3072", true, {8192, 3072}, DType::f32, false),
             digest_case(m, "f32: 1 x 1", false, {1, 1}, DType::f32, false),
             digest_case(m, "f32: 3 x 5 (a tail of 60 bytes)", false, {3, 5}, DType::f32, false),
             digest_case(m, "f64: 129 x 1031 (blocks and a tail)", false, {129, 1031}, DType::f64, false),
             digest_case(m, "i64: 64 x 1024", false, {64, 1024}, DType::i64, false),
             digest_case(m, "f32: 300 x 70, transposed", false, {300, 70}, DType::f32, true),
             digest_case(m, "f32: 0 x 5", false, {0, 5}, DType::f32, false)};
  if (m.sixteen_bit()) c.cases.push_back(digest_case(m, "bf16: 3 x 7", false, {3, 7}, DType::bf16, false));
  return c;
}

// ---- a linear layer's product and bias (cuBLASLt's epilogue)

Case gemm_bias_case(Maker m, std::string name, bool timed, int64_t rows, int64_t k, int64_t n, DType dtype,
                    bool trans_b) {
  return {std::move(name), timed, [=]() mutable {
            const double scale = 1.0 / std::sqrt(static_cast<double>(k));
            Tensor a = m.normal({1, rows, k}, dtype), b = m.normal(trans_b ? Shape{1, n, k} : Shape{1, k, n}, dtype, scale),
                   bias = m.normal({n}, dtype);
            CudaBackend* const backend_ptr = &m.be;  // captured by the closures below
            Maker mk = m;
            auto outputs = [=](bool candidate) mutable -> TensorList {
              CudaBackend& be = *backend_ptr;
              Tensor c = mk.empty({1, rows, n}, dtype);
              if (candidate) return cc::gemm_bias_epilogue(be, a, false, b, trans_b, bias, c) ? TensorList{c} : TensorList{};
              be.gemm_bias(a, false, b, trans_b, bias, c);
              return {c};
            };
            return Trial{[=]() mutable { return outputs(false); }, [=]() mutable { return outputs(true); }, {}};
          }};
}

Candidate gemm_epilogue(const Maker& m) {
  Candidate c{"gemm_epilogue", "gemm_bias (gemm.cpp: the bias copied into C, then cuBLAS with beta 1)",
              "one cuBLASLt call with the bias epilogue",
              Agreement::within(1e-4, 1e-4, "cuBLASLt's kernels sum the products in another order"), {}};
  c.cases = {gemm_bias_case(m, "GPT-2 small MLP up, f32: 8192 x 768 x 3072", true, 8192, 768, 3072, DType::f32, false),
             gemm_bias_case(m, "GPT-2 small attention out, f32: 8192 x 768 x 768, weight transposed", true, 8192, 768,
                            768, DType::f32, true),
             gemm_bias_case(m, "f64: 33 x 65 x 17", false, 33, 65, 17, DType::f64, false)};
  return c;
}

// ---- the bias gradient's column sums

Case column_sums_case(Maker m, std::string name, bool timed, int64_t rows, int64_t cols, DType dtype) {
  return {std::move(name), timed, [=]() mutable {
            Tensor x = m.normal({rows, cols}, dtype);
            CudaBackend* const backend_ptr = &m.be;  // captured by the closures below
            Maker mk = m;
            auto outputs = [=](bool candidate) mutable -> TensorList {
              CudaBackend& be = *backend_ptr;
              Tensor out = mk.empty({cols}, dtype);
              if (candidate) return cc::column_sums_sliced(be, x, false, out) ? TensorList{out} : TensorList{};
              be.reduce(ReduceOp::sum, x, {0}, out);
              return {out};
            };
            return Trial{[=]() mutable { return outputs(false); }, [=]() mutable { return outputs(true); }, {}};
          }};
}

Candidate bias_grad(const Maker& m) {
  Candidate c{"bias_grad", "reduce over leading axes (reduce.cu: partial sums of 32 rows)",
              "column sums in slices of 512 rows with 16-byte loads",
              Agreement::within(0, 1e-6, "float64 sums in another order, rounded to float32"), {}};
  c.cases = {column_sums_case(m, "GPT-2 small MLP bias, f32: 8192 x 3072", true, 8192, 3072, DType::f32),
             column_sums_case(m, "GPT-2 small bias, f32: 8192 x 768", true, 8192, 768, DType::f32),
             column_sums_case(m, "f32: 1000 x 37 (scalar loads)", false, 1000, 37, DType::f32),
             column_sums_case(m, "f64: 513 x 64", false, 513, 64, DType::f64)};
  return c;
}

// ---- cross-entropy fused in the [N] form

Case cross_entropy_case(Maker m, std::string name, bool timed, int64_t rows, int64_t cols, DType dtype,
                        double smoothing, int64_t ignore) {
  return {std::move(name), timed, [=]() mutable {
            const DType acc = accumulate_dtype(dtype);
            Tensor x = m.normal({rows, cols}, dtype, 3.0), targets = m.ids(rows, cols), gloss = m.normal({rows}, acc);
            Tensor lse = m.empty({rows}, acc), losses = m.empty({rows}, acc), scale = m.empty({}, acc);
            m.be.cross_entropy(x, targets, smoothing, ignore, losses, lse, scale);  // the backwards' lse
            CudaBackend* const backend_ptr = &m.be;  // captured by the closures below
            Maker mk = m;
            auto outputs = [=](bool candidate) mutable -> TensorList {
              CudaBackend& be = *backend_ptr;
              Tensor l = mk.empty({rows}, acc), k = mk.empty({rows}, acc), w = mk.empty({}, acc),
                     g = mk.empty({rows, cols}, dtype);
              if (candidate) {
                cc::cross_entropy_online(be, x, targets, smoothing, ignore, l, k, w);
                cc::cross_entropy_backward_rows(be, x, lse, targets, gloss, smoothing, ignore, g);
              } else {
                be.cross_entropy(x, targets, smoothing, ignore, l, k, w);
                be.cross_entropy_backward(x, lse, targets, gloss, smoothing, ignore, g);
              }
              return {l, k, w, g};
            };
            return Trial{[=]() mutable { return outputs(false); }, [=]() mutable { return outputs(true); }, {}};
          }};
}

Candidate cross_entropy(const Maker& m) {
  Candidate c{"cross_entropy_fused", "cross_entropy, cross_entropy_backward (indexing.cu: composed of checked kernels)",
              "the row read twice (online maximum and sum), nothing [N, C] written; the backward a block per row",
              Agreement::within(1e-6, 1e-6, "the online sum of exponentials is rescaled and added in another order"),
              {}};
  c.cases = {cross_entropy_case(m, "GPT-2 small logits, f32: 8192 x 50257", true, 8192, 50257, DType::f32, 0.0, -100),
             cross_entropy_case(m, "f32: 300 x 1000, smoothing 0.1, ignore 3", false, 300, 1000, DType::f32, 0.1, 3),
             cross_entropy_case(m, "f64: 17 x 10", false, 17, 10, DType::f64, 0.0, -100)};
  if (m.sixteen_bit()) {
    c.cases.push_back(cross_entropy_case(m, "bf16: 64 x 5000", false, 64, 5000, DType::bf16, 0.0, -100));
    c.cases.back().agreement =
        Agreement::within(2e-2, 2e-2, "bf16: the library's backward rounds the log-softmax to bf16 before exp");
  }
  return c;
}

// ---- optimizer updates gathered; the gradient norm's sum and clipping's scaling gathered

// GPT-2 small's parameter shapes (vocabulary 50304), or a few small ones.
std::vector<Shape> parameter_shapes(bool gpt2) {
  if (!gpt2) return {{7, 5}, {5}, {1000}, {33, 31}};
  std::vector<Shape> shapes{{50304, 768}, {1024, 768}};
  for (int layer = 0; layer < 12; ++layer)
    for (Shape s : {Shape{768}, Shape{768}, Shape{768, 2304}, Shape{2304}, Shape{768, 768}, Shape{768}, Shape{768},
                    Shape{768}, Shape{768, 3072}, Shape{3072}, Shape{3072, 768}, Shape{768}})
      shapes.push_back(s);
  shapes.push_back({768});
  shapes.push_back({768});
  return shapes;
}

Case optimizer_case(Maker m, std::string name, bool timed, bool gpt2, DType dtype, bool adam) {
  return {std::move(name), timed, [=]() mutable {
            struct State {
              TensorList initial, library, candidate;  // per parameter: param, grad, a, b
            };
            auto st = std::make_shared<State>();
            for (const Shape& s : parameter_shapes(gpt2))
              for (int k = 0; k < 4; ++k) {
                Tensor t = m.normal(s, dtype, k == 3 ? 0.01 : 1.0);
                if (adam && k == 3) m.be.unary(UnaryOp::abs, t, t, 0.0);  // exp_avg_sq >= 0
                st->initial.push_back(t);
                st->library.push_back(m.empty(s, dtype));
                st->candidate.push_back(m.empty(s, dtype));
              }
            CudaBackend* const backend_ptr = &m.be;  // captured by the closures below
            const SgdStep sgd{.lr = 1e-3, .momentum = 0.9, .dampening = 0.0, .weight_decay = 0.01};
            const AdamWStep adamw{.lr = 1e-3, .weight_decay = 0.1, .bias_correction1 = 0.1, .bias_correction2 = 0.001};
            auto reset = [=] {
              CudaBackend& be = *backend_ptr;
              for (size_t i = 0; i < st->initial.size(); ++i) {
                be.copy(st->initial[i], st->library[i]);
                be.copy(st->initial[i], st->candidate[i]);
              }
            };
            auto library = [=]() {
              CudaBackend& be = *backend_ptr;
              const TensorList& t = st->library;
              for (size_t i = 0; i < t.size(); i += 4) {
                if (adam) be.adamw_step(t[i], t[i + 1], t[i + 2], t[i + 3], adamw);
                else be.sgd_step(t[i], t[i + 1], t[i + 2], sgd);
              }
              return t;
            };
            auto candidate = [=]() {
              CudaBackend& be = *backend_ptr;
              const TensorList& t = st->candidate;
              std::vector<cc::SgdUpdate> s;
              std::vector<cc::AdamWUpdate> a;
              for (size_t i = 0; i < t.size(); i += 4) {
                s.push_back({t[i], t[i + 1], t[i + 2]});
                a.push_back({t[i], t[i + 1], t[i + 2], t[i + 3]});
              }
              adam ? cc::adamw_steps(be, a, adamw) : cc::sgd_steps(be, s, sgd);
              return t;
            };
            return Trial{library, candidate, reset};
          }};
}

Candidate optimizer(const Maker& m) {
  Candidate c{"optimizer_gathered", "sgd_step, adamw_step (optim.cu: one launch per parameter)",
              "up to 24 parameters' updates a launch", Agreement::bits(), {}};
  c.cases = {optimizer_case(m, "GPT-2 small parameters (148), AdamW, f32", true, true, DType::f32, true),
             optimizer_case(m, "GPT-2 small parameters (148), SGD with momentum, f32", true, true, DType::f32, false),
             optimizer_case(m, "4 parameters, AdamW, f64", false, false, DType::f64, true)};
  return c;
}

Case grad_norm_case(Maker m, std::string name, bool timed, bool gpt2, DType dtype, bool scaling) {
  return {std::move(name), timed, [=]() mutable {
            auto grads = std::make_shared<TensorList>();
            for (const Shape& s : parameter_shapes(gpt2)) grads->push_back(m.normal(s, dtype, 1e-2));
            auto copies = std::make_shared<std::pair<TensorList, TensorList>>();
            for (const Tensor& g : *grads) {
              copies->first.push_back(m.empty(g.shape(), dtype));
              copies->second.push_back(m.empty(g.shape(), dtype));
            }
            CudaBackend* const backend_ptr = &m.be;  // captured by the closures below
            Maker mk = m;
            auto reset = [=] {
              CudaBackend& be = *backend_ptr;
              for (size_t i = 0; i < grads->size(); ++i) {
                be.copy((*grads)[i], copies->first[i]);
                be.copy((*grads)[i], copies->second[i]);
              }
            };
            auto library = [=]() mutable -> TensorList {
              CudaBackend& be = *backend_ptr;
              if (scaling) {
                be.scale_each(copies->first, 0.37);
                return copies->first;
              }
              Tensor out = mk.empty({}, DType::f64);
              be.sum_squares(*grads, out);
              return {out};
            };
            auto candidate = [=]() mutable -> TensorList {
              CudaBackend& be = *backend_ptr;
              if (scaling) return cc::scale_each_gathered(be, copies->second, 0.37) ? copies->second : TensorList{};
              Tensor out = mk.empty({}, DType::f64);
              return cc::sum_squares_gathered(be, *grads, out) ? TensorList{out} : TensorList{};
            };
            return Trial{library, candidate, reset};
          }};
}

Candidate grad_norm(const Maker& m, bool scaling) {
  Candidate c;
  if (scaling) {
    c = {"scale_each_gathered", "scale_each (optim.cu: mul_scalar and copy per tensor)",
         "up to 256 tensors scaled in one launch", Agreement::bits(), {}};
  } else {
    c = {"grad_norm_gathered", "sum_squares (optim.cu: square, sum, widen and add per tensor)",
         "up to 256 tensors' squares in two launches, added in float64",
         Agreement::within(0, 1e-6, "every square added in float64, not each tensor's sum rounded to its dtype"), {}};
  }
  c.cases = {grad_norm_case(m, "GPT-2 small gradients (148), f32", true, true, DType::f32, scaling),
             grad_norm_case(m, "4 gradients, f64", false, false, DType::f64, scaling)};
  if (m.sixteen_bit()) {
    c.cases.push_back(grad_norm_case(m, "4 gradients, bf16", false, false, DType::bf16, scaling));
    if (!scaling)
      c.cases.back().agreement = Agreement::within(0, 2e-2, "bf16: the library rounds each gradient's sum to bf16");
  }
  return c;
}

}  // namespace

std::vector<Candidate> cuda_candidates(Device device) {
  remat::cuda::CudaBackend* be = remat::cuda::CudaBackend::of_device(device.index);
  REMAT_CHECK(device.type == DeviceType::cuda && be != nullptr, "cuda_candidates: ", device_name(device),
              " is not a CUDA device in use");
  const Maker m{device, *be};
  std::vector<Candidate> all{attention_tc(m, false), elementwise(m),   norm_backward(m), residual_norm(m),
                             digest(m),              gemm_epilogue(m), bias_grad(m),     cross_entropy(m),
                             optimizer(m),           grad_norm(m, false), grad_norm(m, true)};
  if (m.sixteen_bit()) all.push_back(attention_tc(m, true));
  return all;
}

}  // namespace remat::candidates
