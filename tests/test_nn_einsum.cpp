// einsum: values against a loop-over-all-indices float64 reference, float64 finite-difference
// gradients for two-operand and general patterns (several operands, traces and diagonals,
// ellipsis broadcasting, sums over indices met once), the contraction order (against brute force
// over every order; greedy above the optimal limit), the Einsum layer, and the errors.
#include <gtest/gtest.h>

#include <map>

#include "op_harness.h"        // Rng
#include "op_reference_conv.h"  // ref::einsum
#include "remat/nn.h"
#include "test_nn_gradcheck.h"

using namespace remat;
using remat::nn_test::expect_gradients_match;

namespace {

// out[o] = sum over all other indices of prod_k operand_k[...], by brute force.
std::vector<double> reference_einsum(const std::string& lhs, const std::string& out, const TensorList& ops) {
  std::vector<std::string> terms;
  size_t start = 0;
  for (;;) {
    size_t comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  std::map<char, int64_t> size;
  for (size_t k = 0; k < terms.size(); ++k)
    for (size_t i = 0; i < terms[k].size(); ++i) size[terms[k][i]] = ops[k].shape()[i];
  std::string letters;
  for (auto [c, n] : size) letters += c;
  int64_t out_numel = 1;
  for (char c : out) out_numel *= size[c];
  std::vector<double> result(static_cast<size_t>(out_numel), 0.0);
  std::vector<std::vector<double>> values;
  for (const auto& op : ops) values.push_back(op.to_vector());
  std::map<char, int64_t> at;
  for (char c : letters) at[c] = 0;
  for (;;) {
    double product = 1;
    for (size_t k = 0; k < terms.size(); ++k) {
      int64_t flat = 0;
      for (char c : terms[k]) flat = flat * size[c] + at[c];
      product *= values[k][static_cast<size_t>(flat)];
    }
    int64_t o = 0;
    for (char c : out) o = o * size[c] + at[c];
    result[static_cast<size_t>(o)] += product;
    size_t i = letters.size();
    while (i-- > 0) {
      if (++at[letters[i]] < size[letters[i]]) break;
      at[letters[i]] = 0;
    }
    if (i == static_cast<size_t>(-1)) break;
  }
  return result;
}

Tensor operand(const Shape& shape, uint64_t seed) {
  return randn(shape, DType::f64, RngState{seed, 0}).requires_grad_();
}

struct Pattern {
  std::string spec;
  std::vector<Shape> shapes;
};

const std::vector<Pattern> kPatterns = {
    {"ij,jk->ik", {{3, 4}, {4, 5}}},
    {"bij,bjk->bik", {{2, 3, 4}, {2, 4, 5}}},
    {"bij,jk->bik", {{2, 3, 4}, {4, 5}}},
    {"bhqd,bhkd->bhqk", {{2, 2, 3, 4}, {2, 2, 5, 4}}},
    {"ij->ji", {{3, 4}}},
    {"ij->i", {{3, 4}}},
    {"ijk->kj", {{2, 3, 4}}},
    {"i,i->", {{5}, {5}}},
    {"ij,ij->i", {{3, 4}, {3, 4}}},
    {"bi,ij->bj", {{2, 3}, {3, 4}}},
    {"i,j->ij", {{3}, {4}}},
    {"ij,kj->ik", {{3, 4}, {5, 4}}},    // second operand transposed
    {"ji,jk->ik", {{4, 3}, {4, 5}}},    // first operand transposed
    {"abc,cd->", {{2, 3, 4}, {4, 2}}},  // everything summed
    {"iaj,jb->ib", {{3, 2, 4}, {4, 5}}},  // 'a' only in the first operand: summed first
    {"bqhd,bkhd->bhqk", {{2, 3, 2, 4}, {2, 5, 2, 4}}},
};

std::string output_of(const std::string& spec) { return spec.substr(spec.find("->") + 2); }
std::string lhs_of(const std::string& spec) { return spec.substr(0, spec.find("->")); }

void expect_error(const std::string& spec, const TensorList& ops, const std::vector<std::string>& fragments) {
  try {
    nn::einsum(spec, ops);
    ADD_FAILURE() << spec << ": no error";
  } catch (const Error& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("einsum(\"" + spec + "\")"), std::string::npos) << message;
    for (const auto& f : fragments) EXPECT_NE(message.find(f), std::string::npos) << "'" << f << "' not in: " << message;
  }
}

}  // namespace

