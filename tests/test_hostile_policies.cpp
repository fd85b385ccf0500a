// Hostile input to loops, windows, einsum, policies and regions: each case is a remat::Error naming
// what was wrong, or a correct result; never a crash, a std:: exception, an internal error or
// silent growth. One test per class.
#include <gtest/gtest.h>

#include <chrono>
#include <climits>

#include "checkpoint_models.h"
#include "remat/nn.h"
#include "remat/scan.h"

using namespace remat;
using remat::testing::bitwise_equal;

namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(HostilePolicies, ScanWithIntMaxSnapshotsRunsAsStoreAll) {
  Tensor w = full({4}, 0.5, DType::f64).requires_grad_();
  auto run = [&](ScanOptions options) {
    w.zero_grad();
    Tensor u0 = ones({4}, DType::f64);
    Tensor u = scan([&](const Tensor& u, int64_t) { return tanh(mul(u, w)); }, u0, 3, options);
    sum(u).backward();
    return w.grad().clone();
  };
  const Tensor reference = run({ScanSchedule::store_all, 1});
  EXPECT_TRUE(bitwise_equal(run({ScanSchedule::revolve, INT_MAX}), reference));
  EXPECT_EQ(schedule::revolve_optimal_forward_steps(3, INT_MAX), schedule::revolve_optimal_forward_steps(3, 2));
  EXPECT_NE(error_of([&] {
              while_loop([](const Tensor&, int64_t t) { return t < 3; },
                         [&](const Tensor& u, int64_t) { return tanh(mul(u, w)); }, ones({4}, DType::f64),
                         {ScanSchedule::online, INT_MAX});
            }).find("snapshots"),
            std::string::npos);
}

TEST(HostilePolicies, Conv2dKernelExtentIsBounded) {
  Tensor x = zeros({1, 1, 4, 4});
  Tensor w = zeros({1, 1, 1, 1}).expand({1, 1, int64_t{1} << 40, 1});  // costs no memory
  const std::string error = error_of([&] { conv2d(x, w, Tensor(), {1, 1}, {0, 0}, {int64_t{1} << 30, 1}); });
  EXPECT_NE(error.find("kernel"), std::string::npos) << error;
  EXPECT_NE(error.find(std::to_string(int64_t{1} << 40)), std::string::npos) << error;
}

TEST(HostilePolicies, EinsumWithManyOperandsIsBoundedAndSaysHow) {
  std::vector<Shape> shapes;
  std::string spec;
  for (int k = 0; k < 1000; ++k) {
    spec += k ? ",ab" : "ab";
    shapes.push_back({2, 2});
  }
  // "ab,ab,...->ab": all operands share both indices
  const auto start = std::chrono::steady_clock::now();
  const nn::EinsumPath path = nn::einsum_path(spec + "->ab", shapes);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 2.0);
  EXPECT_EQ(path.steps.size(), 999u);
  EXPECT_EQ(path.method, "sequential");
  EXPECT_EQ(nn::einsum_path("ab,bc,cd->ad", {{2, 3}, {3, 4}, {4, 5}}).method, "optimal");
  // the sequential order computes the right thing
  TensorList operands;
  std::string small;
  for (int k = 0; k < nn::kEinsumGreedyLimit + 2; ++k) {
    small += k ? ",a" : "a";
    operands.push_back(full({3}, 1.0 + 0.01 * k, DType::f64));
  }
  const Tensor product = nn::einsum(small + "->a", operands);
  double expected = 1.0;
  for (int k = 0; k < nn::kEinsumGreedyLimit + 2; ++k) expected *= 1.0 + 0.01 * k;
  EXPECT_NEAR(product.to_vector()[0], expected, 1e-12 * expected);
  // negative sizes
  const std::string error = error_of([] { nn::einsum_path("ab,bc->ac", {{2, -3}, {-3, 4}}); });
  EXPECT_NE(error.find("negative"), std::string::npos) << error;
}

TEST(HostilePolicies, OffloadOptionsRepeatedOrWithANulByteAreErrors) {
  std::string error = error_of([] { Policy::parse("offload:/tmp,threshold=0,threshold=1GiB"); });
  EXPECT_NE(error.find("threshold is given twice"), std::string::npos) << error;
  error = error_of([] { Policy::parse("offload:/tmp,ram=1MiB,ram=2MiB"); });
  EXPECT_NE(error.find("ram is given twice"), std::string::npos) << error;
  error = error_of([] { Policy::parse(std::string("offload:/tmp\0x", 14)); });
  EXPECT_NE(error.find("NUL"), std::string::npos) << error;
  error = error_of([] { OffloadScope scope({std::string("/tmp\0x", 6)}); });
  EXPECT_NE(error.find("NUL"), std::string::npos) << error;
}

