// View semantics (shared storage, strides, when copies happen), broadcasting shape rules and
// errors, gradient accumulation for values used several times, and the reduction of gradients
// over broadcast axes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "remat/memory.h"
#include "remat/ops.h"

using namespace remat;

namespace {

using Values = std::vector<double>;

Tensor iota(const Shape& shape, DType dtype = DType::f64) {
  return arange(static_cast<int64_t>(shape_numel(shape)), dtype).reshape(shape).detach();
}

Tensor vec(const Values& v, const Shape& shape, DType dtype = DType::f64) { return from_vector(v, shape, dtype); }

uint64_t allocations() { return memory::stats().allocations_total; }

// ============================================================================================
// Views share storage
// ============================================================================================

TEST(Views, CopyIntoStridedSliceIsVisibleInBase) {
  Tensor base = zeros({4, 5}, DType::f64);
  Tensor s = base.slice(1, 1, 5, 2);  // columns 1 and 3
  EXPECT_EQ(s.shape(), (Shape{4, 2}));
  EXPECT_EQ(s.strides(), (Strides{5, 2}));
  EXPECT_EQ(s.offset(), 1);
  EXPECT_EQ(s.storage(), base.storage());
  EXPECT_FALSE(s.is_contiguous());
  s.copy_(vec({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2}));
  EXPECT_EQ(base.to_vector(), (Values{0, 1, 0, 2, 0,  //
                                      0, 3, 0, 4, 0,  //
                                      0, 5, 0, 6, 0,  //
                                      0, 7, 0, 8, 0}));
}

TEST(Views, BroadcastingCopyAndFillThroughViews) {
  Tensor base = zeros({3, 4}, DType::f32);
  base.slice(0, 1, 3).copy_(vec({1, 2, 3, 4}, {4}, DType::f32));  // rows 1..2, broadcast over rows
  base.transpose(0, 1).slice(0, 0, 1).fill_(-1);                  // column 0
  EXPECT_EQ(base.to_vector(), (Values{-1, 0, 0, 0, -1, 2, 3, 4, -1, 2, 3, 4}));
}

TEST(Views, WritesToBaseAreVisibleThroughViews) {
  Tensor base = zeros({2, 3}, DType::f64);
  Tensor t = base.transpose(0, 1);
  Tensor r = base.reshape({6});
  Tensor u = base.unsqueeze(0);
  base.copy_(iota({2, 3}));
  EXPECT_EQ(t.to_vector(), (Values{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(r.to_vector(), (Values{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(u.at({0, 1, 2}), 5);
  for (const Tensor& v : {t, r, u}) EXPECT_EQ(v.storage(), base.storage());
}

TEST(Views, InPlaceWriteThroughAViewBumpsTheSharedVersion) {
  Tensor base = zeros({4}, DType::f64);
  Tensor v = base.slice(0, 1, 3);
  uint64_t before = base.storage()->version();
  v.fill_(2);
  EXPECT_GT(base.storage()->version(), before);
}

TEST(Views, PermuteAndTransposeStrides) {
  Tensor x = iota({2, 3, 4});
  EXPECT_EQ(x.strides(), (Strides{12, 4, 1}));
  EXPECT_TRUE(x.is_contiguous());

  Tensor p = x.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Strides{1, 12, 4}));
  EXPECT_EQ(p.storage(), x.storage());
  EXPECT_FALSE(p.is_contiguous());
  EXPECT_EQ(p.at({3, 1, 2}), x.at({1, 2, 3}));

  Tensor t = x.transpose(0, 2);
  EXPECT_EQ(t.shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(t.strides(), (Strides{1, 4, 12}));
  EXPECT_EQ(t.at({3, 2, 1}), x.at({1, 2, 3}));

  Tensor back = t.transpose(0, 2);
  EXPECT_EQ(back.strides(), x.strides());
  EXPECT_TRUE(back.is_contiguous());
  EXPECT_EQ(back.to_vector(), x.to_vector());

  Tensor neg = x.transpose(-1, -2);
  EXPECT_EQ(neg.shape(), (Shape{2, 4, 3}));
  EXPECT_EQ(neg.strides(), (Strides{12, 1, 4}));
}

TEST(Views, ExpandUsesStrideZero) {
  Tensor x = vec({1, 2, 3}, {3, 1});
  Tensor e = x.expand({2, 3, 4});
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.strides(), (Strides{0, 1, 0}));
  EXPECT_EQ(e.storage(), x.storage());
  EXPECT_EQ(e.numel(), 24);
  EXPECT_EQ(e.at({1, 2, 3}), 3);
  EXPECT_EQ(e.at({0, 1, 0}), 2);
  // expanding to the same shape is the tensor itself; -1 keeps a size
  EXPECT_TRUE(x.expand({3, 1}).same(x));
  EXPECT_EQ(vec({1, 2}, {1, 2}).expand({5, -1}).shape(), (Shape{5, 2}));
  // values are shared: a write to the source shows in every expanded position
  x.fill_(9);
  for (double v : e.to_vector()) EXPECT_EQ(v, 9);
}

TEST(Views, ViewOfExpandedScalarAndSqueezeUnsqueeze) {
  Tensor s = scalar_tensor(2.5, DType::f64);
  Tensor e = s.expand({2, 2});
  EXPECT_EQ(e.strides(), (Strides{0, 0}));
  EXPECT_EQ(e.to_vector(), (Values{2.5, 2.5, 2.5, 2.5}));

  Tensor x = iota({2, 3});
  Tensor u = x.unsqueeze(1);
  EXPECT_EQ(u.shape(), (Shape{2, 1, 3}));
  EXPECT_EQ(u.storage(), x.storage());
  Tensor q = u.squeeze(1);
  EXPECT_EQ(q.shape(), (Shape{2, 3}));
  EXPECT_EQ(q.storage(), x.storage());
  EXPECT_EQ(x.unsqueeze(-1).shape(), (Shape{2, 3, 1}));
}

TEST(Views, ContiguousCopiesOnlyWhenNeeded) {
  Tensor x = iota({3, 4});
  uint64_t a0 = allocations();
  Tensor same = x.contiguous();
  EXPECT_EQ(allocations(), a0) << "contiguous() of a contiguous tensor must not allocate";
  EXPECT_EQ(same.storage(), x.storage());

  Tensor rows = x.slice(0, 1, 3);  // a row slice is still contiguous
  EXPECT_TRUE(rows.is_contiguous());
  uint64_t a1 = allocations();
  EXPECT_EQ(rows.contiguous().storage(), x.storage());
  EXPECT_EQ(allocations(), a1);

  Tensor t = x.transpose(0, 1);
  uint64_t a2 = allocations();
  size_t live = memory::stats().live_total;
  Tensor c = t.contiguous();
  EXPECT_EQ(allocations(), a2 + 1);
  EXPECT_EQ(memory::stats().live_total, live + c.nbytes());
  EXPECT_NE(c.storage(), x.storage());
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.strides(), (Strides{3, 1}));
  EXPECT_EQ(c.to_vector(), t.to_vector());
  // the copy is independent of the source
  x.fill_(0);
  EXPECT_EQ(c.at({3, 2}), 11);
}

TEST(Views, ReshapeIsAViewWhenContiguousAndCopiesOtherwise) {
  Tensor x = iota({2, 3, 4});
  uint64_t a0 = allocations();
  Tensor r = x.reshape({6, 4});
  Tensor v = x.view({4, -1});
  EXPECT_EQ(allocations(), a0);
  EXPECT_EQ(r.storage(), x.storage());
  EXPECT_EQ(v.storage(), x.storage());
  EXPECT_EQ(v.shape(), (Shape{4, 6}));
  EXPECT_TRUE(x.reshape({2, 3, 4}).same(x));

  Tensor t = x.transpose(1, 2);  // [2, 4, 3], not contiguous
  uint64_t a1 = allocations();
  Tensor rt = t.reshape({8, 3});
  EXPECT_EQ(allocations(), a1 + 1);
  EXPECT_NE(rt.storage(), x.storage());
  EXPECT_EQ(rt.to_vector(), t.to_vector());  // row-major order of the transposed view
  EXPECT_THROW(t.view({8, 3}), Error);

  // [2, 3, 2] with step 2: every element is 2 apart, so the flat reshape is a strided view
  Tensor s = x.slice(2, 0, 4, 2);
  uint64_t a2 = allocations();
  Tensor rs = s.reshape({12});
  EXPECT_EQ(allocations(), a2);
  EXPECT_EQ(rs.storage(), x.storage());
  EXPECT_EQ(rs.strides(), (Strides{2}));
  EXPECT_EQ(rs.to_vector(), (Values{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22}));

  // a slice along the last axis split into two axes (attention's heads) is a view as well...
  Tensor q = x.slice(2, 0, 2);  // [2, 3, 2] of rows of 4
  Tensor heads = q.reshape({2, 3, 2, 1});
  EXPECT_EQ(heads.storage(), x.storage());
  EXPECT_EQ(heads.to_vector(), q.to_vector());
  // ...but merging two axes that are not contiguous over each other copies
  Tensor m = x.slice(1, 0, 2).reshape({2, 8});  // rows 0-1 of each [3, 4] block: contiguous runs of 8
  EXPECT_EQ(m.storage(), x.storage());
  Tensor m2 = x.slice(2, 1, 3).reshape({6, 2});  // [2, 3, 2] -> [6, 2]: axes 0 and 1 merge (strides 12 = 3 * 4)
  EXPECT_EQ(m2.storage(), x.storage());
  EXPECT_EQ(m2.to_vector(), (Values{1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22}));
  Tensor c = x.slice(2, 1, 3).reshape({12});  // runs of 2 elements 4 apart: no single stride
  EXPECT_NE(c.storage(), x.storage());
  EXPECT_EQ(c.to_vector(), (Values{1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22}));
}

TEST(Views, CloneAlwaysCopiesDetachShares) {
  Tensor x = iota({2, 2});
  Tensor c = x.clone();
  EXPECT_NE(c.storage(), x.storage());
  EXPECT_EQ(c.to_vector(), x.to_vector());
  Tensor d = x.detach();
  EXPECT_EQ(d.storage(), x.storage());
  EXPECT_FALSE(d.same(x));
  EXPECT_TRUE(x.to(DType::f64).same(x));
  Tensor f = x.to(DType::f32);
  EXPECT_EQ(f.dtype(), DType::f32);
  EXPECT_NE(f.storage(), x.storage());
}

TEST(Views, GradientFlowsThroughAViewChainToTheBase) {
  Tensor x = iota({2, 3, 4}).requires_grad_();
  Tensor y = x.permute({2, 0, 1}).slice(0, 1, 4, 2).reshape({-1});  // picks x[:, :, 1] and x[:, :, 3]
  sum(y).backward();
  Values want(24, 0);
  for (int i = 0; i < 24; ++i) want[i] = (i % 4 == 1 || i % 4 == 3) ? 1 : 0;
  EXPECT_EQ(x.grad().to_vector(), want);
}

// ============================================================================================
// Broadcasting shape rules
// ============================================================================================

TEST(Broadcast, ShapeRules) {
  struct Case {
    Shape a, b, out;
  };
  const std::vector<Case> cases = {
      {{2, 3}, {3}, {2, 3}},          {{4, 1, 3}, {2, 1}, {4, 2, 3}}, {{}, {2, 3}, {2, 3}},
      {{2, 3}, {}, {2, 3}},           {{2, 1}, {1, 3}, {2, 3}},       {{5, 1, 4}, {1, 3, 1}, {5, 3, 4}},
      {{1}, {7}, {7}},                {{3, 1}, {3, 1}, {3, 1}},       {{0, 3}, {3}, {0, 3}},
      {{1, 1, 1, 1, 1, 2}, {3, 1}, {1, 1, 1, 1, 3, 2}}};
  for (const auto& c : cases) {
    EXPECT_EQ(broadcast_shapes(c.a, c.b, "test"), c.out) << shape_str(c.a) << " with " << shape_str(c.b);
    EXPECT_EQ(broadcast_shapes(c.b, c.a, "test"), c.out) << "broadcasting is symmetric";
    // and the ops follow it
    Tensor a = ones(c.a, DType::f64), b = ones(c.b, DType::f64);
    EXPECT_EQ(add(a, b).shape(), c.out);
    EXPECT_EQ(mul(a, b).shape(), c.out);
    EXPECT_EQ(maximum(a, b).shape(), c.out);
  }
}

TEST(Broadcast, IncompatibleShapesThrowNamingOpAndShapes) {
  const std::vector<std::pair<Shape, Shape>> bad = {{{2, 3}, {4}}, {{2, 3}, {3, 2}}, {{3}, {4}}, {{2, 2, 3}, {4, 3}}};
  for (const auto& [a, b] : bad) {
    try {
      broadcast_shapes(a, b, "myop");
      ADD_FAILURE() << shape_str(a) << " and " << shape_str(b) << " should not broadcast";
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("myop"), std::string::npos) << m;
      EXPECT_NE(m.find(shape_str(a)), std::string::npos) << m;
      EXPECT_NE(m.find(shape_str(b)), std::string::npos) << m;
    }
    for (const char* op : {"add", "sub", "mul", "div", "maximum", "minimum"}) {
      Tensor x = ones(a, DType::f32), y = ones(b, DType::f32);
      try {
        std::string name = op;
        if (name == "add") add(x, y);
        else if (name == "sub") sub(x, y);
        else if (name == "mul") mul(x, y);
        else if (name == "div") div(x, y);
        else if (name == "maximum") maximum(x, y);
        else minimum(x, y);
        ADD_FAILURE() << op << " accepted " << shape_str(a) << " and " << shape_str(b);
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << e.what();
      }
    }
  }
}

TEST(Broadcast, WhereBroadcastsAllThree) {
  Tensor cond = from_indices({1, 0, 1}, {3});
  Tensor a = vec({10, 20}, {2, 1});
  Tensor b = scalar_tensor(-1, DType::f64);
  Tensor y = where(cond, a, b);
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  EXPECT_EQ(y.to_vector(), (Values{10, -1, 10, 20, -1, 20}));
  EXPECT_THROW(where(from_indices({1, 0}, {2}), ones({3}, DType::f64), ones({3}, DType::f64)), Error);
}

TEST(Broadcast, MaskedFillMaskMustBroadcastToInput) {
  Tensor x = zeros({2, 3}, DType::f64);
  EXPECT_EQ(masked_fill(x, from_indices({0, 1, 0}, {3}), 5).to_vector(), (Values{0, 5, 0, 0, 5, 0}));
  EXPECT_THROW(masked_fill(zeros({3}, DType::f64), from_indices({0, 1, 0, 1, 0, 1}, {2, 3}), 5), Error);
}

TEST(Broadcast, CopyBroadcastsSourceButNotDestination) {
  Tensor dst = zeros({2, 3}, DType::f64);
  dst.copy_(vec({1, 2, 3}, {3}));
  EXPECT_EQ(dst.to_vector(), (Values{1, 2, 3, 1, 2, 3}));
  dst.copy_(vec({7, 8}, {2, 1}));
  EXPECT_EQ(dst.to_vector(), (Values{7, 7, 7, 8, 8, 8}));
  Tensor small = zeros({3}, DType::f64);
  EXPECT_THROW(small.copy_(dst), Error);
  // copy converts dtypes
  Tensor f = zeros({3}, DType::f32);
  f.copy_(vec({1.5, 2.5, 3.5}, {3}));
  EXPECT_EQ(f.to_vector(), (Values{1.5, 2.5, 3.5}));
}

TEST(Broadcast, ExpandRules) {
  Tensor x = ones({2, 1}, DType::f64);
  EXPECT_EQ(x.expand({3, 2, 4}).shape(), (Shape{3, 2, 4}));
  EXPECT_THROW(x.expand({3, 4}), Error);  // 2 cannot become 3
  EXPECT_THROW(x.expand({4}), Error);     // lower rank
}

// ============================================================================================
// Gradient accumulation
// ============================================================================================

TEST(Accumulation, ValueUsedSeveralTimes) {
  // y = x*x + x: dy/dx = 2x + 1 (x reaches the output along three edges)
  Tensor x = vec({-1.5, 0.5, 2, 3}, {4}).requires_grad_();
  Tensor y = add(mul(x, x), x);
  sum(y).backward();
  EXPECT_EQ(x.grad().to_vector(), (Values{-2, 2, 5, 7}));
}

TEST(Accumulation, IntermediateUsedSeveralTimes) {
  // h = 2x; y = h*h*h + h: dy/dx = 2 * (3h^2 + 1)
  Tensor x = vec({0.5, -1}, {2}).requires_grad_();
  Tensor h = mul_scalar(x, 2);
  Tensor y = add(mul(mul(h, h), h), h);
  sum(y).backward();
  EXPECT_EQ(x.grad().to_vector(), (Values{2 * (3 * 1 + 1), 2 * (3 * 4 + 1)}));
}

TEST(Accumulation, SeveralBackwardCallsAddUpUntilZeroGrad) {
  Tensor x = vec({1, 2}, {2}).requires_grad_();
  Tensor y = sum(mul(x, x));
  y.backward(Tensor(), /*retain_graph=*/true);
  EXPECT_EQ(x.grad().to_vector(), (Values{2, 4}));
  y.backward();
  EXPECT_EQ(x.grad().to_vector(), (Values{4, 8}));
  EXPECT_EQ(x.grad().storage()->tag(), memory::Tag::gradient);
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
  sum(mul_scalar(x, 3)).backward();
  EXPECT_EQ(x.grad().to_vector(), (Values{3, 3}));
}

TEST(Accumulation, GradFunctionDoesNotTouchLeafGrads) {
  Tensor x = vec({1, 2}, {2}).requires_grad_();
  Tensor w = vec({3, 4}, {2}).requires_grad_();
  Tensor y = sum(add(mul(x, w), x));
  TensorList g = remat::grad({y}, {x, w});
  EXPECT_EQ(g[0].to_vector(), (Values{4, 5}));
  EXPECT_EQ(g[1].to_vector(), (Values{1, 2}));
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
}

TEST(Accumulation, TwoOutputsBackwardTogether) {
  Tensor x = vec({1, 2, 3}, {3}).requires_grad_();
  Tensor a = mul_scalar(x, 2);
  Tensor b = mul(x, x);
  remat::backward({a, b}, {vec({1, 1, 1}, {3}), vec({1, 0, 2}, {3})});
  EXPECT_EQ(x.grad().to_vector(), (Values{2 + 2, 2 + 0, 2 + 12}));
}

// ============================================================================================
// Gradients over broadcast axes
// ============================================================================================

// d/da, d/db of sum(op(a, b) * R) for exact small values.
struct BroadcastGrad {
  Values ga, gb;
};
BroadcastGrad add_grads(const Tensor& a0, const Tensor& b0, const Tensor& r) {
  Tensor a = a0.detach().requires_grad_(), b = b0.detach().requires_grad_();
  remat::backward({add(a, b)}, {r});
  return {a.grad().to_vector(), b.grad().to_vector()};
}

TEST(BroadcastGradients, ReducedOverBroadcastAxes) {
  Tensor r = iota({2, 3});  // R = [[0,1,2],[3,4,5]]
  {
    auto g = add_grads(zeros({2, 3}, DType::f64), zeros({3}, DType::f64), r);
    EXPECT_EQ(g.ga, r.to_vector());
    EXPECT_EQ(g.gb, (Values{3, 5, 7}));  // column sums
  }
  {
    auto g = add_grads(zeros({2, 3}, DType::f64), zeros({2, 1}, DType::f64), r);
    EXPECT_EQ(g.gb, (Values{3, 12}));  // row sums
  }
  {
    auto g = add_grads(zeros({2, 3}, DType::f64), zeros({1, 3}, DType::f64), r);
    EXPECT_EQ(g.gb, (Values{3, 5, 7}));
  }
  {
    auto g = add_grads(scalar_tensor(0, DType::f64), zeros({2, 3}, DType::f64), r);
    EXPECT_EQ(g.ga, (Values{15}));  // the scalar gets the total
    EXPECT_EQ(g.gb, r.to_vector());
  }
  {
    auto g = add_grads(zeros({2, 1}, DType::f64), zeros({1, 3}, DType::f64), r);
    EXPECT_EQ(g.ga, (Values{3, 12}));
    EXPECT_EQ(g.gb, (Values{3, 5, 7}));
  }
}

TEST(BroadcastGradients, ThreeDimensionalBothSidesBroadcast) {
  // a [4,1,3] + b [2,1] -> [4,2,3]; R = 0..23
  Tensor a = zeros({4, 1, 3}, DType::f64).requires_grad_();
  Tensor b = zeros({2, 1}, DType::f64).requires_grad_();
  Tensor r = iota({4, 2, 3});
  remat::backward({add(a, b)}, {r});
  ASSERT_EQ(a.grad().shape(), (Shape{4, 1, 3}));
  ASSERT_EQ(b.grad().shape(), (Shape{2, 1}));
  Values ga(12, 0), gb(2, 0);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 3; ++k) {
        double v = (i * 2 + j) * 3 + k;
        ga[i * 3 + k] += v;
        gb[j] += v;
      }
  EXPECT_EQ(a.grad().to_vector(), ga);
  EXPECT_EQ(b.grad().to_vector(), gb);
}

TEST(BroadcastGradients, MulWeightsByTheOtherOperand) {
  // a [2,3] * b [3]: ga = R * b, gb = sum_rows(R * a)
  Tensor a = iota({2, 3}).requires_grad_();
  Tensor b = vec({1, -1, 2}, {3}).requires_grad_();
  remat::backward({mul(a, b)}, {ones({2, 3}, DType::f64)});
  EXPECT_EQ(a.grad().to_vector(), (Values{1, -1, 2, 1, -1, 2}));
  EXPECT_EQ(b.grad().to_vector(), (Values{3, 5, 7}));
}

TEST(BroadcastGradients, ExpandBackwardSums) {
  Tensor x = vec({1, 2, 3}, {3, 1}).requires_grad_();
  Tensor e = x.expand({2, 3, 4});
  sum(mul(e, e)).backward();  // d/dx sum over 8 copies of x^2 = 16x
  EXPECT_EQ(x.grad().to_vector(), (Values{16, 32, 48}));
}

TEST(BroadcastGradients, SumToValues) {
  Tensor x = iota({2, 3, 4});
  EXPECT_EQ(sum_to(x, {4}).to_vector(), (Values{60, 66, 72, 78}));
  EXPECT_EQ(sum_to(x, {3, 1}).to_vector(), (Values{60, 92, 124}));
  EXPECT_EQ(sum_to(x, {2, 1, 1}).shape(), (Shape{2, 1, 1}));
  EXPECT_EQ(sum_to(x, {}).to_vector(), (Values{276}));
  EXPECT_TRUE(sum_to(x, {2, 3, 4}).same(x));
  EXPECT_THROW(sum_to(x, {5}), Error);
  EXPECT_THROW(sum_to(iota({3}), {2, 3}), Error);
}

TEST(BroadcastGradients, BroadcastBatchMatmulSumsOverTheBatch) {
  // a [2,1,1,2] @ b [3,2,1] -> [2,3,1,1]; gb sums over the broadcast leading axis
  Tensor a = vec({1, 2, 3, 4}, {2, 1, 1, 2}).requires_grad_();
  Tensor b = vec({1, 0, 0, 1, 1, 1}, {3, 2, 1}).requires_grad_();
  Tensor y = matmul(a, b);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 1, 1}));
  sum(y).backward();
  EXPECT_EQ(b.grad().to_vector(), (Values{4, 6, 4, 6, 4, 6}));  // a[0] + a[1] for each batch of b
  EXPECT_EQ(a.grad().to_vector(), (Values{2, 2, 2, 2}));        // sum over b's batch of b
}

}  // namespace
