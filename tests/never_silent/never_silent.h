// Helpers of the never-silent tests (issue 54): each test is a program of a few lines, as the
// issue describes it, run under save-all and under every policy of the acceptance list (the
// policy matrix of tests/program_fuzz/matrix.h); every pair must give save-all's bits (or raise
// save-all's error), or be refused naming a rule the program breaks.
//
//   TEST(NeverSilent, Something) {
//     expect_matches_save_all([](Recorder& rec) {
//       auto model = std::make_shared<MyModel>();
//       train(rec, model, {}, [&](Recorder& r, const Tensor& x, int step) { return mean(model->forward(x)); });
//     });
//   }
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "matrix.h"
#include "remat/nn.h"
#include "remat/remat.h"

namespace remat::never_silent {

using program_fuzz::Body;
using program_fuzz::Recorder;
using program_fuzz::Rule;

inline constexpr int64_t kWidth = 4;

// A layer: tanh(Linear(x)).
class Block : public nn::Module {
 public:
  explicit Block(int64_t width = kWidth) { fc = register_module("fc", std::make_shared<nn::Linear>(width, width)); }
  Tensor forward_impl(const Tensor& x) override { return tanh(fc->forward(x)); }
  std::shared_ptr<nn::Linear> fc;
};

// A wider layer: Linear(w, 8w), tanh, Linear(8w, w): it saves far more than its boundary.
class Wide : public nn::Module {
 public:
  explicit Wide(int64_t width = kWidth) {
    up = register_module("up", std::make_shared<nn::Linear>(width, 8 * width));
    down = register_module("down", std::make_shared<nn::Linear>(8 * width, width));
  }
  Tensor forward_impl(const Tensor& x) override { return down->forward(tanh(up->forward(x))); }
  std::shared_ptr<nn::Linear> up, down;
};

struct Steps {
  int steps = 4;                   // budgets profile two steps, then plan
  std::vector<int64_t> batch = {3};  // step s uses batch[s % size]
  int optimizer = 1;               // 0 none, 1 SGD (lr 0.1), 2 AdamW (lr 0.01)
  uint64_t seed = 1;
  bool input_requires_grad = false;
};

using ForwardLoss = std::function<Tensor(Recorder&, const Tensor& x, int step)>;
using Backward = std::function<void(Recorder&, const Tensor& loss, int step)>;

// The training loop a user writes: per step an input, the loss, its backward (loss.backward()
// unless `backward` is given), every parameter's gradient recorded, an optimizer step and
// zero_grad; the parameters are recorded at the end. `forward_loss` records what it reaches.
void train(Recorder& rec, const std::shared_ptr<nn::Module>& model, const Steps& steps, const ForwardLoss& forward_loss,
           const Backward& backward = {});

// Runs `body` under save-all and every policy; every pair must be ok, or refused naming one of
// the rules in `breaks`. Returns the matrix for further checks.
program_fuzz::MatrixResult expect_matches_save_all(const Body& body, std::vector<Rule> breaks = {},
                                                   std::vector<std::string> policies = {});

// The same where save-all raises: its error must contain `save_all_says`, and every policy must
// raise an error of the same kind at the same point.
program_fuzz::MatrixResult expect_raises_like_save_all(const Body& body, const std::string& save_all_says,
                                                       std::vector<Rule> breaks = {});

}  // namespace remat::never_silent
