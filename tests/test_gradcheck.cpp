// Safe custom kernels: Tensor::data<T>() checks the dtype (contiguous_data<T>() also the
// layout), a custom op's backward that returns a gradient of the wrong dtype or shape is a
// user-facing error naming the op and what was expected, REMAT_ASSERT's messages carry no build
// machine path, and remat::gradcheck finds right and wrong gradients and names the worst element.
#include <gtest/gtest.h>

#include <cmath>

#include "remat/autodiff.h"
#include "remat/gradcheck.h"
#include "remat/ops.h"
#include "remat/random.h"

using namespace remat;

namespace {

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no remat::Error)";
}

// y = x^3 with a backward that is right (3 x^2 g), scaled by `factor`, of dtype `grad_dtype`, or
// of shape `grad_shape` when that is given.
CustomOp cube_op(double factor = 1.0, DType grad_dtype = DType::f64, Shape grad_shape = {}) {
  return CustomOp{"cube",
                  [](const TensorList& in, SaveContext& ctx) {
                    Tensor x = in[0].contiguous();
                    Tensor y = Tensor::empty(x.shape(), DType::f64);
                    const double* xp = x.contiguous_data<double>();
                    double* yp = y.contiguous_data<double>();
                    for (int64_t i = 0; i < x.numel(); ++i) yp[i] = xp[i] * xp[i] * xp[i];
                    ctx.save(x);
                    return TensorList{y};
                  },
                  [=](const TensorList& grads, const SavedValues& saved) {
                    Tensor x = saved[0];
                    Tensor g = grads[0].contiguous();
                    Tensor gx = Tensor::empty(x.shape(), DType::f64);
                    const double* xp = x.contiguous_data<double>();
                    const double* gp = g.contiguous_data<double>();
                    double* out = gx.contiguous_data<double>();
                    for (int64_t i = 0; i < x.numel(); ++i) out[i] = factor * 3 * xp[i] * xp[i] * gp[i];
                    if (!grad_shape.empty()) return TensorList{zeros(grad_shape, DType::f64)};
                    if (grad_dtype != DType::f64) return TensorList{gx.to(grad_dtype)};
                    return TensorList{gx};
                  }};
}

