// The CUDA backend's own 16-bit kernels (the backend option sixteen_bit: each test runs on a backend
// of cuda:0 with it, test_cuda_options.h; every test skips without a device): each against the
// CPU's result on the same bf16 values (the CPU is the reference: float32
// arithmetic, each result rounded once) within a stated tolerance, and bitwise the same on a second
// call on the device:
//   - the gradient norm's sum of squares and clipping's scaling over 300 bf16 gradients (more than
//     any kernel's operand list of float32 stand-ins holds);
//   - softmax, log-softmax, layer norm and RMS norm, forward and backward, reading and writing bf16
//     (and f16) themselves, with float32 statistics;
//   - fused attention, forward and backward, in bf16;
//   - cross-entropy, forward and backward, with float32 losses, log-sum-exp and mean weight;
//   - the reductions (sum, mean, max, argmax; the column sums of the bias gradient);
//   - embedding, forward (exact) and backward (float sums of repeated ids, rounded once);
//   - pooling (max, average, adaptive average) and batch norm, forward and backward;
// the kernels of the last four also bitwise against their float32 kernels on the GPU on widened
// inputs, outputs rounded once (the stand-in path they replace).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "remat/devices.h"
#include "remat/remat.h"
#include "test_cuda_options.h"

using namespace remat;

namespace {

const Device kGpu{DeviceType::cuda, 0};

// Skips the calling test unless cuda:0 is usable; then serves it for the rest of the test by a
// backend with the option sixteen_bit.
#define REQUIRE_BF16_GPU()                                                                                  \
  if (device_count(DeviceType::cuda) == 0) GTEST_SKIP() << "no CUDA device: " << unavailable_reason(DeviceType::cuda); \
  use_device(kGpu);                                                                                         \
  const remat::testing::CudaWithOptions sixteen_bit_backend({.sixteen_bit = true})

bool same_bits(const Tensor& a, const Tensor& b) {
  Tensor ha = a.to(kCpu).contiguous(), hb = b.to(kCpu).contiguous();
  return ha.shape() == hb.shape() && ha.dtype() == hb.dtype() &&
         std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()) == 0;
}

// Units in the last place of a 16-bit dtype relative to 1 (bf16 8 bits, f16 11).
double ulp(DType dtype) { return dtype == DType::bf16 ? 0x1p-7 : 0x1p-10; }

