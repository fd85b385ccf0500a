// float32 2-D convolution through oneDNN's convolution primitives (forward, backward data,
// backward weights). See conv_onednn.h; the measured choice between these and im2col is in
// conv.cpp.
//
// Primitives are built once per (direction, shapes, geometry, layout choice, thread count) and
// kept in a small cache: building one costs tens of microseconds and picks an implementation
// for the thread count it sees, so a changed thread count builds a new one. Primitives run with
// a user scratchpad (a remat tensor per call), which also makes concurrent use of one cached
// primitive safe.
#include "tensor/cpu/conv_onednn.h"

#include <omp.h>

#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/signal_guard.h"

namespace remat::cpu {

namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

enum class Direction : int64_t { forward, backward_data, backward_weights };

// A reorder between the user's plain layout and the primitive's, when they differ.
struct Reorder {
  bool needed = false;
  memory::desc plain, inner;  // the user's layout and the primitive's
  dnnl::reorder primitive;
};

Reorder make_reorder(const memory::desc& plain, const memory::desc& inner, bool to_inner) {
  Reorder r;
  r.plain = plain;
  r.inner = inner;
  r.needed = plain != inner;
  if (r.needed) {
    auto& e = cpu_engine();
    r.primitive = to_inner ? dnnl::reorder(dnnl::reorder::primitive_desc(e, plain, e, inner))
                           : dnnl::reorder(dnnl::reorder::primitive_desc(e, inner, e, plain));
  }
  return r;
}

struct Entry {
  bool ok = false;  // false: oneDNN has no implementation for this case
  dnnl::primitive primitive;
  size_t scratchpad_bytes = 0;
  // Operands in primitive order: forward (src, weights, dst), backward data (diff_dst, weights,
  // diff_src), backward weights (src, diff_dst, diff_weights).
  Reorder a, b, out;
};

struct Problem {
  int64_t n, c, h, w, o, kh, kw, oh, ow;
  Conv2dGeometry g;
  bool bias;
  bool blocked;
  std::vector<int64_t> key(Direction d) const {
    return {static_cast<int64_t>(d), n, c, h, w, o, kh, kw, oh, ow, g.stride_h, g.stride_w, g.pad_h, g.pad_w,
            g.dilation_h, g.dilation_w, g.groups, bias, blocked, cpu_backend().num_threads()};
  }
  memory::dims strides() const { return {g.stride_h, g.stride_w}; }
  memory::dims dilates() const { return {g.dilation_h - 1, g.dilation_w - 1}; }
  memory::dims pad_l() const { return {g.pad_h, g.pad_w}; }
  // oneDNN wants the right padding that makes its output-size formula exact.
  memory::dims pad_r() const {
    return {(oh - 1) * g.stride_h + (kh - 1) * g.dilation_h + 1 - h - g.pad_h,
            (ow - 1) * g.stride_w + (kw - 1) * g.dilation_w + 1 - w - g.pad_w};
  }
  memory::desc src_plain() const { return {{n, c, h, w}, dt::f32, tag::nchw}; }
  memory::desc dst_plain() const { return {{n, o, oh, ow}, dt::f32, tag::nchw}; }
  memory::desc weights_plain() const {
    if (g.groups == 1) return {{o, c, kh, kw}, dt::f32, tag::oihw};
    return {{g.groups, o / g.groups, c / g.groups, kh, kw}, dt::f32, tag::goihw};
  }
  memory::desc bias_desc() const { return {{o}, dt::f32, tag::x}; }
  memory::desc any(const memory::desc& plain) const {
    return blocked ? memory::desc(plain.dims(), dt::f32, tag::any) : plain;
  }
};

dnnl::convolution_forward::primitive_desc forward_pd(const Problem& p, const dnnl::primitive_attr& attr) {
  dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                    p.any(p.src_plain()), p.any(p.weights_plain()),
                                    p.bias ? p.bias_desc() : memory::desc(), p.any(p.dst_plain()), p.strides(),
                                    p.dilates(), p.pad_l(), p.pad_r());
  return dnnl::convolution_forward::primitive_desc(d, attr, cpu_engine());
}

