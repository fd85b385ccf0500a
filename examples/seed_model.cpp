// seed_model: the model of the user thread remat answers ("avoid storing intermediate results of
// the forward pass by default"), written in remat.
//
// The user had a memory-bound model of their own layers: tensor contractions, and a custom rule
// around a hand-written kernel. They wanted every layer checkpointed without editing the library's
// container. Here the model is a class of its own (no Sequential, no Chain): its forward loops over
// its blocks, and every block call is a checkpoint region by default. One line changes the policy
// for the whole model; one layer holds a nested region; the program trains with AdamW and checks
// that the gradients are bitwise equal to those of save-all.
//
//   build/examples/seed_model [--steps 60] [--blocks 8] [--voxels 64] [--channels 32] [--batch 16]
//                             [--policy every-layer] [--threads 0]
//
// Layers (all user classes):
//   Contraction     y[b,v,k] = sum_c x[b,v,c] W[c,k], then mixing over voxels
//                   z[b,v,k] = sum_u M[v,u] y[b,u,k]: two einsum contractions (as TensorOperations
//                   would write them)
//   Softplus        y = log(1 + exp(x)), a hand-written kernel (plain loops, forward and backward)
//                   made differentiable through remat::CustomOp
//   Block           x + Softplus(Contraction(LayerNorm(x))), with the Contraction marked as a layer
//                   of its own: a region nested inside the block's region
//   VoxelModel      Linear embedding, N blocks in a std::vector, Linear head
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "remat/nn.h"
#include "remat/remat.h"

using namespace remat;

namespace {

// ---- a hand-written kernel: softplus, forward and backward as plain loops over f32 data
void softplus_forward(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 20.0f ? x[i] : std::log1p(std::exp(x[i]));
}
void softplus_backward(const float* x, const float* gy, float* gx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gx[i] = gy[i] / (1.0f + std::exp(-x[i]));  // d/dx softplus = sigmoid
}

CustomOp softplus_op() {
  return CustomOp{"softplus",
                  [](const TensorList& in, SaveContext& ctx) {
                    REMAT_CHECK(in[0].dtype() == DType::f32, "softplus: this kernel takes f32");
                    Tensor x = in[0].contiguous();
                    Tensor y = Tensor::empty(x.shape(), DType::f32);
                    softplus_forward(x.data<float>(), y.data<float>(), x.numel());
                    ctx.save(x);
                    return TensorList{y};
                  },
                  [](const TensorList& grads, const SavedValues& saved) {
                    Tensor gy = grads[0].contiguous();
                    Tensor gx = Tensor::empty(saved[0].shape(), DType::f32);
                    softplus_backward(saved[0].data<float>(), gy.data<float>(), gx.data<float>(), gx.numel());
                    return TensorList{gx};
                  }};
}

class Softplus : public nn::Module {
 public:
  Tensor forward_impl(const Tensor& x) override { return op_({x})[0]; }
  std::string type_name() const override { return "Softplus"; }

 private:
  CustomOp op_ = softplus_op();
};

// ---- tensor contractions
class Contraction : public nn::Module {
 public:
  Contraction(int64_t voxels, int64_t channels) {
    const double c = static_cast<double>(channels), v = static_cast<double>(voxels);
    w = register_parameter("w", {channels, channels}, DType::f32, nn::Init::normal(0.0, 1.0 / std::sqrt(c)));
    m = register_parameter("m", {voxels, voxels}, DType::f32, nn::Init::normal(0.0, 1.0 / std::sqrt(v)));
  }
  Tensor forward_impl(const Tensor& x) override {
    Tensor y = nn::einsum("bvc,ck->bvk", {x, w});  // x [B, V, C] -> [B, V, C]
    return nn::einsum("vu,buk->bvk", {m, y});      // mixing over voxels
  }
  std::string type_name() const override { return "Contraction"; }
  Tensor w, m;
};

class Block : public nn::Module {
 public:
  Block(int64_t voxels, int64_t channels) {
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(channels));
    contract = register_module("contract", std::make_shared<Contraction>(voxels, channels));
    act = register_module("act", std::make_shared<Softplus>());
    // A region inside the block's region: the contraction is recomputed once more in the backward
    // pass, and the block's own re-run keeps only its input instead of the contraction's internals.
    contract->set_layer();
  }
  Tensor forward_impl(const Tensor& x) override { return add(x, act->forward(contract->forward(norm->forward(x)))); }
  std::string type_name() const override { return "Block"; }
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<Contraction> contract;
  std::shared_ptr<Softplus> act;
};

class VoxelModel : public nn::Module {
 public:
  VoxelModel(int blocks, int64_t voxels, int64_t features, int64_t channels) {
    embed = register_module("embed", std::make_shared<nn::Linear>(features, channels));
    for (int i = 0; i < blocks; ++i)
      layers.push_back(register_module("block" + std::to_string(i), std::make_shared<Block>(voxels, channels)));
    head = register_module("head", std::make_shared<nn::Linear>(channels, 1));
  }
  Tensor forward_impl(const Tensor& x) override {  // x [B, V, F] -> [B, V, 1]
    Tensor h = embed->forward(x);
    for (auto& block : layers) h = block->forward(h);  // every call: a checkpoint region
    return head->forward(h);
  }
  std::string type_name() const override { return "VoxelModel"; }
  std::shared_ptr<nn::Linear> embed, head;
  std::vector<std::shared_ptr<Block>> layers;
};