// got (on the GPU) against want (the CPU's): every element within `ulps` of the dtype's last place of
// the larger of |want| and `floor` (a float32 result computed in another order rounds to the same
// 16-bit value or its neighbour; differences of the stand-ins' float32 sums are far smaller).
void expect_close(const Tensor& got, const Tensor& want, double ulps, double floor, const std::string& what) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<double> g = got.to(kCpu).to_vector(), w = want.to_vector();
  const double unit = is_16bit_float(want.dtype()) ? ulp(want.dtype()) : 1e-6;
  size_t bad = 0, first = g.size();
  for (size_t i = 0; i < g.size(); ++i) {
    const bool both_nan = g[i] != g[i] && w[i] != w[i];
    const bool ok = both_nan || std::abs(g[i] - w[i]) <= ulps * unit * std::max(std::abs(w[i]), floor);
    if (!ok && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << g.size() << " elements off, first at " << first << ": "
                     << (first < g.size() ? g[first] : 0) << " against " << (first < g.size() ? w[first] : 0);
}

Tensor empty_like_on(const Tensor& t, Device device, DType dtype) {
  return Tensor::empty(t.shape(), dtype, memory::Tag::other, device);
}

// The gradient norm of 300 bf16 gradients (sizes across chunk boundaries, an empty one): within a
// bf16 rounding of each gradient's sum of the CPU's (each gradient's sum is rounded to bf16 as the
// CPU does), the same bits on a second call; scaling them in place gives unary(mul_scalar) then copy's bits on the device.
TEST(CudaBf16, GradientNormAndScalingOfThreeHundredGradients) {
  REQUIRE_BF16_GPU();
  for (const DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    TensorList cpu_grads, gpu_grads;
    for (size_t i = 0; i < 300; ++i) {
      const int64_t n = i % 7 == 3 ? 0 : static_cast<int64_t>((i * 7919) % 40000 + 1);
      const Tensor g = randn({n}, DType::f32, RngState{1900 + i, 0}, 0.0, 0.1).to(dtype);
      cpu_grads.push_back(g);
      gpu_grads.push_back(g.to(kGpu));
    }
    const Tensor on_cpu = Tensor::empty({}, DType::f64);
    backend(kCpu).sum_squares(cpu_grads, on_cpu);
    std::vector<double> values;
    for (int call = 0; call < 2; ++call) {
      const Tensor out = Tensor::empty({}, DType::f64, memory::Tag::other, kGpu);
      backend(kGpu).sum_squares(gpu_grads, out);
      values.push_back(out.to(kCpu).item());
    }
    EXPECT_EQ(std::memcmp(&values[0], &values[1], sizeof(double)), 0) << values[0] << " then " << values[1];
    EXPECT_NEAR(values[0], on_cpu.item(), 2 * ulp(dtype) * on_cpu.item());

    TensorList want;
    for (const Tensor& g : gpu_grads) {
      Tensor scaled = Tensor::empty(g.shape(), dtype, memory::Tag::other, kGpu);
      backend(kGpu).unary(UnaryOp::mul_scalar, g, scaled, 0.37);
      want.push_back(scaled);
    }
    backend(kGpu).scale_each(gpu_grads, 0.37);
    for (size_t i = 0; i < gpu_grads.size(); ++i) EXPECT_TRUE(same_bits(gpu_grads[i], want[i])) << "gradient " << i;
  }
}

// Runs `kernel` on a backend with inputs and outputs moved there; returns the outputs on the host.
template <class F>
TensorList run_on(Device device, const TensorList& inputs, const TensorList& outputs_like, F kernel) {
  TensorList in, out;
  for (const Tensor& t : inputs) in.push_back(t.defined() ? t.to(device) : Tensor());
  for (const Tensor& t : outputs_like) out.push_back(t.defined() ? empty_like_on(t, device, t.dtype()) : Tensor());
  kernel(backend(device), in, out);
  TensorList host;
  for (const Tensor& t : out) host.push_back(t.defined() ? t.to(kCpu) : Tensor());
  return host;
}

// The kernel's outputs on the GPU against the CPU's (16-bit outputs within `ulps` of their last
// place of the larger of the element and 1e-3, float32 statistics within 1e-5 relative), and
// bitwise the same on a second GPU call.
template <class F>
void check_kernel(const std::string& what, const TensorList& inputs, const TensorList& outputs_like, double ulps,
                  F kernel) {
  const TensorList cpu = run_on(kCpu, inputs, outputs_like, kernel);
  const TensorList gpu = run_on(kGpu, inputs, outputs_like, kernel);
  const TensorList again = run_on(kGpu, inputs, outputs_like, kernel);
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (!cpu[i].defined()) continue;
    const std::string name = what + " output " + std::to_string(i);
    if (is_16bit_float(cpu[i].dtype())) expect_close(gpu[i], cpu[i], ulps, 1e-3, name);
    else expect_close(gpu[i], cpu[i], 10, 1e-3, name);
    EXPECT_TRUE(same_bits(gpu[i], again[i])) << name << " differs between two calls";
  }
}

// The kernel's outputs on the GPU from 16-bit inputs are the bits of its float32 kernel on the GPU
// from the inputs widened exactly, each 16-bit output rounded once: the stand-in path's results
// (Note [16-bit floats on the GPU]), for the kernels written to reproduce them.
template <class F>
void expect_stand_in_bits(const std::string& what, const TensorList& inputs, const TensorList& outputs_like,
                          F kernel) {
  const auto widened = [](const Tensor& t) {
    return t.defined() && is_16bit_float(t.dtype()) ? Tensor::empty(t.shape(), DType::f32) : t;
  };
  TensorList wide_in, wide_out;
  for (const Tensor& t : inputs) wide_in.push_back(t.defined() && is_16bit_float(t.dtype()) ? t.to(DType::f32) : t);
  for (const Tensor& t : outputs_like) wide_out.push_back(widened(t));
  const TensorList native = run_on(kGpu, inputs, outputs_like, kernel);
  const TensorList wide = run_on(kGpu, wide_in, wide_out, kernel);
  for (size_t i = 0; i < native.size(); ++i) {
    if (!native[i].defined()) continue;
    EXPECT_TRUE(same_bits(native[i], wide[i].to(native[i].dtype())))
        << what << " output " << i << " is not the float32 kernel's result rounded once";
  }
}

