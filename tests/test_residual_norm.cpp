// The residual add fused into layer norm (add_layer_norm, Note [the residual add fused into layer
// norm] in src/autodiff/ops/norm.cpp), beyond its op rows:
//   - a GPT whose blocks run the fused op gives the loss and every gradient of the unfused block
//     (the add followed by layer_norm, as TransformerBlock was written before), bit for bit, on the
//     CPU in f32, f64 and bf16, and on the emulated device;
//   - under every policy the fused GPT's gradients are save-all's, bit for bit, also when the sum
//     has several other consumers inside checkpointed regions;
//   - bad input is a remat::Error naming what is wrong, and records nothing.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint_models.h"
#include "emulated_backend.h"
#include "remat/nn.h"
#include "remat/remat.h"

using namespace remat;
using remat::testing::bitwise_equal;

namespace {

nn::GPTConfig tiny_gpt(DType dtype) {
  return {.vocab = 61, .layers = 2, .width = 32, .heads = 2, .seq = 16, .dropout = 0.1, .dtype = dtype, .seed = 5};
}

Tensor tokens(int64_t batch, int64_t seq, int64_t vocab, uint64_t salt, Device device) {
  std::vector<int64_t> v(static_cast<size_t>(batch * seq));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>((i * 7 + salt * 13) % static_cast<size_t>(vocab));
  return from_indices(v, {batch, seq}, device);
}

// TransformerBlock's forward as it was written before the fused op: add, then ln2 on the sum.
Tensor unfused_block(nn::TransformerBlock& block, const Tensor& x) {
  Tensor h = add(x, block.attn->forward(block.ln1->forward(x)));
  return add(h, block.mlp->forward(block.ln2->forward(h)));
}

// GPT::forward_impl with the unfused blocks.
Tensor unfused_loss(nn::GPT& model, const Tensor& ids, const Tensor& targets) {
  const Tensor positions = arange(ids.size(1), DType::i64, ids.device());
  Tensor x = add(model.wte->forward(ids), model.wpe->forward(positions));
  x = model.drop->forward(x);
  for (const auto& [name, child] : model.blocks->named_children())
    x = unfused_block(dynamic_cast<nn::TransformerBlock&>(*child), x);
  return nn::cross_entropy(model.lm_head->forward(model.ln_f->forward(x)), targets);
}

struct Result {
  Tensor loss;
  std::vector<Tensor> grads;
};

Result run(nn::GPT& model, const std::function<Tensor()>& loss_fn, const Policy& policy) {
  model.zero_grad();
  manual_seed(11);  // the same dropout masks in every run
  Result r;
  r.loss = backward(loss_fn, GradOptions{policy}).detach().to(kCpu);
  for (const Tensor& p : model.parameters()) r.grads.push_back(p.grad().to(kCpu));
  return r;
}

void expect_same_bits(const Result& a, const Result& b, const std::string& what) {
  EXPECT_TRUE(bitwise_equal(a.loss, b.loss)) << what << ": loss " << a.loss.item() << " vs " << b.loss.item();
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i)
    EXPECT_TRUE(bitwise_equal(a.grads[i], b.grads[i])) << what << ": gradient " << i;
}

// FNV-1a over the loss's and the gradients' bytes, printed for the record.
uint64_t digest(const Result& r) {
  uint64_t h = 1469598103934665603ull;
  auto feed = [&](const Tensor& t) {
    const Tensor c = t.contiguous();
    const auto* p = static_cast<const unsigned char*>(c.raw_data());
    for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  feed(r.loss);
  for (const Tensor& g : r.grads) feed(g);
  return h;
}

size_t kernel_calls(const DeviceActivity& from, const DeviceActivity& to, Kernel k) {
  return static_cast<size_t>(to.calls_by_kernel[static_cast<size_t>(k)] - from.calls_by_kernel[static_cast<size_t>(k)]);
}

}  // namespace

