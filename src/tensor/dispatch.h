// Internal: the dispatcher that backend(device) returns for a registered, non-CPU device.
//
// For each kernel call: if the device's backend supports() the kernel for the call's dtype, the
// call goes to it inside a DeviceKernelScope (the only place where host code may hold a pointer
// into device memory); otherwise it runs on the CPU backend: every tensor operand is copied to a
// host tensor, the CPU kernel runs on those, and the outputs (which the caller allocated on the
// device) receive the host results. Slow, and counted (fallback_calls), but complete: a backend
// may start with a handful of kernels.
#pragma once

#include <atomic>

#include "remat/backend.h"

namespace remat::detail {

class DeviceDispatch final : public Backend {
 public:
  DeviceDispatch(Device device, Backend& inner) : device_(device), inner_(inner) {}
  uint64_t fallback_calls() const { return fallbacks_.load(); }

  DeviceType device_type() const override { return inner_.device_type(); }
  memory::Allocator& allocator() override { return inner_.allocator(); }
  void set_num_threads(int threads) override { inner_.set_num_threads(threads); }
  int num_threads() const override { return inner_.num_threads(); }
  void copy_from_host(const void* host, const Tensor& dst) override;
  void copy_to_host(const Tensor& src, void* host) override;
  void synchronize() override;
  bool supports(Kernel kernel, DType dtype) const override { return inner_.supports(kernel, dtype); }

  void copy(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& dst, double value) override;
  void arange(const Tensor& dst, double start, double step) override;
  void rand_uniform(const Tensor& dst, RngState state, double low, double high) override;
  void rand_normal(const Tensor& dst, RngState state, double mean, double stddev) override;
  void unary(UnaryOp op, const Tensor& x, const Tensor& y, double scalar) override;
  void unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& gy, const Tensor& gx,
                      double scalar) override;
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out) override;
  void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, double alpha,
            double beta) override;
  void softmax(const Tensor& x, const Tensor& y, bool log) override;
  void softmax_backward(const Tensor& y, const Tensor& gy, const Tensor& gx, bool log) override;
  void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                  const Tensor& mean, const Tensor& rstd) override;
  void layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                           const Tensor& gy, const Tensor& gx, const Tensor& gweight, const Tensor& gbias) override;
  void rms_norm(const Tensor& x, const Tensor& weight, double eps, const Tensor& y, const Tensor& rstd) override;
  void rms_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& gy,
                         const Tensor& gx, const Tensor& gweight) override;
  void embedding(const Tensor& table, const Tensor& ids, const Tensor& out) override;
  void embedding_backward(const Tensor& ids, const Tensor& gout, const Tensor& gtable) override;
  void cross_entropy(const Tensor& logits, const Tensor& targets, double label_smoothing, int64_t ignore_index,
                     const Tensor& losses, const Tensor& logp, const Tensor& scale) override;
  void cross_entropy_backward(const Tensor& logp, const Tensor& targets, const Tensor& gloss,
                              double label_smoothing, int64_t ignore_index, const Tensor& glogits) override;
  void dropout(const Tensor& x, double p, RngState state, const Tensor& y) override;
  void conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g,
              const Tensor& y) override;
  void conv2d_backward_input(const Tensor& gy, const Tensor& w, const Conv2dGeometry& g, const Tensor& gx) override;
  void conv2d_backward_weight(const Tensor& x, const Tensor& gy, const Conv2dGeometry& g, const Tensor& gw,
                              const Tensor& gbias) override;
  void max_pool2d(const Tensor& x, const Pool2dGeometry& g, const Tensor& y, const Tensor& indices) override;
  void max_pool2d_backward(const Tensor& gy, const Tensor& indices, const Tensor& gx) override;
  void avg_pool2d(const Tensor& x, const Pool2dGeometry& g, const Tensor& y) override;
  void avg_pool2d_backward(const Tensor& gy, const Pool2dGeometry& g, const Tensor& gx) override;
  void adaptive_avg_pool2d(const Tensor& x, const Tensor& y) override;
  void adaptive_avg_pool2d_backward(const Tensor& gy, const Tensor& gx) override;
  void batch_norm_statistics(const Tensor& x, const Tensor& mean, const Tensor& var) override;
  void batch_norm_apply(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                        const Tensor& bias, const Tensor& y) override;
  void batch_norm_backward(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                           const Tensor& gy, bool batch_statistics, const Tensor& gx, const Tensor& gweight,
                           const Tensor& gbias) override;
  void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum, const SgdStep& step) override;
  void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                  const AdamWStep& step) override;
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params,
                 const Tensor& out, const Tensor& lse) override;
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                          const Tensor& gout, const AttentionParams& params, const Tensor& gq, const Tensor& gk,
                          const Tensor& gv) override;

 private:
  class Staging;
  template <class OnDevice, class OnHost>
  void dispatch(Kernel kernel, DType dtype, OnDevice&& on_device, OnHost&& on_host);

  Device device_;
  Backend& inner_;
  std::atomic<uint64_t> fallbacks_{0};
};

}  // namespace remat::detail