// check_kernel, and the stand-in path's bits.
template <class F>
void check_native(const std::string& what, const TensorList& inputs, const TensorList& outputs_like, double ulps,
                  F kernel) {
  check_kernel(what, inputs, outputs_like, ulps, kernel);
  expect_stand_in_bits(what, inputs, outputs_like, kernel);
}

// Softmax and the norms in bf16 and f16, rows short and long (one block walks a row of 3000).
TEST(CudaBf16, RowKernelsFollowTheCpuAndRepeatTheirBits) {
  REQUIRE_BF16_GPU();
  for (const DType dtype : {DType::bf16, DType::f16}) {
    for (const int64_t cols : {int64_t{7}, int64_t{768}, int64_t{3000}}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " cols " + std::to_string(cols));
      const int64_t rows = 37;
      const Tensor x = randn({rows, cols}, DType::f32, RngState{11, 0}, 0.3, 2.0).to(dtype);
      const Tensor gy = randn({rows, cols}, DType::f32, RngState{12, 0}).to(dtype);
      const Tensor w = randn({cols}, DType::f32, RngState{13, 0}, 1.0, 0.2).to(dtype);
      const Tensor b = randn({cols}, DType::f32, RngState{14, 0}).to(dtype);
      const Tensor stat = Tensor::empty({rows}, DType::f32);
      for (const bool log : {false, true}) {
        const std::string name = log ? "log_softmax" : "softmax";
        check_kernel(name, {x}, {x}, 1, [&](Backend& be, const TensorList& in, const TensorList& out) {
          be.softmax(in[0], out[0], log);
        });
        const Tensor y = log ? log_softmax(x.to(DType::f32)).to(dtype) : softmax(x.to(DType::f32)).to(dtype);
        check_kernel(name + " backward", {y, gy}, {x}, 2,
                     [&](Backend& be, const TensorList& in, const TensorList& out) {
                       be.softmax_backward(in[0], in[1], out[0], log);
                     });
      }
      check_kernel("layer_norm", {x, w, b}, {x, stat, stat}, 1,
                   [&](Backend& be, const TensorList& in, const TensorList& out) {
                     be.layer_norm(in[0], in[1], in[2], 1e-5, out[0], out[1], out[2]);
                   });
      check_kernel("rms_norm", {x, w}, {x, stat}, 1, [&](Backend& be, const TensorList& in, const TensorList& out) {
        be.rms_norm(in[0], in[1], 1e-5, out[0], out[1]);
      });
      // the statistics as the CPU's kernel makes them, then both backward kernels from them
      const TensorList fwd = run_on(kCpu, {x, w, b}, {x, stat, stat}, [&](Backend& be, const TensorList& in,
                                                                         const TensorList& out) {
        be.layer_norm(in[0], in[1], in[2], 1e-5, out[0], out[1], out[2]);
      });
      check_kernel("layer_norm backward", {x, w, fwd[1], fwd[2], gy}, {x, w, b}, 4,
                   [&](Backend& be, const TensorList& in, const TensorList& out) {
                     be.layer_norm_backward(in[0], in[1], in[2], in[3], in[4], out[0], out[1], out[2]);
                   });
      check_kernel("rms_norm backward", {x, w, fwd[2], gy}, {x, w}, 4,
                   [&](Backend& be, const TensorList& in, const TensorList& out) {
                     be.rms_norm_backward(in[0], in[1], in[2], in[3], out[0], out[1]);
                   });
    }
  }
}

