// The examples of include/remat/nn/training_state.h: a state written after some steps, from which
// a second model and optimizer continue to the bits of the run never stopped; the three-step write
// of the optimizer's shards, here by one process.
#include <gtest/gtest.h>

#include <filesystem>

#include "remat/nn.h"
#include "temp_dir.h"

using namespace remat;

namespace {

// A model with dropout (the default generator is part of the state), its AdamW, fixed data.
struct Training {
  std::shared_ptr<nn::Sequential> model = std::make_shared<nn::Sequential>();
  std::unique_ptr<nn::AdamW> optimizer;
  Training() {
    model->add(std::make_shared<nn::Linear>(6, 8));
    model->add(std::make_shared<nn::Dropout>(0.25));
    model->add(std::make_shared<nn::Linear>(8, 3));
    model->reset_parameters(7);
    optimizer = std::make_unique<nn::AdamW>(model->parameters(), nn::AdamWOptions{.lr = 0.01});
  }
  void train_step(int64_t step) {
    const Tensor x = randn({5, 6}, DType::f32, RngState{99, static_cast<uint64_t>(step) * 64});
    optimizer->zero_grad();
    mean(square(model->forward(x))).backward();
    optimizer->step();
  }
  std::vector<std::vector<double>> weights() const {
    std::vector<std::vector<double>> w;
    for (const Tensor& p : model->parameters()) w.push_back(p.to_vector());
    return w;
  }
};

// The current directory, for the example's relative "run", restored at the end.
struct InDirectory {
  std::filesystem::path previous = std::filesystem::current_path();
  explicit InDirectory(const std::string& dir) { std::filesystem::current_path(dir); }
  ~InDirectory() { std::filesystem::current_path(previous); }
};

}  // namespace

TEST(NnTrainingStateH, AResumedRunEndsWithTheBitsOfTheRunNeverStopped) {
  InDirectory here(remat::testing::fresh_dir("training-state-example"));
  std::filesystem::create_directory("run");  // the states' directory, made by the caller
  const int64_t steps = 6, done = 3;
  set_rng_state(RngState{5, 0});
  Training never_stopped;
  for (int64_t step = 0; step < steps; ++step) never_stopped.train_step(step);

  set_rng_state(RngState{5, 0});
  Training first;
  for (int64_t step = 0; step < done; ++step) first.train_step(step);
  {
    auto& model = *first.model;
    auto& optimizer = *first.optimizer;
REMAT_EXAMPLE(include/remat/nn/training_state.h: nn::TrainingState state{.step = done)
    EXPECT_EQ(nn::latest_training_state("run"), nn::training_state_path("run", done));
  }
  set_rng_state(RngState{123, 0});  // the later process's generator, replaced by the state's
  Training second;
  {
    auto& model = *second.model;
    auto& optimizer = *second.optimizer;
    auto train_step = [&](int64_t step) { second.train_step(step); };
REMAT_EXAMPLE(include/remat/nn/training_state.h: const std::string newest)
    EXPECT_EQ(resumed.step, done);
    EXPECT_EQ(newest, nn::training_state_path("run", done));
  }
  EXPECT_EQ(second.weights(), never_stopped.weights());
}

TEST(NnTrainingStateH, TheShardedWriteByOneProcessIsAState) {
  const std::string path = remat::testing::fresh_dir("training-state-shards") + "/step-00000001";
  Training run;
  run.train_step(0);
  auto& model = *run.model;
  auto& optimizer = *run.optimizer;
  const nn::TrainingState state{.step = 1, .rng = rng_state()};
  const int rank = 0, world = 1;
  using namespace remat::nn;
REMAT_EXAMPLE(include/remat/nn/training_state.h: if (rank == 0) begin_training_state(path))
  Training loaded;
  EXPECT_EQ(nn::load_training_state(path, *loaded.model, *loaded.optimizer, {}).step, 1);
  EXPECT_EQ(loaded.weights(), run.weights());
}
