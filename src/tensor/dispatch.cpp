// The device dispatcher (dispatch.h) and copies between devices.
#include "tensor/dispatch.h"

#include <deque>

#include "tensor/allocate.h"

namespace remat {

namespace detail {

// Host copies of one kernel call's device operands. in() copies a device tensor to a new host
// tensor; out() does the same for a tensor the kernel writes (its contents are copied too, for
// kernels that update in place or accumulate) and finish() copies it back. A tensor passed twice
// (an in-place update) has one host copy.
class DeviceDispatch::Staging {
 public:
  const Tensor& in(const Tensor& t) { return stage(t, false); }
  const Tensor& out(const Tensor& t) { return stage(t, true); }
  void finish() {
    for (auto& e : entries_)
      if (e.output) copy_between_devices(e.host, e.device);
  }

 private:
  struct Entry {
    Tensor device, host;
    bool output = false;
  };
  const Tensor& stage(const Tensor& t, bool output) {
    if (!t.defined() || t.device().type == DeviceType::cpu) return t;
    for (auto& e : entries_)
      if (e.device.same(t)) {
        e.output = e.output || output;
        return e.host;
      }
    Tensor host = allocate_tensor("CPU fallback", t.shape(), t.dtype(), memory::Tag::other, kCpu);
    copy_between_devices(t, host);
    entries_.push_back({t, host, output});
    return entries_.back().host;
  }
  std::deque<Entry> entries_;  // stable references
};

template <class OnDevice, class OnHost>
void DeviceDispatch::dispatch(Kernel kernel, DType dtype, OnDevice&& on_device, OnHost&& on_host) {
  if (inner_.supports(kernel, dtype)) {
    DeviceKernelScope scope;
    on_device(inner_);
    return;
  }
  ++fallbacks_;
  Staging staging;
  on_host(cpu_backend(), staging);
  staging.finish();
}

void DeviceDispatch::copy_from_host(const void* host, const Tensor& dst) {
  DeviceKernelScope scope;
  inner_.copy_from_host(host, dst);
}
void DeviceDispatch::copy_to_host(const Tensor& src, void* host) {
  DeviceKernelScope scope;
  inner_.copy_to_host(src, host);
}
void DeviceDispatch::synchronize() {
  DeviceKernelScope scope;
  inner_.synchronize();
}

// copy and fill are required of every backend (the fallback itself needs them).
void DeviceDispatch::copy(const Tensor& src, const Tensor& dst) {
  if (src.device() != dst.device()) return copy_between_devices(src, dst);
  DeviceKernelScope scope;
  inner_.copy(src, dst);
}
void DeviceDispatch::fill(const Tensor& dst, double value) {
  DeviceKernelScope scope;
  inner_.fill(dst, value);
}

void DeviceDispatch::arange(const Tensor& dst, double start, double step) {
  dispatch(Kernel::arange, dst.dtype(), [&](Backend& b) { b.arange(dst, start, step); },
           [&](Backend& c, Staging& s) { c.arange(s.out(dst), start, step); });
}
void DeviceDispatch::rand_uniform(const Tensor& dst, RngState state, double low, double high) {
  dispatch(Kernel::rand_uniform, dst.dtype(), [&](Backend& b) { b.rand_uniform(dst, state, low, high); },
           [&](Backend& c, Staging& s) { c.rand_uniform(s.out(dst), state, low, high); });
}
void DeviceDispatch::rand_normal(const Tensor& dst, RngState state, double mean, double stddev) {
  dispatch(Kernel::rand_normal, dst.dtype(), [&](Backend& b) { b.rand_normal(dst, state, mean, stddev); },
           [&](Backend& c, Staging& s) { c.rand_normal(s.out(dst), state, mean, stddev); });
}
void DeviceDispatch::unary(UnaryOp op, const Tensor& x, const Tensor& y, double scalar) {
  dispatch(Kernel::unary, x.dtype(), [&](Backend& b) { b.unary(op, x, y, scalar); },
           [&](Backend& c, Staging& s) { c.unary(op, s.in(x), s.out(y), scalar); });
}
void DeviceDispatch::unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& gy, const Tensor& gx,
                                    double scalar) {
  dispatch(Kernel::unary_backward, gy.dtype(), [&](Backend& b) { b.unary_backward(op, x, y, gy, gx, scalar); },
           [&](Backend& c, Staging& s) { c.unary_backward(op, s.in(x), s.in(y), s.in(gy), s.out(gx), scalar); });
}
void DeviceDispatch::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch(Kernel::binary, a.dtype(), [&](Backend& d) { d.binary(op, a, b, out); },
           [&](Backend& c, Staging& s) { c.binary(op, s.in(a), s.in(b), s.out(out)); });
}
void DeviceDispatch::where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch(Kernel::where, out.dtype(), [&](Backend& d) { d.where(cond, a, b, out); },
           [&](Backend& c, Staging& s) { c.where(s.in(cond), s.in(a), s.in(b), s.out(out)); });
}
void DeviceDispatch::reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out) {
  dispatch(Kernel::reduce, x.dtype(), [&](Backend& b) { b.reduce(op, x, axes, out); },
           [&](Backend& c, Staging& s) { c.reduce(op, s.in(x), axes, s.out(out)); });
}
void DeviceDispatch::gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c_,
                          double alpha, double beta) {
  dispatch(Kernel::gemm, c_.dtype(), [&](Backend& d) { d.gemm(a, trans_a, b, trans_b, c_, alpha, beta); },
           [&](Backend& c, Staging& s) { c.gemm(s.in(a), trans_a, s.in(b), trans_b, s.out(c_), alpha, beta); });
}
void DeviceDispatch::softmax(const Tensor& x, const Tensor& y, bool log) {
  dispatch(Kernel::softmax, x.dtype(), [&](Backend& b) { b.softmax(x, y, log); },
           [&](Backend& c, Staging& s) { c.softmax(s.in(x), s.out(y), log); });
}
void DeviceDispatch::softmax_backward(const Tensor& y, const Tensor& gy, const Tensor& gx, bool log) {
  dispatch(Kernel::softmax_backward, y.dtype(), [&](Backend& b) { b.softmax_backward(y, gy, gx, log); },
           [&](Backend& c, Staging& s) { c.softmax_backward(s.in(y), s.in(gy), s.out(gx), log); });
}
void DeviceDispatch::layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                                const Tensor& mean, const Tensor& rstd) {
  dispatch(Kernel::layer_norm, x.dtype(), [&](Backend& b) { b.layer_norm(x, weight, bias, eps, y, mean, rstd); },
           [&](Backend& c, Staging& s) {
             c.layer_norm(s.in(x), s.in(weight), s.in(bias), eps, s.out(y), s.out(mean), s.out(rstd));
           });
}
void DeviceDispatch::layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                         const Tensor& gy, const Tensor& gx, const Tensor& gweight,
                                         const Tensor& gbias) {
  dispatch(
      Kernel::layer_norm_backward, x.dtype(),
      [&](Backend& b) { b.layer_norm_backward(x, weight, mean, rstd, gy, gx, gweight, gbias); },
      [&](Backend& c, Staging& s) {
        c.layer_norm_backward(s.in(x), s.in(weight), s.in(mean), s.in(rstd), s.in(gy), s.out(gx), s.out(gweight),
                              s.out(gbias));
      });
}
void DeviceDispatch::rms_norm(const Tensor& x, const Tensor& weight, double eps, const Tensor& y, const Tensor& rstd) {
  dispatch(Kernel::rms_norm, x.dtype(), [&](Backend& b) { b.rms_norm(x, weight, eps, y, rstd); },
           [&](Backend& c, Staging& s) { c.rms_norm(s.in(x), s.in(weight), eps, s.out(y), s.out(rstd)); });
}
void DeviceDispatch::rms_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& gy,
                                       const Tensor& gx, const Tensor& gweight) {
  dispatch(Kernel::rms_norm_backward, x.dtype(), [&](Backend& b) { b.rms_norm_backward(x, weight, rstd, gy, gx, gweight); },
           [&](Backend& c, Staging& s) {
             c.rms_norm_backward(s.in(x), s.in(weight), s.in(rstd), s.in(gy), s.out(gx), s.out(gweight));
           });
}
void DeviceDispatch::embedding(const Tensor& table, const Tensor& ids, const Tensor& out) {
  dispatch(Kernel::embedding, table.dtype(), [&](Backend& b) { b.embedding(table, ids, out); },
           [&](Backend& c, Staging& s) { c.embedding(s.in(table), s.in(ids), s.out(out)); });
}
void DeviceDispatch::embedding_backward(const Tensor& ids, const Tensor& gout, const Tensor& gtable) {
  dispatch(Kernel::embedding_backward, gout.dtype(), [&](Backend& b) { b.embedding_backward(ids, gout, gtable); },
           [&](Backend& c, Staging& s) { c.embedding_backward(s.in(ids), s.in(gout), s.out(gtable)); });
}
void DeviceDispatch::cross_entropy(const Tensor& logits, const Tensor& targets, double label_smoothing,
                                   int64_t ignore_index, const Tensor& losses, const Tensor& logp, const Tensor& scale) {
  dispatch(
      Kernel::cross_entropy, logits.dtype(),
      [&](Backend& b) { b.cross_entropy(logits, targets, label_smoothing, ignore_index, losses, logp, scale); },
      [&](Backend& c, Staging& s) {
        c.cross_entropy(s.in(logits), s.in(targets), label_smoothing, ignore_index, s.out(losses), s.out(logp),
                        s.out(scale));
      });
}
void DeviceDispatch::cross_entropy_backward(const Tensor& logp, const Tensor& targets, const Tensor& gloss,
                                            double label_smoothing, int64_t ignore_index, const Tensor& glogits) {
  dispatch(
      Kernel::cross_entropy_backward, logp.dtype(),
      [&](Backend& b) { b.cross_entropy_backward(logp, targets, gloss, label_smoothing, ignore_index, glogits); },
      [&](Backend& c, Staging& s) {
        c.cross_entropy_backward(s.in(logp), s.in(targets), s.in(gloss), label_smoothing, ignore_index, s.out(glogits));
      });
}
void DeviceDispatch::dropout(const Tensor& x, double p, RngState state, const Tensor& y) {
  dispatch(Kernel::dropout, x.dtype(), [&](Backend& b) { b.dropout(x, p, state, y); },
           [&](Backend& c, Staging& s) { c.dropout(s.in(x), p, state, s.out(y)); });
}
void DeviceDispatch::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g,
                            const Tensor& y) {
  dispatch(Kernel::conv2d, x.dtype(), [&](Backend& b) { b.conv2d(x, w, bias, g, y); },
           [&](Backend& c, Staging& s) { c.conv2d(s.in(x), s.in(w), s.in(bias), g, s.out(y)); });
}
void DeviceDispatch::conv2d_backward_input(const Tensor& gy, const Tensor& w, const Conv2dGeometry& g,
                                           const Tensor& gx) {
  dispatch(Kernel::conv2d_backward_input, gy.dtype(), [&](Backend& b) { b.conv2d_backward_input(gy, w, g, gx); },
           [&](Backend& c, Staging& s) { c.conv2d_backward_input(s.in(gy), s.in(w), g, s.out(gx)); });
}
void DeviceDispatch::conv2d_backward_weight(const Tensor& x, const Tensor& gy, const Conv2dGeometry& g, const Tensor& gw,
                                            const Tensor& gbias) {
  dispatch(Kernel::conv2d_backward_weight, gy.dtype(),
           [&](Backend& b) { b.conv2d_backward_weight(x, gy, g, gw, gbias); },
           [&](Backend& c, Staging& s) { c.conv2d_backward_weight(s.in(x), s.in(gy), g, s.out(gw), s.out(gbias)); });
}
void DeviceDispatch::max_pool2d(const Tensor& x, const Pool2dGeometry& g, const Tensor& y, const Tensor& indices) {
  dispatch(Kernel::max_pool2d, x.dtype(), [&](Backend& b) { b.max_pool2d(x, g, y, indices); },
           [&](Backend& c, Staging& s) { c.max_pool2d(s.in(x), g, s.out(y), s.out(indices)); });
}
void DeviceDispatch::max_pool2d_backward(const Tensor& gy, const Tensor& indices, const Tensor& gx) {
  dispatch(Kernel::max_pool2d_backward, gy.dtype(), [&](Backend& b) { b.max_pool2d_backward(gy, indices, gx); },
           [&](Backend& c, Staging& s) { c.max_pool2d_backward(s.in(gy), s.in(indices), s.out(gx)); });
}
void DeviceDispatch::avg_pool2d(const Tensor& x, const Pool2dGeometry& g, const Tensor& y) {
  dispatch(Kernel::avg_pool2d, x.dtype(), [&](Backend& b) { b.avg_pool2d(x, g, y); },
           [&](Backend& c, Staging& s) { c.avg_pool2d(s.in(x), g, s.out(y)); });
}
void DeviceDispatch::avg_pool2d_backward(const Tensor& gy, const Pool2dGeometry& g, const Tensor& gx) {
  dispatch(Kernel::avg_pool2d_backward, gy.dtype(), [&](Backend& b) { b.avg_pool2d_backward(gy, g, gx); },
           [&](Backend& c, Staging& s) { c.avg_pool2d_backward(s.in(gy), g, s.out(gx)); });
}
void DeviceDispatch::adaptive_avg_pool2d(const Tensor& x, const Tensor& y) {
  dispatch(Kernel::adaptive_avg_pool2d, x.dtype(), [&](Backend& b) { b.adaptive_avg_pool2d(x, y); },
           [&](Backend& c, Staging& s) { c.adaptive_avg_pool2d(s.in(x), s.out(y)); });
}
void DeviceDispatch::adaptive_avg_pool2d_backward(const Tensor& gy, const Tensor& gx) {
  dispatch(Kernel::adaptive_avg_pool2d_backward, gy.dtype(), [&](Backend& b) { b.adaptive_avg_pool2d_backward(gy, gx); },
           [&](Backend& c, Staging& s) { c.adaptive_avg_pool2d_backward(s.in(gy), s.out(gx)); });
}
void DeviceDispatch::batch_norm_statistics(const Tensor& x, const Tensor& mean, const Tensor& var) {
  dispatch(Kernel::batch_norm_statistics, x.dtype(), [&](Backend& b) { b.batch_norm_statistics(x, mean, var); },
           [&](Backend& c, Staging& s) { c.batch_norm_statistics(s.in(x), s.out(mean), s.out(var)); });
}
void DeviceDispatch::batch_norm_apply(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                                      const Tensor& bias, const Tensor& y) {
  dispatch(Kernel::batch_norm_apply, x.dtype(), [&](Backend& b) { b.batch_norm_apply(x, mean, rstd, weight, bias, y); },
           [&](Backend& c, Staging& s) {
             c.batch_norm_apply(s.in(x), s.in(mean), s.in(rstd), s.in(weight), s.in(bias), s.out(y));
           });
}
void DeviceDispatch::batch_norm_backward(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                                         const Tensor& gy, bool batch_statistics, const Tensor& gx,
                                         const Tensor& gweight, const Tensor& gbias) {
  dispatch(
      Kernel::batch_norm_backward, x.dtype(),
      [&](Backend& b) { b.batch_norm_backward(x, mean, rstd, weight, gy, batch_statistics, gx, gweight, gbias); },
      [&](Backend& c, Staging& s) {
        c.batch_norm_backward(s.in(x), s.in(mean), s.in(rstd), s.in(weight), s.in(gy), batch_statistics, s.out(gx),
                              s.out(gweight), s.out(gbias));
      });
}
void DeviceDispatch::sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum, const SgdStep& step) {
  dispatch(Kernel::sgd_step, param.dtype(), [&](Backend& b) { b.sgd_step(param, grad, momentum, step); },
           [&](Backend& c, Staging& s) { c.sgd_step(s.out(param), s.in(grad), s.out(momentum), step); });
}
void DeviceDispatch::adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                                const Tensor& exp_avg_sq, const AdamWStep& step) {
  dispatch(Kernel::adamw_step, param.dtype(), [&](Backend& b) { b.adamw_step(param, grad, exp_avg, exp_avg_sq, step); },
           [&](Backend& c, Staging& s) {
             c.adamw_step(s.out(param), s.in(grad), s.out(exp_avg), s.out(exp_avg_sq), step);
           });
}
void DeviceDispatch::attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params,
                               const Tensor& out, const Tensor& lse) {
  dispatch(Kernel::attention, q.dtype(), [&](Backend& b) { b.attention(q, k, v, params, out, lse); },
           [&](Backend& c, Staging& s) { c.attention(s.in(q), s.in(k), s.in(v), params, s.out(out), s.out(lse)); });
}
void DeviceDispatch::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                        const Tensor& lse, const Tensor& gout, const AttentionParams& params,
                                        const Tensor& gq, const Tensor& gk, const Tensor& gv) {
  dispatch(
      Kernel::attention_backward, q.dtype(),
      [&](Backend& b) { b.attention_backward(q, k, v, out, lse, gout, params, gq, gk, gv); },
      [&](Backend& c, Staging& s) {
        c.attention_backward(s.in(q), s.in(k), s.in(v), s.in(out), s.in(lse), s.in(gout), params, s.out(gq),
                             s.out(gk), s.out(gv));
      });
}

}  // namespace detail