// Fused attention in bf16 and f16: head sizes 64 (the row kernels of the backward) and 40 (the
// generic ones), causal or not, with dropout; the backward from the CPU's output and log-sum-exp:
// within 2 (forward) and 4 (gradients) units in the last place of each element.
TEST(CudaBf16, AttentionFollowsTheCpuAndRepeatsItsBits) {
  REQUIRE_BF16_GPU();
  struct Case {
    int64_t d;
    bool causal;
    double p;
  };
  std::vector<std::pair<DType, Case>> cases;
  for (const DType dtype : {DType::bf16, DType::f16})
    for (const Case& c : {Case{64, true, 0.0}, Case{64, false, 0.2}, Case{40, true, 0.1}}) cases.emplace_back(dtype, c);
  for (const auto& [dtype, c] : cases) {
    SCOPED_TRACE(std::string(dtype_name(dtype)) + " head size " + std::to_string(c.d) + (c.causal ? " causal" : "") +
                 " dropout " + std::to_string(c.p));
    const Shape shape{2, 3, 70, c.d};
    const Tensor q = randn(shape, DType::f32, RngState{21, 0}).to(dtype);
    const Tensor k = randn(shape, DType::f32, RngState{22, 0}).to(dtype);
    const Tensor v = randn(shape, DType::f32, RngState{23, 0}).to(dtype);
    const Tensor gout = randn(shape, DType::f32, RngState{24, 0}).to(dtype);
    const Tensor lse = Tensor::empty({2, 3, 70}, DType::f32);
    AttentionParams params;
    params.scale = 1.0 / std::sqrt(static_cast<double>(c.d));
    params.causal = c.causal;
    params.dropout_p = c.p;
    params.dropout_state = RngState{99, 0};
    const double ulps = 2;
    check_kernel("attention", {q, k, v}, {q, lse}, ulps, [&](Backend& be, const TensorList& in, const TensorList& out) {
      be.attention(in[0], in[1], in[2], params, out[0], out[1]);
    });
    const TensorList fwd = run_on(kCpu, {q, k, v}, {q, lse}, [&](Backend& be, const TensorList& in,
                                                                 const TensorList& out) {
      be.attention(in[0], in[1], in[2], params, out[0], out[1]);
    });
    check_kernel("attention backward", {q, k, v, fwd[0], fwd[1], gout}, {q, k, v}, 2 * ulps,
                 [&](Backend& be, const TensorList& in, const TensorList& out) {
                   be.attention_backward(in[0], in[1], in[2], in[3], in[4], in[5], params, out[0], out[1], out[2]);
                 });
  }
}

// Cross-entropy on bf16 and f16 logits, with and without label smoothing, some rows ignored,
// classes few and many (one block walks a row of 5000): losses, lse and the mean's weight float32
// within 1e-5 relative of the CPU's; the backward from the CPU's lse within two units of each
// element (of 1e-3 where the gradient is smaller: the smoothed target's cancellation).
TEST(CudaBf16, CrossEntropyFollowsTheCpuAndRepeatsItsBits) {
  REQUIRE_BF16_GPU();
  for (const DType dtype : {DType::bf16, DType::f16}) {
    for (const int64_t cols : {int64_t{10}, int64_t{5000}}) {
      for (const double eps : {0.0, 0.1}) {
        {
          SCOPED_TRACE(std::string(dtype_name(dtype)) + " classes " + std::to_string(cols) + " smoothing " +
                       std::to_string(eps));
          const int64_t rows = 29, ignore = -100;
          const Tensor logits = randn({rows, cols}, DType::f32, RngState{31, 0}, 0.0, 3.0).to(dtype);
          std::vector<int64_t> t(static_cast<size_t>(rows));
          for (int64_t r = 0; r < rows; ++r) t[static_cast<size_t>(r)] = r % 5 == 2 ? ignore : (r * 7919) % cols;
          const Tensor targets = from_indices(t, {rows});
          const Tensor losses = Tensor::empty({rows}, DType::f32), scale = Tensor::empty({}, DType::f32);
          const Tensor kept = losses;  // lse [N], float32 like the losses
          const auto forward = [&](Backend& be, const TensorList& in, const TensorList& out) {
            be.cross_entropy(in[0], in[1], eps, ignore, out[0], out[1], out[2]);
          };
          check_native("cross_entropy", {logits, targets}, {losses, kept, scale}, 1, forward);
          const TensorList fwd = run_on(kCpu, {logits, targets}, {losses, kept, scale}, forward);
          const Tensor gloss = randn({rows}, DType::f32, RngState{32, 0});
          check_native("cross_entropy backward", {logits, fwd[1], targets, gloss}, {logits}, 2,
                       [&](Backend& be, const TensorList& in, const TensorList& out) {
                         be.cross_entropy_backward(in[0], in[1], in[2], in[3], eps, ignore, out[0]);
                       });
        }
      }
    }
  }
}