Entry build(const Problem& p, Direction dir) {
  Entry e;
  const memory::dims pr = p.pad_r();
  if (pr[0] < 0 || pr[1] < 0) return e;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  try {
    if (dir == Direction::forward) {
      auto pd = forward_pd(p, attr);
      e.primitive = dnnl::convolution_forward(pd);
      e.scratchpad_bytes = pd.scratchpad_desc().get_size();
      e.a = make_reorder(p.src_plain(), pd.src_desc(), true);
      e.b = make_reorder(p.weights_plain(), pd.weights_desc(), true);
      e.out = make_reorder(p.dst_plain(), pd.dst_desc(), false);
    } else {
      Problem hint_problem = p;
      hint_problem.bias = false;
      auto hint = forward_pd(hint_problem, dnnl::primitive_attr());
      if (dir == Direction::backward_data) {
        dnnl::convolution_backward_data::desc d(dnnl::algorithm::convolution_direct, p.any(p.src_plain()),
                                                p.any(p.weights_plain()), p.any(p.dst_plain()), p.strides(),
                                                p.dilates(), p.pad_l(), pr);
        dnnl::convolution_backward_data::primitive_desc pd(d, attr, cpu_engine(), hint);
        e.primitive = dnnl::convolution_backward_data(pd);
        e.scratchpad_bytes = pd.scratchpad_desc().get_size();
        e.a = make_reorder(p.dst_plain(), pd.diff_dst_desc(), true);
        e.b = make_reorder(p.weights_plain(), pd.weights_desc(), true);
        e.out = make_reorder(p.src_plain(), pd.diff_src_desc(), false);
      } else {
        dnnl::convolution_backward_weights::desc d(dnnl::algorithm::convolution_direct, p.any(p.src_plain()),
                                                   p.any(p.weights_plain()), p.bias ? p.bias_desc() : memory::desc(),
                                                   p.any(p.dst_plain()), p.strides(), p.dilates(), p.pad_l(), pr);
        dnnl::convolution_backward_weights::primitive_desc pd(d, attr, cpu_engine(), hint);
        e.primitive = dnnl::convolution_backward_weights(pd);
        e.scratchpad_bytes = pd.scratchpad_desc().get_size();
        e.a = make_reorder(p.src_plain(), pd.src_desc(), true);
        e.b = make_reorder(p.dst_plain(), pd.diff_dst_desc(), true);
        e.out = make_reorder(p.weights_plain(), pd.diff_weights_desc(), false);
      }
    }
    e.ok = true;
  } catch (const dnnl::error&) {
    e = Entry();  // no implementation: the caller falls back to im2col
  }
  return e;
}

std::shared_ptr<const Entry> lookup(const Problem& p, Direction dir) {
  static std::mutex mutex;
  static std::map<std::vector<int64_t>, std::shared_ptr<const Entry>> cache;
  constexpr size_t kMaxEntries = 512;
  const auto key = p.key(dir);
  {
    std::lock_guard lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  auto entry = std::make_shared<const Entry>(build(p, dir));
  std::lock_guard lock(mutex);
  if (cache.size() >= kMaxEntries) cache.clear();
  cache.emplace(key, entry);
  return entry;
}

// A remat tensor of at least `bytes` (accounted), as raw memory.
Tensor scratch_tensor(size_t bytes) {
  return Tensor::empty({static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float))}, DType::f32);
}

// The operand as the primitive reads it: the user's memory, or a reordered copy (kept alive by
// `keep`).
memory input_memory(const Reorder& r, const Tensor& t, dnnl::stream& s, std::vector<Tensor>& keep) {
  memory user(r.plain, cpu_engine(), t.raw_data());
  if (!r.needed) return user;
  keep.push_back(scratch_tensor(r.inner.get_size()));
  memory inner(r.inner, cpu_engine(), keep.back().raw_data());
  r.primitive.execute(s, {{DNNL_ARG_FROM, user}, {DNNL_ARG_TO, inner}});
  return inner;
}

