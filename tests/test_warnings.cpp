// Warnings that are true: no "met no checkpoint region" warning where nothing asked for
// recomputation (gradcheck, a grad() inside a custom backward of a save-all model), and a module
// that is called but never registered is reported once and named so in the memory report.
#include <gtest/gtest.h>

#include <thread>

#include "remat/gradcheck.h"
#include "remat/nn.h"
#include "remat/remat.h"

using namespace remat;

namespace {

// Runs fn on a fresh thread (the region warning is once per thread); returns the warnings.
std::vector<std::string> warnings_of(const std::function<void()>& fn) {
  std::vector<std::string> warnings;
  set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
  std::thread(fn).join();
  set_warning_handler(nullptr);
  return warnings;
}

}  // namespace

TEST(Warnings, GradcheckWarnsNothing) {
  const auto warnings = warnings_of([] {
    Tensor x = randn({3, 4}, DType::f64, RngState{1, 0});
    EXPECT_TRUE(gradcheck([](const TensorList& in) { return tanh(in[0]); }, {x}).ok);
    // a real case afterwards is still reported (the false one did not use up the thread's warning)
    Tensor w = randn({4, 4}, DType::f64, RngState{2, 0}).requires_grad_();
    backward([&] { return sum(tanh(matmul(x, w))); }, GradOptions{Policy::every_k(2)});
  });
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("met no checkpoint region"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("every-k:2"), std::string::npos) << "the warning is gradcheck's: " << warnings[0];
}

TEST(Warnings, AGradInsideACustomBackwardOfASaveAllModelWarnsNothing) {
  const auto warnings = warnings_of([] {
    // a custom op whose backward differentiates its own formula with grad()
    CustomOp softplus{"softplus",
                      [](const TensorList& in, SaveContext& ctx) {
                        ctx.save(in[0]);
                        return TensorList{log(add_scalar(exp(in[0]), 1.0))};
                      },
                      [](const TensorList& grads, const SavedValues& saved) {
                        EnableGradGuard on;
                        Tensor x = saved[0].detach().requires_grad_();
                        Tensor y = log(add_scalar(exp(x), 1.0));
                        return grad({y}, {x}, {grads[0]});
                      }};
    manual_seed(1);
    auto model = std::make_shared<nn::Sequential>();
    model->add(std::make_shared<nn::Linear>(4, 4));
    model->add(std::make_shared<nn::Lambda>([softplus](const Tensor& h) { return softplus({h})[0]; }));
    model->add(std::make_shared<nn::Linear>(4, 1));
    model->set_policy(Policy::save_all());
    sum(model->forward(randn({2, 4}, DType::f32, RngState{3, 0}))).backward();
    EXPECT_TRUE(model->parameters()[0].grad().defined());
  });
  EXPECT_TRUE(warnings.empty()) << warnings[0];
}

namespace {
// Calls `hidden` without registering it. Transparent: its calls are layer calls (regions).
class Forgetful : public nn::Module {
 public:
  Forgetful() : hidden(std::make_shared<nn::Linear>(4, 4)) {
    fc = register_module("fc", std::make_shared<nn::Linear>(4, 4));
    set_transparent();
  }
  std::string type_name() const override { return "Forgetful"; }
  std::shared_ptr<nn::Linear> hidden, fc;

 protected:
  Tensor forward_impl(const Tensor& x) override { return fc->forward(tanh(hidden->forward(x))); }
};
}  // namespace

TEST(Warnings, ACalledUnregisteredModuleIsReportedOnceAndInTheMemoryReport) {
  std::string report;
  const auto warnings = warnings_of([&report] {
    manual_seed(2);
    auto model = std::make_shared<nn::Sequential>();
    model->add(std::make_shared<Forgetful>(), "block");
    model->add(std::make_shared<nn::Linear>(4, 1), "head");
    ScopedPolicy scoped(Policy::every_layer());
    reset_counters();
    for (int step = 0; step < 2; ++step)
      sum(model->forward(randn({2, 4}, DType::f32, RngState{3, 0}))).backward();
    report = memory_report();
  });
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("never registered"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("'block'"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("parameters()"), std::string::npos) << warnings[0];
  EXPECT_NE(report.find("unregistered"), std::string::npos) << report;
}