// Reductions of bf16 and f16: over the last axis (a block per output, rows of 3000), over the
// leading axis of a contiguous tensor (the column sums of a bias gradient), over axes apart (the strided walk) and
// short ones (a thread per output): sums and means within one unit in the last place of each
// output (of 1e-3 where smaller: a float64 sum in another order rounds the same but for ties),
// max exactly, argmax equal.
TEST(CudaBf16, ReductionsFollowTheCpuAndRepeatTheirBits) {
  REQUIRE_BF16_GPU();
  struct Case {
    Shape shape;
    std::vector<int64_t> axes;
  };
  const std::vector<Case> cases = {{{37, 3000}, {1}}, {{3000, 40}, {0}}, {{1200, 77}, {0}},
                                   {{6, 50, 9}, {0, 2}}, {{40, 20}, {1}}, {{5, 700}, {0, 1}}};
  for (const DType dtype : {DType::bf16, DType::f16}) {
    for (const Case& c : cases) {
      const Tensor x = randn(c.shape, DType::f32, RngState{41, 0}, 0.3, 2.0).to(dtype);
      Shape out_shape;
      for (int64_t i = 0; i < x.dim(); ++i)
        if (std::find(c.axes.begin(), c.axes.end(), i) == c.axes.end()) out_shape.push_back(x.size(i));
      for (const ReduceOp op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::max, ReduceOp::argmax}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " shape " + shape_str(c.shape) + " op " +
                     std::to_string(static_cast<int>(op)));
        const Tensor out = Tensor::empty(out_shape, op == ReduceOp::argmax ? DType::i64 : dtype);
        check_native("reduce", {x}, {out}, op == ReduceOp::max || op == ReduceOp::argmax ? 0 : 1,
                     [&](Backend& be, const TensorList& in, const TensorList& o) { be.reduce(op, in[0], c.axes, o[0]); });
      }
    }
  }
}

// Embedding of bf16 and f16 tables: the rows exactly; the backward (ids repeated up to 40 times)
// within one unit in the last place of each table entry (of 1e-3 where smaller).
TEST(CudaBf16, EmbeddingFollowsTheCpuAndRepeatsItsBits) {
  REQUIRE_BF16_GPU();
  for (const DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const int64_t rows = 50, dim = 96, n = 2000;
    const Tensor table = randn({rows, dim}, DType::f32, RngState{51, 0}).to(dtype);
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = (i * i * 31 + 7) % rows;
    const Tensor ids = from_indices(v, {n});
    const Tensor out = Tensor::empty({n, dim}, dtype);
    check_native("embedding", {table, ids}, {out}, 0,
                 [&](Backend& be, const TensorList& in, const TensorList& o) { be.embedding(in[0], in[1], o[0]); });
    const Tensor gout = randn({n, dim}, DType::f32, RngState{52, 0}).to(dtype);
    check_native("embedding backward", {ids, gout}, {table}, 1,
                 [&](Backend& be, const TensorList& in, const TensorList& o) {
                   be.fill(o[0], 0.0);
                   be.embedding_backward(in[0], in[1], o[0]);
                 });
  }
}