// ---- copies between devices

namespace {
// src as a contiguous tensor on its own device (itself when it already is).
Tensor contiguous_on_device(const Tensor& src) {
  if (src.is_contiguous()) return src;
  Tensor c = detail::allocate_tensor("copy between devices", src.shape(), src.dtype(), memory::Tag::other, src.device());
  backend(src.device()).copy(src, c);
  return c;
}
}  // namespace

void copy_between_devices(const Tensor& src, const Tensor& dst) {
  REMAT_CHECK(src.defined() && dst.defined(), "copy between devices: undefined tensor");
  if (src.device() == dst.device()) return backend(dst.device()).copy(src, dst);
  if (dst.numel() == 0) return;
  if (src.device().type == DeviceType::cpu) {
    // host -> device: the host side takes dst's dtype, shape and a contiguous layout first
    Tensor staged = src;
    if (src.dtype() != dst.dtype() || src.shape() != dst.shape() || !src.is_contiguous()) {
      staged = detail::allocate_tensor("copy between devices", dst.shape(), dst.dtype(), memory::Tag::other, kCpu);
      cpu_backend().copy(src, staged);
    }
    if (dst.is_contiguous()) return backend(dst.device()).copy_from_host(staged.raw_data(), dst);
    Tensor tmp = detail::allocate_tensor("copy between devices", dst.shape(), dst.dtype(), memory::Tag::other, dst.device());
    backend(dst.device()).copy_from_host(staged.raw_data(), tmp);
    return backend(dst.device()).copy(tmp, dst);
  }
  if (dst.device().type == DeviceType::cpu) {
    // device -> host: the bytes of a contiguous copy, straight into dst when it has src's layout
    // and dtype (Tensor::to(kCpu)); otherwise into a host buffer the CPU converts and lays out
    Tensor c = contiguous_on_device(src);
    if (dst.is_contiguous() && dst.dtype() == c.dtype() && dst.shape() == c.shape())
      return backend(src.device()).copy_to_host(c, dst.raw_data());
    Tensor host = detail::allocate_tensor("copy between devices", c.shape(), c.dtype(), memory::Tag::other, kCpu);
    backend(src.device()).copy_to_host(c, host.raw_data());
    return cpu_backend().copy(host, dst);
  }
  // device -> device: through the host
  Tensor host = detail::allocate_tensor("copy between devices", src.shape(), src.dtype(), memory::Tag::other, kCpu);
  copy_between_devices(src, host);
  copy_between_devices(host, dst);
}

}  // namespace remat