TEST(ResidualNorm, GptWithTheFusedBlockGivesTheUnfusedBitsOnTheCpuAndTheEmulatedDevice) {
  remat::testing::EmulatedDevice dev;
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    for (const Device device : {kCpu, dev.device}) {
      nn::GPT model(tiny_gpt(dtype));
      model.to(device);
      const Tensor ids = tokens(2, 16, 61, 1, device), targets = tokens(2, 16, 61, 2, device);
      const Policy save_all = Policy::save_all();
      const DeviceActivity before = device_activity(device);
      const Result fused = run(model, [&] { return model.loss(ids, targets); }, save_all);
      const DeviceActivity after = device_activity(device);
      const Result plain = run(model, [&] { return unfused_loss(model, ids, targets); }, save_all);
      const DeviceActivity plain_done = device_activity(device);
      const std::string what = std::string(dtype_name(dtype)) + " on " + device_name(device);
      expect_same_bits(fused, plain, what);
      if (device != kCpu && dtype != DType::bf16) {  // one fused call each way per block (bf16: the unfused kernels)
        EXPECT_EQ(kernel_calls(before, after, Kernel::add_layer_norm), 2u) << what;
        EXPECT_EQ(kernel_calls(before, after, Kernel::add_layer_norm_backward), 2u) << what;
        EXPECT_EQ(kernel_calls(before, after, Kernel::layer_norm), 3u) << what << ": ln1 of each block and ln_f";
        const uint64_t fused_calls = after.kernel_calls - before.kernel_calls;
        const uint64_t plain_calls = plain_done.kernel_calls - after.kernel_calls;
        EXPECT_EQ(plain_calls - fused_calls, 4u) << what << ": two calls fewer per block";
        std::printf("%s: %llu kernel calls for a forward and backward with the fused block, %llu unfused\n",
                    what.c_str(), static_cast<unsigned long long>(fused_calls),
                    static_cast<unsigned long long>(plain_calls));
      }
      std::printf("%s: loss %.9g, loss and gradients digest %016llx (fused) %016llx (unfused)\n", what.c_str(),
                  fused.loss.item(), static_cast<unsigned long long>(digest(fused)),
                  static_cast<unsigned long long>(digest(plain)));
    }
  }
}

TEST(ResidualNorm, EveryPolicyGivesSaveAllsBitsWithTheFusedBlock) {
  nn::GPT model(tiny_gpt(DType::f32));
  const Tensor ids = tokens(2, 16, 61, 3, kCpu), targets = tokens(2, 16, 61, 4, kCpu);
  const Result reference = run(model, [&] { return model.loss(ids, targets); }, Policy::save_all());
  const DynamicRange range = dynamic_feasible_range([&] {
    model.zero_grad();
    model.loss(ids, targets).backward();
  });
  const std::string tight = "dynamic:" + std::to_string(range.smallest_budget_bytes);
  for (const std::string text : {"every-layer", "every-k:2", "selective:add_layer_norm",
                                 "selective:matmul,add_layer_norm", "selective:layer_norm", tight.c_str()}) {
    const uint64_t evictions = counters().dynamic.evictions;
    const Result r = run(model, [&] { return model.loss(ids, targets); }, Policy::parse(text));
    expect_same_bits(r, reference, text);
    if (text == tight) EXPECT_GT(counters().dynamic.evictions, evictions) << text << " evicted nothing";
  }
}

