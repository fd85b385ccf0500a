// port_your_model: a model of your own, ported to remat without remat's containers or modules.
//
// The model is a plain class that holds its weights as tensors and loops over its blocks. Porting
// it takes three changes (see docs/guide.md):
//   1. its forward runs as one call() (the root), and each block as a call() inside it: every
//      block is then a layer call, a checkpoint region under the default policy;
//   2. the lambdas given to call() capture by value (they are kept and run again in the backward
//      pass, after the forward's locals are gone);
//   3. a custom op whose backward calls remat::grad turns recording on (EnableGradGuard): the
//      backward pass runs with recording off.
// Then one line picks the policy. The program trains a few SGD steps, and for every policy checks
// that the gradients are bitwise equal to save-all's and prints the peak of saved bytes.
//
//   build/examples/port_your_model [--depth 8] [--width 64] [--batch 32] [--steps 20]
// Exit status 0 when every policy's gradients equal save-all's and the loss fell.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "remat/remat.h"

using namespace remat;

namespace {

// ---- a custom op whose backward differentiates its own forward with remat::grad: x * sigmoid(x)
Tensor swish_forward(const Tensor& x) { return mul(x, sigmoid(x)); }

CustomOp swish_op() {
  return CustomOp{"swish",
                  [](const TensorList& in, SaveContext& ctx) {
                    ctx.save(in[0]);
                    return TensorList{swish_forward(in[0])};
                  },
                  [](const TensorList& grads, const SavedValues& saved) {
                    EnableGradGuard recording;  // without it the ops below record nothing
                    Tensor x = saved[0].detach().requires_grad_();
                    Tensor y = swish_forward(x);
                    return remat::grad({y}, {x}, {grads[0]});
                  }};
}

// ---- the user's model: weights are plain tensors, the forward is a loop
class MyResidualMLP {
 public:
  MyResidualMLP(int depth, int64_t width) {
    const double scale = 1.0 / std::sqrt(double(width));
    for (int i = 0; i < depth; ++i) {
      w1_.push_back(randn({width, width}, DType::f32, 0.0, scale).requires_grad_());
      w2_.push_back(randn({width, width}, DType::f32, 0.0, scale / depth).requires_grad_());
    }
  }

  // One block, unchanged by the port: h + swish(h @ w1) @ w2.
  Tensor block(size_t i, const Tensor& h) const {
    return add(h, matmul(swish_(TensorList{matmul(h, w1_[i])})[0], w2_[i]));
  }

  // The ported forward. The outer call is the root (it runs plain and is transparent); each block
  // call made inside it is a layer call. The lambdas capture `this` and `i` by value: a reference
  // to the loop variable would dangle when the backward pass re-runs the block.
  Tensor forward(const Tensor& x) const {
    CallSite root{.label = "model", .role = CallRole::transparent};
    RegionFn body = [this](const TensorList& in) {
      Tensor h = in[0];
      for (size_t i = 0; i < w1_.size(); ++i) {
        CallSite site{.label = "block" + std::to_string(i)};
        h = call([this, i](const TensorList& b) { return TensorList{block(i, b[0])}; }, {h}, site)[0];
      }
      return TensorList{h};
    };
    return call(body, {x}, root)[0];
  }

  std::vector<Tensor> parameters() const {
    std::vector<Tensor> all = w1_;
    all.insert(all.end(), w2_.begin(), w2_.end());
    return all;
  }

 private:
  std::vector<Tensor> w1_, w2_;
  CustomOp swish_ = swish_op();
};

Tensor loss_of(const MyResidualMLP& model, const Tensor& x, const Tensor& target) {
  Tensor d = sub(model.forward(x), target);
  return mean(mul(d, d));
}

bool same_bits(const Tensor& a, const Tensor& b) {
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.shape() == cb.shape() &&
         std::memcmp(ca.data<float>(), cb.data<float>(), sizeof(float) * size_t(ca.numel())) == 0;
}

struct Args {
  int depth = 8;
  int64_t width = 64, batch = 32;
  int steps = 20;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    long v = std::strtol(argv[i + 1], nullptr, 10);
    if (v < 1 || v > 4096) { std::fprintf(stderr, "%s: expected 1 to 4096\n", k.c_str()); std::exit(2); }
    if (k == "--depth") a.depth = int(v);
    else if (k == "--width") a.width = v;
    else if (k == "--batch") a.batch = v;
    else if (k == "--steps") a.steps = int(v);
    else { std::fprintf(stderr, "unknown option %s\n", k.c_str()); std::exit(2); }
  }
  return a;
}

}  // namespace

int run(const Args& args) {
  manual_seed(7);
  MyResidualMLP model(args.depth, args.width);
  Tensor x = randn({args.batch, args.width});
  Tensor target = tanh(randn({args.batch, args.width}));

  // Gradients and peak saved bytes of one step under each policy, against save-all's.
  std::vector<Tensor> reference;
  bool all_equal = true;
  std::printf("%-18s %14s %10s\n", "policy", "peak saved", "gradients");
  for (const char* name : {"save-all", "every-layer", "every-k:2", "selective:matmul", "dynamic:320KiB"}) {
    ScopedPolicy policy(name);  // the one line that picks the policy for the whole model
    for (Tensor& p : model.parameters()) p.zero_grad();
    memory::reset_peaks();
    loss_of(model, x, target).backward();
    const size_t peak = memory::peak_bytes(memory::Tag::saved);
    std::vector<Tensor> grads;
    for (const Tensor& p : model.parameters()) grads.push_back(p.grad().contiguous());
    bool equal = true;
    if (reference.empty()) reference = grads;
    for (size_t i = 0; i < grads.size(); ++i) equal = equal && same_bits(grads[i], reference[i]);
    all_equal = all_equal && equal;
    std::printf("%-18s %14s %10s\n", name, memory::format_bytes(double(peak)).c_str(),
                name == std::string("save-all") ? "reference" : equal ? "bitwise equal" : "DIFFER");
  }

  // A few SGD steps under the default policy (every-layer).
  double first = 0, last = 0;
  for (int step = 0; step < args.steps; ++step) {
    for (Tensor& p : model.parameters()) p.zero_grad();
    Tensor loss = loss_of(model, x, target);
    loss.backward();
    NoGradGuard no_grad;
    for (Tensor& p : model.parameters()) p.copy_(sub(p, mul_scalar(p.grad(), 0.2)));
    last = loss.item();
    if (step == 0) first = last;
  }
  std::printf("loss %.5f -> %.5f over %d steps (every-layer)\n", first, last, args.steps);
  const bool fell = last < first;
  if (!all_equal) std::fprintf(stderr, "port_your_model: a policy's gradients differ from save-all's\n");
  if (!fell) std::fprintf(stderr, "port_your_model: the loss did not fall\n");
  return all_equal && fell ? 0 : 1;
}

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const Error& e) {
    std::fprintf(stderr, "port_your_model: %s\n", e.what());
    return 1;
  }
}