TEST(HostilePolicies, ANestedDynamicOrOffloadScopeIsAnErrorUnlessTheSame) {
  const std::string dir = ::testing::TempDir();
  {
    ScopedPolicy outer(Policy::dynamic(1 << 20));
    EXPECT_NO_THROW(ScopedPolicy same(Policy::dynamic(1 << 20)));
    std::string error = error_of([] { ScopedPolicy inner(Policy::dynamic(1 << 10)); });
    EXPECT_NE(error.find("cannot start inside policy dynamic:1048576"), std::string::npos) << error;
    error = error_of([&] { ScopedPolicy inner(Policy::offload(dir)); });
    EXPECT_NE(error.find("cannot start inside"), std::string::npos) << error;
    EXPECT_EQ(current_policy().to_string(), "dynamic:1048576");  // the failed scopes changed nothing
  }
  {
    ScopedPolicy outer(Policy::offload(dir));
    const std::string error = error_of([] { ScopedPolicy inner(Policy::dynamic(1 << 20)); });
    EXPECT_NE(error.find("cannot start inside policy offload:"), std::string::npos) << error;
  }
  // after both ended, a new one starts
  EXPECT_NO_THROW(ScopedPolicy again(Policy::dynamic(1 << 10)));
}

TEST(HostilePolicies, ARecomputationThatChangesADtypeIsAnErrorNamingTheRegion) {
  bool first = true;
  Tensor x = randn({2, 3}, DType::f64, RngState{1, 0}).requires_grad_();
  ScopedPolicy scoped(Policy::every_layer());
  // a recomputation runs the region's ops again, not its code: an op whose forward makes another
  // dtype the second time
  CustomOp shifty{"shifty_tanh",
                  [&first](const TensorList& in, SaveContext& ctx) {
                    Tensor out = first ? tanh(in[0]) : tanh(in[0].to(DType::f32));
                    first = false;
                    ctx.save(out);
                    return TensorList{out};
                  },
                  [](const TensorList& grads, const SavedValues& saved) {
                    return TensorList{mul(grads[0], add_scalar(neg(square(saved[0])), 1.0))};
                  }};
  // (its output is not the region's, so nothing keeps it: the backward makes it again)
  Tensor y = checkpoint([&shifty](const Tensor& h) { return mul_scalar(shifty({h})[0], 2.0); }, x, {.label = "shifty"});
  const std::string error = error_of([&] { sum(y).backward(); });
  EXPECT_NE(error.find("'shifty'"), std::string::npos) << error;
  EXPECT_NE(error.find("f32"), std::string::npos) << error;
  EXPECT_EQ(error.find("internal error"), std::string::npos) << error;
}

TEST(HostilePolicies, RegionRecordsStayBoundedOverManySteps) {
  manual_seed(1);
  // layers whose region has a value to make again (a Linear alone saves only its input and weight,
  // which its region keeps, and is never recomputed)
  struct TanhLinear : nn::Module {
    TanhLinear() { fc = register_module("fc", std::make_shared<nn::Linear>(2, 2)); }
    Tensor forward_impl(const Tensor& h) override { return tanh(fc->forward(h)); }
    std::shared_ptr<nn::Linear> fc;
  };
  auto model = std::make_shared<nn::Sequential>();
  for (int i = 0; i < 3; ++i) model->add(std::make_shared<TanhLinear>());
  ScopedPolicy scoped(Policy::every_layer());
  reset_counters();
  Tensor x = randn({1, 2}, DType::f32, RngState{1, 0});
  for (int step = 0; step < 5000; ++step) sum(model->forward(x)).backward();
  const Counters c = counters();
  EXPECT_EQ(c.regions_created, 15000u);
  EXPECT_LE(c.regions.size(), 4096u);
  // the rows of each layer add up every call and recomputation of it
  uint64_t calls = 0, recomputations = 0;
  for (const auto& r : c.regions) {
    calls += r.calls;
    recomputations += r.recomputations;
  }
  EXPECT_EQ(calls, 15000u);
  EXPECT_EQ(recomputations, 15000u);
  EXPECT_NE(memory_report().find("layer"), std::string::npos);
}