// The sum used by the norm and by two more consumers, inside regions that recompute it: every
// policy gives save-all's bits (the engine adds the other consumers' gradients, the op adds the
// norm's: the same on every run).
TEST(ResidualNorm, ASumWithSeveralConsumersInRegionsGivesSaveAllsBits) {
  for (const DType dtype : {DType::f32, DType::f64}) {
    const Tensor x = randn({3, 4, 12}, dtype, RngState{1, 0}).requires_grad_();
    const Tensor w = randn({12}, dtype, RngState{2, 0}, 1.0, 0.1).requires_grad_();
    const Tensor b = randn({12}, dtype, RngState{3, 0}, 0.0, 0.1).requires_grad_();
    const Tensor m = randn({12, 12}, dtype, RngState{4, 0}, 0.0, 0.3).requires_grad_();
    Chain chain;
    for (int i = 0; i < 3; ++i)
      chain.add([&](const Tensor& h) {
        TensorList hn = add_layer_norm(h, tanh(matmul(h, m)), w, b);
        return add(add(hn[0], mul(hn[0], tanh(hn[0]))), matmul(hn[1], m));
      });
    const DynamicRange range = dynamic_feasible_range([&] {
      for (Tensor p : {x, w, b, m}) p.zero_grad();
      chain.forward(x).sum().backward();
    });
    const std::string tight = "dynamic:" + std::to_string(range.smallest_budget_bytes);
    std::vector<Tensor> reference;
    for (const std::string text : {"save-all", "every-layer", "every-k:2", "selective:add_layer_norm", tight.c_str()}) {
      for (Tensor p : {x, w, b, m}) p.zero_grad();
      const uint64_t evictions = counters().dynamic.evictions;
      backward([&] { return chain.forward(x).sum(); }, GradOptions{Policy::parse(text)});
      if (text == tight) EXPECT_GT(counters().dynamic.evictions, evictions) << text << " evicted nothing";
      std::vector<Tensor> grads;
      for (Tensor p : {x, w, b, m}) grads.push_back(p.grad().clone());
      if (reference.empty()) {
        reference = grads;
        continue;
      }
      for (size_t i = 0; i < grads.size(); ++i)
        EXPECT_TRUE(bitwise_equal(grads[i], reference[i])) << text << " " << dtype_name(dtype) << " gradient " << i;
    }
  }
}

TEST(ResidualNorm, BadInputIsAnErrorNamingWhatIsWrong) {
  const Tensor x = randn({2, 3, 4}), r = randn({2, 3, 4}), w = ones({4}), b = zeros({4});
  auto expect_error = [](const std::function<void()>& f, const std::vector<std::string>& parts) {
    try {
      f();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string m = e.what();
      for (const auto& p : parts) EXPECT_NE(m.find(p), std::string::npos) << m << " lacks " << p;
    }
  };
  remat::testing::EmulatedDevice dev;
  const Tensor r64 = r.to(DType::f64), w64 = w.to(DType::f64), r_elsewhere = r.to(dev.device);
  const uint64_t ops_before = autodiff::op_counters().forward_ops;
  expect_error([&] { add_layer_norm(x, randn({2, 4, 3}), w, b); }, {"add_layer_norm", "[2, 4, 3]", "[2, 3, 4]"});
  expect_error([&] { add_layer_norm(x, randn({3, 4}), w, b); }, {"add_layer_norm", "[3, 4]", "broadcast"});
  expect_error([&] { add_layer_norm(x, r64, w, b); }, {"add_layer_norm", "f64", "f32"});
  expect_error([&] { add_layer_norm(x, r, ones({5}), b); }, {"add_layer_norm", "weight", "[5]", "[4]"});
  expect_error([&] { add_layer_norm(x, r, w, zeros({3})); }, {"add_layer_norm", "bias", "[3]"});
  expect_error([&] { add_layer_norm(x, r, w64, b); }, {"add_layer_norm", "weight", "f64"});
  expect_error([&] { add_layer_norm(x, Tensor(), w, b); }, {"add_layer_norm", "residual", "undefined"});
  expect_error([&] { add_layer_norm(x, r, w, b, 0.0); }, {"add_layer_norm", "eps"});
  expect_error([&] { add_layer_norm(from_indices({1, 2}, {2}), from_indices({1, 2}, {2}), Tensor(), Tensor()); },
               {"add_layer_norm", "i64"});
  expect_error([&] { add_layer_norm(x, r_elsewhere, w, b); }, {"add_layer_norm", "residual", "cpu"});
  EXPECT_EQ(autodiff::op_counters().forward_ops, ops_before) << "a refused call ran an op";
  nn::LayerNorm ln(4);
  expect_error([&] { ln.forward(TensorList{x, r, r}); }, {"LayerNorm(4)", "3"});
  expect_error([&] { ln.forward(TensorList{randn({2, 5}), randn({2, 5})}); }, {"LayerNorm(4)", "[2, 5]"});
}
