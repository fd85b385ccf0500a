// Table-driven tests of every op in remat/ops.h (see op_harness.h): for every row and for f32, f64
// and bf16 (f16 in one test of every row on the CPU), (a) the forward value against a float64 plain-loop reference and (b) the gradient from
// remat's backward against central finite differences of that reference. The rows live one file
// per op family, tests/op_rows/<family>.cpp, and the table gathers the families of the op list
// (REMAT_OP_KINDS in remat/ops.h).
//
// Test names read "Ops/OpTest.ForwardAndGradient/<row>_<dtype>", e.g. .../matmul_tn_4x3T_by_4x5_f32.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "emulated_backend.h"
#include "op_harness.h"
#include "op_rows/builders.h"
#include "op_rows/conv.h"
#include "remat/devices.h"

using namespace remat;
using namespace remat::test;
using remat::testing::emulated_device;

namespace {

// The rows of every family of the op list, each family once, and those of nn::einsum.
std::vector<OpCase> build_table() {
  std::vector<OpCase> t;
  std::set<std::string> families;
#define REMAT_ADD_ROWS(kind, family, ...) \
  if (families.insert(#family).second) add_##family##_rows(t);
  REMAT_OP_KINDS(REMAT_ADD_ROWS)
#undef REMAT_ADD_ROWS
  add_einsum_rows(t);
  return t;
}

const std::vector<OpCase>& op_table() {
  static const std::vector<OpCase> table = build_table();
  return table;
}

// The device axis: 0 the CPU, 1 the test-only emulated device (emulated_backend.h), 2 cuda:0 in a
// build with the CUDA backend (each row skipped, with the reason, where no GPU is usable). A new
// backend adds its device here and runs every row. On cuda:0 a row is checked against the float64
// reference and finite differences with the CPU's tolerances (forward_tolerance: f32 2e-5 + 1e-4
// relative, f64 1e-10 + 1e-9 relative, bf16 1.6e-2 + 1.6e-2 relative; the row's grad_tol_f32 /
// grad_tol_f64 / grad_tol_16bit), not bit for bit against the CPU: the GPU sums in other orders.
// bf16 rows on cuda:0 are skipped while the CUDA backend holds no bf16 tensors (Backend::holds:
// only with the backend option sixteen_bit, REMAT_BACKEND_OPTIONS=sixteen_bit).
Device device_of_axis(int axis) {
  return axis == 0 ? kCpu : axis == 1 ? emulated_device() : Device{DeviceType::cuda, 0};
}
std::vector<int> device_axes() {
  return compiled_backends().size() > 1 ? std::vector<int>{0, 1, 2} : std::vector<int>{0, 1};
}

class OpTest : public ::testing::TestWithParam<std::tuple<size_t, DType, int>> {
 protected:
  const OpCase& op() const { return op_table()[std::get<0>(GetParam())]; }
  DType dtype() const { return std::get<1>(GetParam()); }
  Device device() const { return device_of_axis(std::get<2>(GetParam())); }
};

// One test per (row, dtype, device) runs the checks (one process per test under ctest: fewer,
// larger tests keep the suite fast, also under sanitizers); each check reports on its own.
TEST_P(OpTest, ForwardAndGradient) {
  if (device().type == DeviceType::cuda) {
    if (device_count(DeviceType::cuda) == 0) GTEST_SKIP() << "no CUDA device: " << unavailable_reason(DeviceType::cuda);
    use_device(device());
    if (!backend(device()).holds(dtype()))
      GTEST_SKIP() << device_name(device()) << " holds no " << dtype_name(dtype())
                   << " tensors (Backend::holds; the backend option sixteen_bit turns them on)";
  }
  const std::string where = " [" + std::string(dtype_name(dtype())) + ", " + device_name(device()) + "] ";
  CheckResult f = check_forward(op(), dtype(), device());
  EXPECT_TRUE(f.ok) << op().name << where << "forward differs from the reference:\n" << f.message;
  if (device().type == DeviceType::emulated) {
    CheckResult same = check_matches_cpu(op(), dtype(), device());
    EXPECT_TRUE(same.ok) << same.message;
  }
  if (!op().differentiable) {
    Inputs inputs = inputs_of(op(), dtype());
    TensorList outs = op().apply(tensors_of(inputs, dtype(), /*with_grad=*/true, device()));
    for (const auto& out : outs) EXPECT_FALSE(out.requires_grad()) << op().name << " output should carry no gradient";
    return;
  }
  CheckResult g = check_case_gradient(op(), dtype(), gradient_on(device()));
  EXPECT_TRUE(g.ok) << op().name << where << "gradient differs from finite differences:\n" << g.message;
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTest,
                         ::testing::Combine(::testing::Range<size_t>(0, op_table().size()),
                                            ::testing::Values(DType::f32, DType::f64, DType::bf16),
                                            ::testing::ValuesIn(device_axes())),
                         [](const ::testing::TestParamInfo<OpTest::ParamType>& info) {
                           std::string name = op_table()[std::get<0>(info.param)].name + "_" +
                                              dtype_name(std::get<1>(info.param));
                           if (std::get<2>(info.param) != 0) name += "_" + device_name(device_of_axis(std::get<2>(info.param)));
                           for (auto& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

// Every row in f16 on the CPU, in one test: f16 takes the path bf16 takes (each kernel in float32,
// its results rounded once), so one pass over the table checks its rounding at f16's tolerances.
TEST(OpTable, EveryRowInF16OnTheCpu) {
  for (const auto& c : op_table()) {
    CheckResult f = check_forward(c, DType::f16);
    EXPECT_TRUE(f.ok) << c.name << " [f16] forward differs from the reference:\n" << f.message;
    if (!c.differentiable) continue;
    CheckResult g = check_case_gradient(c, DType::f16);
    EXPECT_TRUE(g.ok) << c.name << " [f16] gradient differs from finite differences:\n" << g.message;
  }
}

// ---- the table covers every op of the op list

// The entry points of the op list (REMAT_OP_KINDS, REMAT_UNRECORDED_OPS), by name.
std::set<std::string> entry_points() {
  std::set<std::string> names;
  auto add = [&](const char* list) {
    std::stringstream in(list);
    for (std::string name; std::getline(in, name, ',');) names.insert(name.substr(name.find_first_not_of(' ')));
  };
#define REMAT_ENTRY_POINTS(kind, family, ...) add(#__VA_ARGS__);
  REMAT_OP_KINDS(REMAT_ENTRY_POINTS)
#undef REMAT_ENTRY_POINTS
#define REMAT_UNRECORDED(name, family) add(#name);
  REMAT_UNRECORDED_OPS(REMAT_UNRECORDED)
#undef REMAT_UNRECORDED
  return names;
}

TEST(OpTable, CoversEveryOp) {
  std::set<std::string> names;
  for (const auto& c : op_table()) {
    EXPECT_TRUE(names.insert(c.name).second) << "duplicate row " << c.name;
  }
  std::set<std::string> required = entry_points();
  // beyond the op list: both modes of batch_norm, and nn::einsum (built of the ops)
  for (const char* more : {"batch_norm_train", "batch_norm_eval", "einsum"}) required.insert(more);
  for (const auto& op : required) {
    bool found = std::any_of(op_table().begin(), op_table().end(),
                             [&](const OpCase& c) { return c.name.rfind(op + "_", 0) == 0 || c.name == op; });
    EXPECT_TRUE(found) << "no row tests " << op;
  }
  // broadcasting pairs required for every binary op
  for (std::string op : {"add", "sub", "mul", "div", "maximum", "minimum"})
    for (std::string pair : {"_2x3_by_3", "_4x1x3_by_2x1", "_s_by_2x3"})
      EXPECT_TRUE(names.count(op + pair)) << "missing " << op + pair;
}

// Every op kind of the list is recorded by some row's forward (watched by an OpListener).
TEST(OpTable, EveryOpKindRunsInSomeRow) {
  struct Kinds : autodiff::OpListener {
    std::set<std::string> seen;
    void on_op(autodiff::OpEvent& event) override { seen.insert(event.op); }
  } kinds;
  autodiff::OpListener* previous = autodiff::set_op_listener(&kinds);
  for (const auto& c : op_table()) c.apply(tensors_of(inputs_of(c), DType::f64, /*with_grad=*/true));
  autodiff::set_op_listener(previous);
  for (const auto& kind : autodiff::op_kinds()) EXPECT_TRUE(kinds.seen.count(kind)) << "no row runs op kind " << kind;
}

// Every function remat/ops.h declares is an entry point of its op list.
TEST(OpTable, EveryFunctionOfOpsHeaderIsInTheOpList) {
  std::ifstream header(std::string(REMAT_SOURCE_DIR) + "/include/remat/ops.h");
  ASSERT_TRUE(header.good()) << "cannot read include/remat/ops.h";
  const std::set<std::string> listed = entry_points();
  const std::regex declaration(R"(^(?:Tensor|TensorList) (\w+)\()");
  int declarations = 0;
  for (std::string line; std::getline(header, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, declaration) || m[1].str().starts_with("operator")) continue;
    ++declarations;
    EXPECT_TRUE(listed.count(m[1].str())) << "ops.h declares " << m[1].str() << ", which REMAT_OP_KINDS does not list";
  }
  EXPECT_GT(declarations, 40);
}

// ---- issue 17: every float32 convolution algorithm passes the conv2d rows (the table itself
// runs the automatic choice; float64 always runs im2col)

TEST(ConvAlgorithms, EveryFloat32AlgorithmPassesTheConvRows) {
  const ConvAlgorithm before = conv_algorithm();
  for (ConvAlgorithm a : {ConvAlgorithm::im2col_gemm, ConvAlgorithm::onednn_plain, ConvAlgorithm::onednn_blocked}) {
    set_conv_algorithm(a);
    for (const auto& row : conv2d_rows()) {
      OpCase c = conv2d_case(row);
      CheckResult f = check_forward(c, DType::f32);
      EXPECT_TRUE(f.ok) << c.name << " under " << conv_algorithm_name(a) << ":\n" << f.message;
      CheckResult g = check_case_gradient(c, DType::f32);
      EXPECT_TRUE(g.ok) << c.name << " under " << conv_algorithm_name(a) << ":\n" << g.message;
    }
  }
  set_conv_algorithm(before);
}

// ---- self-tests of the harness: a broken backward must make a test fail

// tanh whose backward forgets the square: g * (1 - y) instead of g * (1 - y^2).
TensorList wrong_tanh(const TensorList& in) {
  static const CustomOp op{"wrong_tanh",
                           [](const TensorList& x, SaveContext& ctx) {
                             Tensor y = tanh(x[0]);
                             ctx.save(y);
                             return TensorList{y};
                           },
                           [](const TensorList& g, const SavedValues& saved) {
                             return TensorList{mul(g[0], add_scalar(neg(saved[0]), 1.0))};
                           }};
  return op(in);
}

TEST(HarnessSelfTest, CorrectGradientPasses) {
  OpCase c = unary_case("tanh_selftest", [](const Tensor& x) { return tanh(x); }, [](double x) { return std::tanh(x); });
  for (DType d : {DType::f32, DType::f64}) EXPECT_TRUE(check_case_gradient(c, d).ok);
}

TEST(HarnessSelfTest, WrongBackwardIsReported) {
  OpCase c = unary_case("tanh_selftest", [](const Tensor& x) { return wrong_tanh({x})[0]; },
                        [](double x) { return std::tanh(x); });
  for (DType d : {DType::f32, DType::f64}) {
    EXPECT_TRUE(check_forward(c, d).ok);  // the forward is right...
    CheckResult r = check_case_gradient(c, d);
    EXPECT_FALSE(r.ok) << "a wrong backward passed the gradient check";  // ...the backward is not
    EXPECT_GT(r.mismatches, 0);
    EXPECT_NE(r.message.find("analytic"), std::string::npos) << r.message;
  }
}

TEST(HarnessSelfTest, WrongGradientFunctionIsReported) {
  // The checker is fed a gradient function that perturbs remat's (correct) gradient slightly.
  OpCase c = binary_case(Bin::mul, {2, 3}, {3});
  for (DType d : {DType::f32, DType::f64}) {
    ASSERT_TRUE(check_case_gradient(c, d).ok);
    double delta = d == DType::f64 ? 1e-3 : 2e-2;
    GradFn perturbed = [delta](const OpCase& oc, DType dt, const Inputs& in, const std::vector<Array>& w) {
      auto g = remat_gradient(oc, dt, in, w);
      g[1][2] += delta;
      return g;
    };
    CheckResult r = check_case_gradient(c, d, perturbed);
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.mismatches, 1) << r.message;
  }
}

TEST(HarnessSelfTest, MissingBroadcastReductionIsReported) {
  // A backward that forgets to sum the gradient over the broadcast axis (takes row 0 only).
  OpCase c = binary_case(Bin::add, {2, 3}, {3});
  GradFn forgetful = [](const OpCase& oc, DType dt, const Inputs& in, const std::vector<Array>& w) {
    auto g = remat_gradient(oc, dt, in, w);
    g[1] = std::vector<double>(w[0].v.begin(), w[0].v.begin() + 3);
    return g;
  };
  EXPECT_FALSE(check_case_gradient(c, DType::f64, forgetful).ok);
}

TEST(HarnessSelfTest, MissingGradientIsReported) {
  OpCase c = binary_case(Bin::sub, {2, 3}, {2, 3});
  GradFn none_for_b = [](const OpCase& oc, DType dt, const Inputs& in, const std::vector<Array>& w) {
    auto g = remat_gradient(oc, dt, in, w);
    g[1].clear();
    return g;
  };
  CheckResult r = check_case_gradient(c, DType::f64, none_for_b);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("no gradient"), std::string::npos) << r.message;
}

TEST(HarnessSelfTest, CheckerAloneDetectsWrongDerivative) {
  // f(x) = sum x_i^3; the "analytic" gradient 3x instead of 3x^2 must be reported.
  std::vector<std::vector<double>> x = {{0.5, -1.25, 2.0}};
  auto f = [](const std::vector<std::vector<double>>& v) {
    double s = 0;
    for (double e : v[0]) s += e * e * e;
    return s;
  };
  std::vector<std::vector<double>> right = {{0.75, 4.6875, 12.0}}, wrong = {{1.5, -3.75, 6.0}};
  EXPECT_TRUE(check_gradient(f, x, {true}, right, 1e-5).ok);
  CheckResult r = check_gradient(f, x, {true}, wrong, 1e-5);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.mismatches, 3);
}

TEST(HarnessSelfTest, WrongForwardIsReported) {
  OpCase c = unary_case("sigmoid_vs_tanh", [](const Tensor& x) { return sigmoid(x); },
                        [](double x) { return std::tanh(x); });
  EXPECT_FALSE(check_forward(c, DType::f32).ok);
  EXPECT_FALSE(check_forward(c, DType::f64).ok);
}

// ---- op behaviour beyond the table

TEST(Dropout, DefaultGeneratorDrawsFromItsCounter) {
  Tensor x = ones({4, 8}, DType::f64);
  RngState saved = rng_state();
  RngState start{2024, 16};
  set_rng_state(start);
  Tensor y = dropout(x, 0.25);
  RngState after = rng_state();
  set_rng_state(saved);
  EXPECT_EQ(after.seed, start.seed);
  EXPECT_GE(after.offset, start.offset + 32) << "dropout must claim one word per element";
  // the same mask as the explicit-state form
  Tensor z = dropout(x, 0.25, start);
  EXPECT_EQ(y.to_vector(), z.to_vector());
  auto keep = ref::dropout_mask(32, 0.25, start);
  auto yv = y.to_vector();
  for (size_t i = 0; i < yv.size(); ++i) EXPECT_DOUBLE_EQ(yv[i], keep[i] ? 1.0 / 0.75 : 0.0) << i;
}

TEST(Dropout, NotTrainingOrZeroProbabilityIsIdentity) {
  Tensor x = randn({3, 5}, DType::f32, RngState{5, 0});
  EXPECT_EQ(dropout(x, 0.5, /*training=*/false).to_vector(), x.to_vector());
  EXPECT_EQ(dropout(x, 0.0, RngState{9, 0}).to_vector(), x.to_vector());
}

TEST(Dropout, SameStateSameMaskDifferentStateDifferentMask) {
  Tensor x = ones({64}, DType::f32);
  auto a = dropout(x, 0.5, RngState{1, 0}).to_vector();
  auto b = dropout(x, 0.5, RngState{1, 0}).to_vector();
  auto c = dropout(x, 0.5, RngState{1, 64}).to_vector();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Argmax, KeepdimShapeAndDtype) {
  Tensor x = from_vector(std::vector<double>{1, 5, 3, 9, 2, 4}, {2, 3}, DType::f32);
  Tensor a = argmax(x, 1, true);
  EXPECT_EQ(a.dtype(), DType::i64);
  EXPECT_EQ(a.shape(), (Shape{2, 1}));
  EXPECT_EQ(a.to_vector(), (std::vector<double>{1, 0}));
  EXPECT_EQ(argmax(x, 0).to_vector(), (std::vector<double>{1, 0, 1}));
}

TEST(Split, OutputsAreViewsOfTheInputValues) {
  Tensor x = arange(10, DType::f64).reshape({2, 5});
  TensorList parts = split(x, {2, 3}, 1);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].shape(), (Shape{2, 2}));
  EXPECT_EQ(parts[1].shape(), (Shape{2, 3}));
  EXPECT_EQ(parts[1].to_vector(), (std::vector<double>{2, 3, 4, 7, 8, 9}));
  // concat undoes split
  EXPECT_EQ(concat(parts, 1).to_vector(), x.to_vector());
}

TEST(Split, GradientOfUnusedPartIsZero) {
  Tensor x = arange(6, DType::f64).reshape({6}).detach().requires_grad_();
  TensorList parts = split(x, {2, 4}, 0);
  sum(parts[1]).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0, 0, 1, 1, 1, 1}));
}

}  // namespace
