// Depth without a crash: modules nested up to 100,000 deep either run or end in a remat::Error
// naming the limit (kMaxModuleNesting), whether the nesting is built bottom-up (caught when the
// module is registered) or top-down (caught when it is called or walked); destroying any such
// model never overflows the stack. Runs on a thread of the default stack size.
#include <gtest/gtest.h>

#include <thread>

#include "remat/nn.h"
#include "remat/remat.h"

using namespace remat;

namespace {

void on_thread(const std::function<void()>& fn) { std::thread(fn).join(); }

bool names_limit(const Error& e) {
  const std::string what = e.what();
  return what.find(std::to_string(nn::kMaxModuleNesting)) != std::string::npos &&
         what.find("nested") != std::string::npos;
}

// Sequential(Sequential(...(Linear)...)), `depth` modules deep counting the Linear, built from the
// inside out. Returns the outermost one reached before an error (and whether there was one).
std::shared_ptr<nn::Module> bottom_up(int depth, bool& refused) {
  std::shared_ptr<nn::Module> m = std::make_shared<nn::Linear>(2, 2);
  refused = false;
  for (int d = 1; d < depth; ++d) {
    auto outer = std::make_shared<nn::Sequential>();
    try {
      outer->add(m);
    } catch (const Error& e) {
      EXPECT_TRUE(names_limit(e)) << e.what();
      refused = true;
      return m;
    }
    m = outer;
  }
  return m;
}

}  // namespace

TEST(ModuleDepth, BottomUpNestingRunsUpToTheLimitAndIsRefusedBeyond) {
  on_thread([] {
    bool refused = false;
    auto at_limit = bottom_up(nn::kMaxModuleNesting, refused);
    EXPECT_FALSE(refused);
    Tensor x = randn({3, 2}, DType::f32, RngState{1, 0});
    for (const Policy& policy : {Policy::save_all(), Policy::every_layer()}) {
      ScopedPolicy scoped(policy);
      at_limit->zero_grad();
      try {
        sum(at_limit->forward(x)).backward();
        EXPECT_TRUE(at_limit->parameters()[0].grad().defined());
      } catch (const Error& e) {  // another stated limit (region nesting) is also an answer
        EXPECT_NE(std::string(e.what()).find("at most"), std::string::npos) << e.what();
      }
    }
    EXPECT_EQ(at_limit->named_parameters().size(), 2u);
    for (int depth : {nn::kMaxModuleNesting + 1, 100000}) {
      bottom_up(depth, refused);
      EXPECT_TRUE(refused) << depth;
    }
  });
}

TEST(ModuleDepth, TopDownNestingIsAnErrorWhenCalledOrWalkedAndDestroysSafely) {
  on_thread([] {
    // each module is registered while still empty; its child gets a child afterwards
    auto root = std::make_shared<nn::Sequential>();
    nn::Sequential* tip = root.get();
    for (int d = 1; d < 100000; ++d) {
      auto next = std::make_shared<nn::Sequential>();
      tip->add(next);
      tip = next.get();
    }
    tip->add(std::make_shared<nn::Linear>(2, 2));
    Tensor x = randn({3, 2}, DType::f32, RngState{1, 0});
    for (const Policy& policy : {Policy::save_all(), Policy::every_layer()}) {
      ScopedPolicy scoped(policy);
      try {
        root->forward(x);
        ADD_FAILURE() << "no error";
      } catch (const Error& e) {
        EXPECT_TRUE(names_limit(e)) << e.what();
      }
    }
    for (int walk = 0; walk < 3; ++walk) {
      try {
        if (walk == 0) root->named_parameters();
        if (walk == 1) root->named_modules();
        if (walk == 2) root->train(false);
        ADD_FAILURE() << "no error, walk " << walk;
      } catch (const Error& e) {
        EXPECT_TRUE(names_limit(e)) << e.what();
      }
    }
    root.reset();  // 100,000 nested modules destroyed without recursion
  });
}