TEST(NnEinsum, ValuesMatchBruteForce) {
  uint64_t seed = 1;
  for (const auto& p : kPatterns) {
    SCOPED_TRACE(p.spec);
    TensorList ops;
    for (const auto& s : p.shapes) ops.push_back(operand(s, seed++));
    Tensor y = nn::einsum(p.spec, ops);
    Shape expected_shape;
    std::map<char, int64_t> size;
    std::string lhs = lhs_of(p.spec);
    for (size_t k = 0, pos = 0; k < ops.size(); ++k) {
      for (int64_t i = 0; i < ops[k].dim(); ++i) size[lhs[pos++]] = ops[k].shape()[i];
      ++pos;  // the comma
    }
    for (char c : output_of(p.spec)) expected_shape.push_back(size[c]);
    ASSERT_EQ(y.shape(), expected_shape);
    std::vector<double> got = y.to_vector(), want = reference_einsum(lhs, output_of(p.spec), ops);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << i;
  }
}

TEST(NnEinsum, GradientsMatchFiniteDifferences) {
  uint64_t seed = 100;
  for (const auto& p : kPatterns) {
    SCOPED_TRACE(p.spec);
    TensorList ops;
    for (const auto& s : p.shapes) ops.push_back(operand(s, seed++));
    expect_gradients_match([&] { return nn::einsum(p.spec, ops); }, ops);
  }
}

TEST(NnEinsum, ImplicitOutputAndSpaces) {
  Tensor a = operand({3, 4}, 1), b = operand({4, 5}, 2);
  Tensor implicit = nn::einsum("ij,jk", {a, b});  // -> "ik"
  Tensor explicit_ = nn::einsum(" i j , j k -> i k ", {a, b});
  EXPECT_EQ(implicit.shape(), (Shape{3, 5}));
  EXPECT_EQ(implicit.to_vector(), explicit_.to_vector());
  EXPECT_EQ(nn::einsum("ba", {a}).shape(), (Shape{4, 3}));  // implicit output is alphabetical: "ab"
}

TEST(NnEinsum, PermutationIsAView) {
  Tensor a = operand({3, 4}, 1);
  Tensor t = nn::einsum("ij->ji", {a});
  EXPECT_EQ(t.storage().get(), a.storage().get());
  EXPECT_TRUE(nn::einsum("ij->ij", {a}).same(a));
}

