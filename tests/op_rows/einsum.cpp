// The general einsum rows (nn::einsum, src/nn/einsum.cpp), built of the ops: repeated indices,
// ellipses, several operands.
#include "op_rows/builders.h"
#include "op_reference_conv.h"
#include "remat/nn/einsum.h"

namespace remat::test {

namespace {

OpCase einsum_case(const std::string& variant, const std::string& spec, std::vector<Shape> shapes) {
  OpCase c;
  c.name = "einsum_" + variant;
  c.make_inputs = [shapes](Rng& rng) {
    Inputs in;
    for (size_t k = 0; k < shapes.size(); ++k)
      in.push_back(floating("op" + std::to_string(k), shapes[k], rng.uniform_vector(numel_of(shapes[k]), -1, 1)));
    return in;
  };
  c.apply = [spec](const TensorList& in) { return TensorList{nn::einsum(spec, in)}; };
  c.reference = [spec](const std::vector<Array>& a) { return std::vector<Array>{ref::einsum(spec, a)}; };
  return c;
}

}  // namespace

void add_einsum_rows(std::vector<OpCase>& t) {
  t.push_back(einsum_case("chain3", "ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 2}}));
  t.push_back(einsum_case("cycle4", "abc,cd,de,ea->b", {{2, 3, 2}, {2, 3}, {3, 2}, {2, 2}}));
  t.push_back(einsum_case("trace", "ii->", {{3, 3}}));
  t.push_back(einsum_case("diagonal", "ii->i", {{3, 3}}));
  t.push_back(einsum_case("batch_diagonal_sum", "bii,bj->bj", {{2, 3, 3}, {2, 4}}));
  t.push_back(einsum_case("diagonal_times_matrix", "iij,jk->ik", {{2, 2, 3}, {3, 4}}));
  t.push_back(einsum_case("ellipsis_broadcast", "...ij,...jk->...ik", {{2, 1, 3, 4}, {5, 4, 2}}));
  t.push_back(einsum_case("ellipsis_implicit", "...i,i", {{2, 3, 4}, {4}}));
  t.push_back(einsum_case("sum_single_index", "ij,k->i", {{2, 3}, {4}}));
  t.push_back(einsum_case("three_way_product", "i,i,i->", {{5}, {5}, {5}}));
  t.push_back(einsum_case("bilinear", "bi,ijk,bj->bk", {{2, 3}, {3, 4, 2}, {2, 4}}));
}

}  // namespace remat::test
