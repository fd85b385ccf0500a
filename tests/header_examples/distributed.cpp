// The examples of include/remat/distributed.h, run as one process (without mpirun there is one
// rank and the collectives leave their arguments as they are): the training loop, gradient
// buckets, and the data-parallel step.
#include <gtest/gtest.h>

#include "remat/distributed.h"
#include "remat/nn.h"

using namespace remat;

namespace {

struct Batch {
  Tensor inputs, targets;
};

Batch batch_of(int64_t index) {
  return {randn({8, 16}, DType::f32, RngState{100 + static_cast<uint64_t>(index), 0}),
          randn({8, 4}, DType::f32, RngState{200 + static_cast<uint64_t>(index), 0})};
}

// A small regression model with the loss the examples call.
struct Model : nn::Module {
  Model() {
    hidden = register_module("hidden", std::make_shared<nn::Linear>(16, 16));
    out = register_module("out", std::make_shared<nn::Linear>(16, 4));
  }
  Tensor forward_impl(const Tensor& x) override { return out->forward(tanh(hidden->forward(x))); }
  Tensor loss(const Tensor& inputs, const Tensor& targets) { return nn::mse_loss(forward(inputs), targets); }
  Tensor loss(const Batch& b) { return loss(b.inputs, b.targets); }
  std::shared_ptr<nn::Linear> hidden, out;
};

}  // namespace

TEST(DistributedH, TrainingLoop) {
  Model model;
  nn::SGD optimizer(model.parameters(), {.lr = 0.1});
  const Policy policy = Policy::every_layer();
  const int64_t steps = 3;
  auto batch = batch_of;
  const Tensor before = model.parameters()[0].clone();
REMAT_EXAMPLE(include/remat/distributed.h: remat::distributed::init();)
  EXPECT_EQ(remat::distributed::world_size(), 1);
  EXPECT_NE(model.parameters()[0].to_vector(), before.to_vector());  // the optimizer stepped
}

TEST(DistributedH, GradientBuckets) {
  Model model;
  const Batch b = batch_of(0);
  model.loss(b).backward();
  std::vector<std::vector<double>> plain;
  for (const Tensor& p : model.parameters()) plain.push_back(p.grad().to_vector());
  model.zero_grad();
  Tensor loss = model.loss(b);
REMAT_EXAMPLE(include/remat/distributed.h: distributed::GradientBuckets buckets(model.parameters());)
  // one rank: every .grad() is its own gradient, as a plain backward gives it
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(model.parameters()[i].grad().to_vector(), plain[i]);
}

TEST(DistributedH, DataParallelStep) {
  Model model;
  nn::SGD optimizer(model.parameters(), {.lr = 0.1});
  const Policy policy = Policy::every_layer();
  const int64_t step = 0;
  double expected = 0;  // the mean loss of the 4 micro-batches
  for (int64_t i = 0; i < 4; ++i) expected += model.loss(batch_of(i)).item() / 4;
REMAT_EXAMPLE(include/remat/distributed.h: distributed::StepResult r = distributed::data_parallel_step()
  EXPECT_NEAR(r.loss, expected, 1e-6);
}