TEST(NnEinsum, RejectsInvalidSpecs) {
  Tensor a = operand({3, 4}, 1), b = operand({4, 5}, 2), sq = operand({3, 3}, 3);
  expect_error("ij,jk->ik", {a, a}, {"'j'", "size 4", "size 3"});
  expect_error("ijk,jk->ik", {a, b}, {"operand 0", "[3, 4]", "\"ijk\""});
  expect_error("ij,jk->iz", {a, b}, {"'z'"});
  expect_error("ij,jk->ii", {a, b}, {"'i'", "twice in the output"});
  expect_error("ij,jk->ik", {a}, {"2 operand terms", "1 operands"});
  expect_error("ij,jk,kl->il", {a, b, b}, {"'k'", "size 5", "size 4"});
  expect_error("ii->i", {a}, {"'i'", "size 3", "size 4"});            // a diagonal of a non-square pair
  expect_error("...ijk,jk->ik", {a, b}, {"operand 0", "besides \"...\""});
  expect_error("i...j...,jk->ik", {a, b}, {"'.'", "\"...\""});
  expect_error("i.j,jk->ik", {a, b}, {"'.'"});
  expect_error("...i,...i->...", {operand({2, 3}, 4), operand({4, 3}, 5)}, {"do not broadcast", "sizes 2 and 4"});
  expect_error("i1,jk->ik", {a, b}, {"'1'"});
  expect_error("ij,jk->i,k", {a, b}, {"','"});
  expect_error("ij->i", {}, {"none"});
  expect_error("ij,jk->ik", {a, from_indices({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {3, 4})}, {"operand 1", "i64"});
  expect_error("ij,jk->ik", {a, b.to(DType::f32)}, {"f64", "f32"});
}

TEST(NnEinsum, CommonPatternsCopyNothing) {
  // Each lowers to views and one matmul: the only allocation is the product.
  struct Case {
    std::string spec;
    std::vector<Shape> shapes;
  };
  const std::vector<Case> cases = {
      {"ij,jk->ik", {{3, 4}, {4, 5}}},          {"ij,kj->ik", {{3, 4}, {5, 4}}},
      {"ji,jk->ik", {{4, 3}, {4, 5}}},          {"bij,bjk->bik", {{2, 3, 4}, {2, 4, 5}}},
      {"bij,jk->bik", {{2, 3, 4}, {4, 5}}},     {"bhqd,bhkd->bhqk", {{2, 2, 3, 4}, {2, 2, 5, 4}}},
      {"bhqk,bhkd->bhqd", {{2, 2, 3, 5}, {2, 2, 5, 4}}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.spec);
    Tensor a = randn(c.shapes[0], DType::f64, RngState{1, 0}), b = randn(c.shapes[1], DType::f64, RngState{2, 0});
    NoGradGuard no_grad;
    const uint64_t before = memory::stats().allocations_total;
    Tensor y = nn::einsum(c.spec, {a, b});
    EXPECT_EQ(memory::stats().allocations_total - before, 1u);
  }
}

// ---- general einsum: several operands, traces, diagonals, ellipses

namespace {

std::vector<remat::test::Array> arrays(const TensorList& ops) {
  std::vector<remat::test::Array> out;
  for (const auto& t : ops) out.push_back({t.shape(), t.to_vector()});
  return out;
}

const std::vector<Pattern> kGeneralPatterns = {
    {"ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 2}}},
    {"ab,bc,cd,de,ef->af", {{2, 3}, {3, 2}, {2, 4}, {4, 3}, {3, 2}}},
    {"abc,cd,de,ea->b", {{2, 3, 2}, {2, 3}, {3, 2}, {2, 2}}},
    {"ii->", {{4, 4}}},
    {"ii", {{3, 3}}},                       // implicit: the trace
    {"ii->i", {{3, 3}}},
    {"iii->i", {{2, 2, 2}}},
    {"bii->bi", {{2, 3, 3}}},
    {"iij,jk->ik", {{2, 2, 3}, {3, 4}}},
    {"ij,jk,ki->", {{2, 3}, {3, 4}, {4, 2}}},  // trace of a product
    {"...ij,...jk->...ik", {{2, 1, 3, 4}, {5, 4, 2}}},
    {"...i,...i->...", {{2, 3}, {1, 3}}},
    {"b...,b...->b", {{2, 3, 2}, {2, 3, 2}}},
    {"...ij->...ji", {{2, 3, 4}}},
    {"...ii->...i", {{2, 3, 3}}},
    {"i...,i->...", {{3, 2, 2}, {3}}},
    {"...i,i", {{2, 3, 4}, {4}}},           // implicit with an ellipsis
    {"ij,k->i", {{2, 3}, {4}}},             // k met once and not in the output: summed
    {"i,i,i->", {{5}, {5}, {5}}},
    {"bi,ijk,bj->bk", {{2, 3}, {3, 4, 2}, {2, 4}}},
    {"ij,jk", {{2, 3}, {3, 2}}},
    {"i,j,k->ijk", {{2}, {3}, {2}}},        // outer products (no index summed)
    {"ij,ij,ij->ij", {{2, 3}, {2, 3}, {2, 3}}},
};

}  // namespace

TEST(NnEinsumGeneral, ValuesMatchTheFloat64Reference) {
  uint64_t seed = 300;
  for (const auto& p : kGeneralPatterns) {
    SCOPED_TRACE(p.spec);
    TensorList ops;
    for (const auto& s : p.shapes) ops.push_back(operand(s, seed++));
    Tensor y = nn::einsum(p.spec, ops);
    remat::test::Array want = remat::test::ref::einsum(p.spec, arrays(ops));
    ASSERT_EQ(y.shape(), want.shape);
    std::vector<double> got = y.to_vector();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want.v[i], 1e-12) << i;
  }
}

TEST(NnEinsumGeneral, GradientsMatchFiniteDifferences) {
  uint64_t seed = 400;
  for (const auto& p : kGeneralPatterns) {
    SCOPED_TRACE(p.spec);
    TensorList ops;
    for (const auto& s : p.shapes) ops.push_back(operand(s, seed++));
    expect_gradients_match([&] { return nn::einsum(p.spec, ops); }, ops);
  }
}

TEST(NnEinsumGeneral, DiagonalIsAView) {
  Tensor a = operand({3, 3}, 1);
  Tensor d = nn::einsum("ii->i", {a});
  EXPECT_EQ(d.storage().get(), a.storage().get());
  EXPECT_EQ(d.strides(), (Strides{4}));
}

// The least total cost over every pairwise order, by brute force (the cost model of
// einsum_path: 2 x the product of the sizes of the two operands' indices).
double brute_force_cost(std::vector<std::string> ops, const std::string& out, std::map<char, int64_t>& size) {
  if (ops.size() <= 1) return 0;
  double best = 1e300;
  for (size_t i = 0; i < ops.size(); ++i)
    for (size_t j = i + 1; j < ops.size(); ++j) {
      std::string merged = ops[i];
      for (char c : ops[j])
        if (merged.find(c) == std::string::npos) merged += c;
      double cost = 2;
      for (char c : merged) cost *= static_cast<double>(size[c]);
      std::string kept;
      for (char c : merged) {
        bool needed = out.find(c) != std::string::npos;
        for (size_t k = 0; k < ops.size(); ++k)
          if (k != i && k != j && ops[k].find(c) != std::string::npos) needed = true;
        if (needed) kept += c;
      }
      std::vector<std::string> rest;
      for (size_t k = 0; k < ops.size(); ++k)
        if (k != i && k != j) rest.push_back(ops[k]);
      rest.push_back(kept);
      best = std::min(best, cost + brute_force_cost(rest, out, size));
    }
  return best;
}

TEST(NnEinsumPath, OptimalOrderMatchesBruteForce) {
  struct Case {
    std::vector<std::string> terms;
    std::string out;
  };
  const std::vector<Case> cases = {
      {{"ab", "bc", "cd", "de"}, "ae"},
      {{"abc", "cd", "de", "ea"}, "b"},
      {{"ab", "bc", "ca"}, ""},
      {{"abd", "bc", "cde", "ea", "f"}, "f"},
      {{"ij", "jk", "kl", "lm", "mn"}, "in"},
  };
  remat::test::Rng rng(7);
  for (const auto& c : cases) {
    for (int trial = 0; trial < 4; ++trial) {
      std::map<char, int64_t> size;
      std::vector<Shape> shapes;
      std::string spec;
      for (size_t k = 0; k < c.terms.size(); ++k) {
        Shape s;
        for (char ch : c.terms[k]) {
          if (!size.count(ch)) size[ch] = rng.integer(1, 30);
          s.push_back(size[ch]);
        }
        shapes.push_back(s);
        spec += (k ? "," : "") + c.terms[k];
      }
      spec += "->" + c.out;
      SCOPED_TRACE(spec);
      nn::EinsumPath path = nn::einsum_path(spec, shapes);
      EXPECT_TRUE(path.optimal);
      EXPECT_EQ(path.steps.size(), c.terms.size() - 1);
      EXPECT_DOUBLE_EQ(path.flops, brute_force_cost(c.terms, c.out, size));
    }
  }
}

TEST(NnEinsumPath, TheCheapChainOrderIsChosenAndComputed) {
  // (A B) C costs 2*2*100*2 + 2*2*2*100 = 1600; A (B C) costs 2*100*2*100 + 2*2*100*100 = 80000
  const std::vector<Shape> shapes = {{2, 100}, {100, 2}, {2, 100}};
  nn::EinsumPath path = nn::einsum_path("ab,bc,cd->ad", shapes);
  ASSERT_EQ(path.steps.size(), 2u);
  EXPECT_EQ(path.steps[0].first, 0u);
  EXPECT_EQ(path.steps[0].second, 1u);
  EXPECT_EQ(path.steps[0].result, "ac");
  EXPECT_DOUBLE_EQ(path.flops, 1600.0);
  // and einsum follows that path: the intermediate is 2 x 2, so the work is small
  TensorList ops;
  for (size_t k = 0; k < shapes.size(); ++k) ops.push_back(operand(shapes[k], 50 + k));
  reset_counters();
  Tensor y = nn::einsum("ab,bc,cd->ad", ops);
  EXPECT_LT(counters().ops.forward_flops, 10000.0);
  remat::test::Array want = remat::test::ref::einsum("ab,bc,cd->ad", arrays(ops));
  auto got = y.to_vector();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want.v[i], 1e-10);
}