// Pooling of bf16 and f16 planes (a 3 x 3 window, stride 2, padding 1; adaptive bins overlapping):
// max pooling exactly (values and indices), averages and their backward within one unit in the
// last place of each element (of 1e-3 where smaller).
TEST(CudaBf16, PoolingFollowsTheCpuAndRepeatsItsBits) {
  REQUIRE_BF16_GPU();
  for (const DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor x = randn({2, 3, 11, 13}, DType::f32, RngState{61, 0}).to(dtype);
    Pool2dGeometry g;
    g.kernel_h = g.kernel_w = 3, g.stride_h = g.stride_w = 2, g.pad_h = g.pad_w = 1;
    const Tensor y = Tensor::empty({2, 3, 6, 7}, dtype), idx = Tensor::empty({2, 3, 6, 7}, DType::i64);
    const Tensor gy = randn({2, 3, 6, 7}, DType::f32, RngState{62, 0}).to(dtype);
    check_native("max_pool2d", {x}, {y, idx}, 0,
                 [&](Backend& be, const TensorList& in, const TensorList& o) { be.max_pool2d(in[0], g, o[0], o[1]); });
    for (const bool include_pad : {true, false}) {
      g.count_include_pad = include_pad;
      check_native("avg_pool2d", {x}, {y}, 1,
                   [&](Backend& be, const TensorList& in, const TensorList& o) { be.avg_pool2d(in[0], g, o[0]); });
      check_native("avg_pool2d backward", {gy}, {x}, 1, [&](Backend& be, const TensorList& in, const TensorList& o) {
        be.avg_pool2d_backward(in[0], g, o[0]);
      });
    }
    const Tensor ya = Tensor::empty({2, 3, 4, 5}, dtype);
    const Tensor gya = randn({2, 3, 4, 5}, DType::f32, RngState{63, 0}).to(dtype);
    check_native("adaptive_avg_pool2d", {x}, {ya}, 1,
                 [&](Backend& be, const TensorList& in, const TensorList& o) { be.adaptive_avg_pool2d(in[0], o[0]); });
    check_native("adaptive_avg_pool2d backward", {gya}, {x}, 1,
                 [&](Backend& be, const TensorList& in, const TensorList& o) {
                   be.adaptive_avg_pool2d_backward(in[0], o[0]);
                 });
  }
}

// Batch norm of bf16 and f16 [N, C, S]: float32 statistics within 1e-5 relative of the CPU's, the
// normalised output within one unit in the last place, the gradients (batch statistics or
// constants) within four, each of the element or of 1e-3.
TEST(CudaBf16, BatchNormFollowsTheCpuAndRepeatsItsBits) {
  REQUIRE_BF16_GPU();
  for (const DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const int64_t channels = 6;
    const Tensor x = randn({4, channels, 5, 7}, DType::f32, RngState{71, 0}, 0.5, 2.0).to(dtype);
    const Tensor gy = randn({4, channels, 5, 7}, DType::f32, RngState{72, 0}).to(dtype);
    const Tensor w = randn({channels}, DType::f32, RngState{73, 0}, 1.0, 0.2).to(dtype);
    const Tensor b = randn({channels}, DType::f32, RngState{74, 0}).to(dtype);
    const Tensor stat = Tensor::empty({channels}, DType::f32);
    const auto statistics = [&](Backend& be, const TensorList& in, const TensorList& o) {
      be.batch_norm_statistics(in[0], o[0], o[1]);
    };
    check_native("batch_norm statistics", {x}, {stat, stat}, 1, statistics);
    const TensorList st = run_on(kCpu, {x}, {stat, stat}, statistics);
    std::vector<float> rstd;
    for (double v : st[1].to_vector()) rstd.push_back(static_cast<float>(1.0 / std::sqrt(v + 1e-5)));
    const Tensor r = from_vector(rstd, {channels});
    check_native("batch_norm apply", {x, st[0], r, w, b}, {x}, 1,
                 [&](Backend& be, const TensorList& in, const TensorList& o) {
                   be.batch_norm_apply(in[0], in[1], in[2], in[3], in[4], o[0]);
                 });
    for (const bool batch_statistics : {true, false}) {
      check_native("batch_norm backward", {x, st[0], r, w, gy}, {x, w, b}, 4,
                   [&](Backend& be, const TensorList& in, const TensorList& o) {
                     be.batch_norm_backward(in[0], in[1], in[2], in[3], in[4], batch_statistics, o[0], o[1], o[2]);
                   });
    }
  }
}

}  // namespace