Problem problem_of(const Tensor& x_like, const Tensor& w_like, const Tensor& y_like, const Conv2dGeometry& g,
                   bool bias, bool blocked) {
  return {x_like.shape()[0], x_like.shape()[1], x_like.shape()[2], x_like.shape()[3], w_like.shape()[0],
          w_like.shape()[2], w_like.shape()[3], y_like.shape()[2], y_like.shape()[3], g, bias, blocked};
}

// Runs a cached primitive: arg_a, arg_b read from ta, tb; arg_out written into tout.
void run(const Entry& e, const Tensor& ta, int arg_a, const Tensor& tb, int arg_b, const Tensor& tout, int arg_out,
         const Tensor& bias, int arg_bias) {
  dnnl::stream s(cpu_engine());
  std::vector<Tensor> keep;
  std::unordered_map<int, memory> args;
  args.emplace(arg_a, input_memory(e.a, ta, s, keep));
  args.emplace(arg_b, input_memory(e.b, tb, s, keep));
  memory out_user(e.out.plain, cpu_engine(), tout.raw_data());
  memory out = out_user;
  if (e.out.needed) {
    keep.push_back(scratch_tensor(e.out.inner.get_size()));
    out = memory(e.out.inner, cpu_engine(), keep.back().raw_data());
  }
  args.emplace(arg_out, out);
  if (bias.defined()) args.emplace(arg_bias, memory({{bias.numel()}, dt::f32, tag::x}, cpu_engine(), bias.raw_data()));
  if (e.scratchpad_bytes > 0) {
    keep.push_back(scratch_tensor(e.scratchpad_bytes));
    args.emplace(DNNL_ARG_SCRATCHPAD,
                 memory({{static_cast<int64_t>(e.scratchpad_bytes)}, dt::u8, tag::x}, cpu_engine(), keep.back().raw_data()));
  }
  SignalsHeldBack held;  // a gemm-based implementation runs oneDNN's GEMM kernels (signal_guard.h)
  e.primitive.execute(s, args);
  if (e.out.needed) e.out.primitive.execute(s, {{DNNL_ARG_FROM, out}, {DNNL_ARG_TO, out_user}});
  s.wait();
}

}  // namespace

bool onednn_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g,
                           const Tensor& y, bool blocked) {
  FullThreads full;  // oneDNN's results may depend on the thread count: built and run on all of them
  const Problem p = problem_of(x, w, y, g, bias.defined(), blocked);
  auto e = lookup(p, Direction::forward);
  if (!e->ok) return false;
  run(*e, x, DNNL_ARG_SRC, w, DNNL_ARG_WEIGHTS, y, DNNL_ARG_DST, bias, DNNL_ARG_BIAS);
  return true;
}

bool onednn_conv2d_backward_input(const Tensor& gy, const Tensor& w, const Conv2dGeometry& g, const Tensor& gx,
                                  bool blocked) {
  FullThreads full;  // oneDNN's results may depend on the thread count: built and run on all of them
  const Problem p = problem_of(gx, w, gy, g, false, blocked);
  auto e = lookup(p, Direction::backward_data);
  if (!e->ok) return false;
  run(*e, gy, DNNL_ARG_DIFF_DST, w, DNNL_ARG_WEIGHTS, gx, DNNL_ARG_DIFF_SRC, Tensor(), 0);
  return true;
}

bool onednn_conv2d_backward_weight(const Tensor& x, const Tensor& gy, const Conv2dGeometry& g, const Tensor& gw,
                                   const Tensor& gbias, bool blocked) {
  if (!gw.defined()) return false;  // the bias gradient alone: a plain reduction (im2col path)
  FullThreads full;  // oneDNN's results may depend on the thread count: built and run on all of them
  const Problem p = problem_of(x, gw, gy, g, gbias.defined(), blocked);
  auto e = lookup(p, Direction::backward_weights);
  if (!e->ok) return false;
  run(*e, x, DNNL_ARG_SRC, gy, DNNL_ARG_DIFF_DST, gw, DNNL_ARG_DIFF_WEIGHTS, gbias, DNNL_ARG_DIFF_BIAS);
  return true;
}

}  // namespace remat::cpu