TEST(NnEinsumPath, GreedyAboveTheOptimalLimit) {
  // a chain of kEinsumOptimalLimit + 2 matrices
  const int n = nn::kEinsumOptimalLimit + 2;
  std::string spec;
  std::vector<Shape> shapes;
  TensorList ops;
  for (int k = 0; k < n; ++k) {
    spec += (k ? "," : "") + std::string{static_cast<char>('a' + k), static_cast<char>('a' + k + 1)};
    shapes.push_back({2 + k % 3, 2 + (k + 1) % 3});
    ops.push_back(operand(shapes.back(), 70 + static_cast<uint64_t>(k)));
  }
  spec += std::string("->a") + static_cast<char>('a' + n);
  nn::EinsumPath path = nn::einsum_path(spec, shapes);
  EXPECT_FALSE(path.optimal);
  EXPECT_EQ(path.steps.size(), static_cast<size_t>(n - 1));
  Tensor y = nn::einsum(spec, ops);
  remat::test::Array want = remat::test::ref::einsum(spec, arrays(ops));
  ASSERT_EQ(y.shape(), want.shape);
  auto got = y.to_vector();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want.v[i], 1e-9 * (1 + std::abs(want.v[i])));
}

// ---- the Einsum layer

TEST(NnEinsumLayer, OwnsItsWeightsAndDifferentiates) {
  nn::Einsum layer("bsi,ijk,kl->bsjl", {{4, 3, 5}, {5, 2}}, DType::f64);
  auto named = layer.named_parameters();
  ASSERT_EQ(named.size(), 2u);
  EXPECT_EQ(named[0].first, "weight0");
  EXPECT_EQ(named[1].first, "weight1");
  EXPECT_EQ(named[0].second.shape(), (Shape{4, 3, 5}));
  // fan_in of weight0 = sizes of i and k (not in the output) = 20; of weight1: k = 5
  for (double v : layer.weights[0].to_vector()) EXPECT_LE(std::abs(v), 1.0 / std::sqrt(20.0));
  for (double v : layer.weights[1].to_vector()) EXPECT_LE(std::abs(v), 1.0 / std::sqrt(5.0));
  Tensor x = operand({2, 3, 4}, 9);
  Tensor y = layer.forward(x);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 3, 2}));
  TensorList inputs{x, layer.weights[0], layer.weights[1]};
  expect_gradients_match([&] { return layer.forward(x); }, inputs);
  // one weight: named "weight", a Linear without bias
  nn::Einsum linear("bi,ij->bj", {{4, 3}}, DType::f64);
  EXPECT_EQ(linear.named_parameters()[0].first, "weight");
  Tensor z = linear.forward(operand({2, 4}, 10));
  EXPECT_EQ(z.shape(), (Shape{2, 3}));
}

TEST(NnEinsumLayer, RejectsBadSpecsAtConstruction) {
  EXPECT_THROW(nn::Einsum("bi,ij->bj", {}), Error);                  // a term without a weight
  EXPECT_THROW(nn::Einsum("bi,ij->bj", {{4, 3}, {3, 3}}), Error);    // a weight without a term
  EXPECT_THROW(nn::Einsum("bi,...j->bj", {{4, 3}}), Error);          // "..." in a weight
  EXPECT_THROW(nn::Einsum("bi,ij,jk->bk", {{4, 3}, {4, 2}}), Error);  // 'j': 3 vs 4
  EXPECT_THROW(nn::Einsum("bi,ijk->bj", {{4, 3}}), Error);           // rank mismatch
  EXPECT_THROW(nn::Einsum("bi,ij->bj", {{4, 0}}), Error);
  nn::Einsum layer("bi,ij->bj", {{4, 3}});
  EXPECT_THROW(layer.forward(zeros({2, 5})), Error);                 // 'i': 5 vs 4
}