struct Options {
  int steps = 60, blocks = 8, threads = 0;
  int64_t voxels = 64, channels = 32, batch = 16, features = 8;
  std::string policy = "every-layer";
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) throw Error("seed_model: option " + k + " needs a value");
    std::string v = argv[++i];
    char* end = nullptr;
    long long n = std::strtoll(v.c_str(), &end, 10);
    const bool numeric = end != v.c_str() && *end == '\0' && n > 0 && n < (1 << 20);
    if (k == "--policy") {
      o.policy = v;
      continue;
    }
    if (k == "--threads" && v == "0") continue;
    REMAT_CHECK(numeric, "seed_model: ", k, " expects a positive integer below 2^20, got '", v, "'");
    if (k == "--steps") o.steps = static_cast<int>(n);
    else if (k == "--blocks") o.blocks = static_cast<int>(n);
    else if (k == "--voxels") o.voxels = n;
    else if (k == "--channels") o.channels = n;
    else if (k == "--batch") o.batch = n;
    else if (k == "--threads") o.threads = static_cast<int>(n);
    else throw Error("seed_model: unknown option " + k +
                     " (known: --steps --blocks --voxels --channels --batch --policy --threads)");
  }
  return o;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.shape() == cb.shape() && std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

// Mean squared error of the model against the teacher's targets, backward under the policy in force.
struct StepResult {
  double loss = 0;
  size_t peak_saved = 0;
  TensorList grads;
};
StepResult step(VoxelModel& model, const Tensor& x, const Tensor& target, bool keep_grads) {
  model.zero_grad();
  memory::reset_peaks();
  const size_t base = memory::live_bytes(memory::Tag::saved);
  Tensor loss = mean(square(sub(model.forward(x), target)));
  loss.backward();
  StepResult r;
  r.loss = loss.item();
  r.peak_saved = memory::peak_bytes(memory::Tag::saved) - base;
  if (keep_grads)
    for (const auto& p : model.parameters()) r.grads.push_back(p.grad().clone());
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  if (o.threads > 0) set_num_threads(o.threads);
  const Policy policy = Policy::parse(o.policy);

  auto model = std::make_shared<VoxelModel>(o.blocks, o.voxels, o.features, o.channels);
  model->reset_parameters(1);
  // The one line that sets the policy for the whole model (every-layer is the default anyway):
  model->set_policy(policy);

  // Synthetic data: a fixed random "teacher" maps voxel features to a target field.
  Tensor teacher = randn({o.features, 1}, DType::f32, RngState{7, 0});
  auto batch = [&](int i) {
    Tensor x = randn({o.batch, o.voxels, o.features}, DType::f32, RngState{100, static_cast<uint64_t>(i) << 32});
    Tensor y = tanh(matmul(x, teacher));  // [B, V, 1]
    return std::make_pair(x, y);
  };

  std::printf("seed_model: %d blocks, %lld voxels x %lld channels, batch %lld, %lld parameters, policy %s\n", o.blocks,
              static_cast<long long>(o.voxels), static_cast<long long>(o.channels), static_cast<long long>(o.batch),
              static_cast<long long>(model->num_parameters()), policy.to_string().c_str());

  // 1. Checkpointing never changes results: one step under save-all and under the policy.
  auto [x0, y0] = batch(0);
  model->set_policy(Policy::save_all());
  StepResult reference = step(*model, x0, y0, true);
  model->set_policy(policy);
  reset_counters();
  StepResult checked = step(*model, x0, y0, true);
  bool equal = reference.grads.size() == checked.grads.size();
  for (size_t i = 0; equal && i < checked.grads.size(); ++i) equal = same_bits(checked.grads[i], reference.grads[i]);
  const Counters c = counters();
  std::printf("one step: %llu layer calls, %llu regions; peak saved %s under %s vs %s under save-all (%.3fx)\n",
              static_cast<unsigned long long>(c.layer_calls), static_cast<unsigned long long>(c.regions_created),
              memory::format_bytes(static_cast<double>(checked.peak_saved)).c_str(), policy.to_string().c_str(),
              memory::format_bytes(static_cast<double>(reference.peak_saved)).c_str(),
              static_cast<double>(checked.peak_saved) / static_cast<double>(std::max<size_t>(1, reference.peak_saved)));
  std::printf("gradients bitwise equal to save-all: %s\n", equal ? "yes" : "NO");
  std::printf("%s", memory_report(c, reference.peak_saved).c_str());

  // 2. Training with AdamW under the policy; the loss on a held-out batch before and after.
  auto [x_eval, y_eval] = batch(1 << 20);
  auto eval_loss = [&] {
    NoGradGuard no_grad;
    return mean(square(sub(model->forward(x_eval), y_eval))).item();
  };
  const double eval_before = eval_loss();
  nn::AdamW optimizer(model->parameters(), {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = 0.0});
  const auto t0 = std::chrono::steady_clock::now();
  double first = 0, last = 0;
  for (int s = 0; s < o.steps; ++s) {
    auto [x, y] = batch(s + 1);
    StepResult r = step(*model, x, y, false);
    optimizer.step();
    if (s == 0) first = r.loss;
    last = r.loss;
    if (s % std::max(1, o.steps / 10) == 0 || s + 1 == o.steps)
      std::printf("step %4d/%d  loss %.5f  peak saved %s\n", s + 1, o.steps, r.loss,
                  memory::format_bytes(static_cast<double>(r.peak_saved)).c_str());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double eval_after = eval_loss();
  std::printf("trained %d steps in %.1f s: loss %.5f -> %.5f; held-out loss %.5f -> %.5f\n", o.steps, seconds, first,
              last, eval_before, eval_after);
  return equal && eval_after < eval_before ? 0 : 1;
} catch (const Error& e) {
  std::fprintf(stderr, "seed_model: %s\n", e.what());
  return 2;
}
