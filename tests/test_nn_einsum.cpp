// einsum: values against a loop-over-all-indices reference, float64 finite-difference
// gradients for several index patterns, and the errors for invalid specs.
#include <gtest/gtest.h>

#include <map>

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
  expect_error("ii->i", {sq}, {"'i'", "twice", "trace"});
  expect_error("ij,jk->ik", {a, a}, {"'j'", "size 4", "size 3"});
  expect_error("ijk,jk->ik", {a, b}, {"operand 0", "[3, 4]", "\"ijk\""});
  expect_error("ij,jk->iz", {a, b}, {"'z'"});
  expect_error("ij,jk->ii", {a, b}, {"'i'", "twice in the output"});
  expect_error("ij,jk->ik", {a}, {"2 operand terms", "1 operands"});
  expect_error("ij,jk,kl->il", {a, b, b}, {"3"});
  expect_error("...ij,jk->ik", {a, b}, {"ellipsis"});
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