TEST(DataAccess, DataChecksTheDtype) {
  Tensor x = zeros({2, 3}, DType::f64);
  EXPECT_NO_THROW(x.data<double>());
  EXPECT_NO_THROW(x.data<const double>());
  std::string m = message_of([&] { (void)x.data<float>(); });
  EXPECT_NE(m.find("data<float>"), std::string::npos) << m;
  EXPECT_NE(m.find("dtype f64"), std::string::npos) << m;
  EXPECT_NE(m.find("not f32"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
  Tensor ids = zeros({4}, DType::i64);
  m = message_of([&] { (void)ids.data<double>(); });
  EXPECT_NE(m.find("dtype i64, not f64"), std::string::npos) << m;
  EXPECT_NE(m.find("data<int64_t>"), std::string::npos) << m;
  x.set_name("weights");
  m = message_of([&] { (void)x.data<int64_t>(); });
  EXPECT_NE(m.find("tensor 'weights'"), std::string::npos) << m;
}

TEST(DataAccess, ContiguousDataChecksTheLayout) {
  Tensor x = zeros({2, 3}, DType::f32);
  Tensor t = x.transpose(0, 1);
  EXPECT_NO_THROW(t.data<float>());  // strided access through strides() stays possible
  std::string m = message_of([&] { (void)t.contiguous_data<float>(); });
  EXPECT_NE(m.find("not contiguous"), std::string::npos) << m;
  EXPECT_NE(m.find("[3, 2]"), std::string::npos) << m;
  EXPECT_NE(m.find("strides [1, 3]"), std::string::npos) << m;
  EXPECT_EQ(t.contiguous().contiguous_data<float>()[0], 0.0f);
  // the dtype is checked first
  m = message_of([&] { (void)t.contiguous_data<double>(); });
  EXPECT_NE(m.find("dtype f32, not f64"), std::string::npos) << m;
}

TEST(CustomOpErrors, WrongGradientDtypeNamesTheOpAndTheDtype) {
  Tensor x = randn({2, 3}, DType::f64, RngState{1, 0}).requires_grad_();
  CustomOp op = cube_op(1.0, DType::f32);
  Tensor y = op({x})[0];
  std::string m = message_of([&] { sum(y).backward(); });
  EXPECT_NE(m.find("custom op 'cube'"), std::string::npos) << m;
  EXPECT_NE(m.find("dtype f32 for input 0, expected dtype f64"), std::string::npos) << m;
  EXPECT_EQ(m.find("internal error"), std::string::npos) << m;
  EXPECT_FALSE(x.grad().defined());  // nothing accumulated
}

TEST(CustomOpErrors, WrongGradientShapeNamesTheOpAndTheShape) {
  Tensor x = randn({2, 3}, DType::f64, RngState{1, 0}).requires_grad_();
  CustomOp op = cube_op(1.0, DType::f64, {3, 2});
  Tensor y = op({x})[0];
  std::string m = message_of([&] { sum(y).backward(); });
  EXPECT_NE(m.find("custom op 'cube'"), std::string::npos) << m;
  EXPECT_NE(m.find("shape [3, 2] for input 0, expected shape [2, 3]"), std::string::npos) << m;
  EXPECT_FALSE(x.grad().defined());
}

TEST(ErrorMessages, AssertionsNameNoAbsolutePath) {
  // this file is compiled with the project's flags: __FILE__ is relative to the source root
  std::string m = message_of([] { REMAT_ASSERT(1 + 1 == 3, "arithmetic"); });
  EXPECT_NE(m.find("internal error at tests/test_gradcheck.cpp:"), std::string::npos) << m;
  EXPECT_EQ(m.find(REMAT_SOURCE_DIR), std::string::npos) << m;
  // code compiled elsewhere with an absolute __FILE__: only the file name is shown
  m = message_of([] { detail::assert_failed("x > 0", "/home/builder/project/src/kernel.cpp", 12, "x is -1"); });
  EXPECT_EQ(m, "internal error at kernel.cpp:12: x > 0 failed: x is -1");
}

TEST(Gradcheck, PassesOnARightCustomOp) {
  Tensor x = randn({3, 4}, DType::f64, RngState{2, 0});
  CustomOp op = cube_op();
  GradcheckResult r = gradcheck([&](const TensorList& in) { return op({in[0]})[0]; }, {x});
  EXPECT_TRUE(r.ok) << r.report;
  EXPECT_EQ(r.checked, 12);
  EXPECT_LT(r.abs_error, 1e-6);
  EXPECT_NE(r.report.find("gradcheck: ok, 12 elements"), std::string::npos) << r.report;
}

TEST(Gradcheck, FindsAWrongBackwardAndNamesTheWorstElement) {
  Tensor x = zeros({2, 3}, DType::f64);
  // x[1][2] has the largest magnitude: the wrong factor's error is largest there
  std::vector<double> v{0.1, -0.2, 0.3, 0.4, -0.5, 2.0};
  x = from_vector(v, {2, 3}, DType::f64);
  CustomOp op = cube_op(1.5);
  auto f = [&](const TensorList& in) { return op({in[0]})[0]; };
  GradcheckResult r = gradcheck(f, {x});
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.input, 0u);
  EXPECT_EQ(r.index, (std::vector<int64_t>{1, 2}));
  // the numeric gradient is 3 x^2 w, the analytic one 1.5 times that
  EXPECT_NEAR(r.analytic / r.numeric, 1.5, 1e-6);
  EXPECT_NE(r.report.find("worst input 0 [1, 2]"), std::string::npos) << r.report;
  EXPECT_NE(r.report.find("6 of 6 elements differ"), std::string::npos) << r.report;
  GradcheckOptions throwing;
  throwing.throw_on_failure = true;
  std::string m = message_of([&] { gradcheck(f, {x}, throwing); });
  EXPECT_EQ(m, r.report);
}

TEST(Gradcheck, SeveralInputsIndicesAndF32) {
  // cross entropy of a matmul: two float inputs (one f32) and an i64 target input
  Tensor a = randn({4, 3}, DType::f32, RngState{3, 0});
  Tensor b = randn({3, 5}, DType::f64, RngState{4, 0});
  Tensor targets = from_vector({0, 4, 2, 1}, {4}, DType::i64);
  std::vector<double> a_before = a.to_vector();
  auto f = [](const TensorList& in) { return cross_entropy(matmul(in[0], in[1]), in[2]); };
  GradcheckResult r = gradcheck(f, {a, b, targets});
  EXPECT_TRUE(r.ok) << r.report;
  EXPECT_EQ(r.checked, 12 + 15);
  EXPECT_NE(r.report.find("of 2 input(s)"), std::string::npos) << r.report;
  EXPECT_EQ(a.dtype(), DType::f32);  // the caller's tensors are untouched
  EXPECT_EQ(a.to_vector(), a_before);
  EXPECT_FALSE(a.requires_grad());
}

TEST(Gradcheck, AnInputTheOutputIgnoresHasZeroGradient) {
  Tensor a = randn({2}, DType::f64, RngState{5, 0});
  Tensor b = randn({2}, DType::f64, RngState{6, 0});
  GradcheckResult r = gradcheck([](const TensorList& in) { return tanh(in[0]); }, {a, b});
  EXPECT_TRUE(r.ok) << r.report;
  EXPECT_EQ(r.checked, 4);
}

TEST(Gradcheck, RejectsBadArguments) {
  Tensor x = randn({2}, DType::f64, RngState{1, 0});
  auto f = [](const TensorList& in) { return tanh(in[0]); };
  EXPECT_NE(message_of([&] { gradcheck(f, {Tensor()}); }).find("input 0 is undefined"), std::string::npos);
  EXPECT_NE(message_of([&] { gradcheck(f, {zeros({2}, DType::i64)}); }).find("no f32 or f64 input"),
            std::string::npos);
  GradcheckOptions bad;
  bad.eps = 0;
  EXPECT_NE(message_of([&] { gradcheck(f, {x}, bad); }).find("eps must be"), std::string::npos);
  bad = {};
  bad.rtol = NAN;
  EXPECT_NE(message_of([&] { gradcheck(f, {x}, bad); }).find("rtol must be"), std::string::npos);
  std::string m = message_of([&] {
    gradcheck([](const TensorList& in) { return matmul(in[0], in[0]); }, {x});
  });
  EXPECT_NE(m.find("gradcheck: f threw during the analytic pass: matmul"), std::string::npos) << m;
  m = message_of([&] { gradcheck([](const TensorList& in) { return argmax(in[0], 0); }, {x}); });
  EXPECT_NE(m.find("returned a tensor of dtype i64"), std::string::npos) << m;
}

}  // namespace
