// The embedding rows (src/autodiff/ops/embedding.cpp).
#include "op_rows/builders.h"
namespace remat::test {

namespace {

OpCase embedding_case(Shape table, Shape ids_shape, std::vector<double> ids) {
  OpCase c;
  c.name = "embedding_" + dims(table) + "_ids" + dims(ids_shape);
  c.make_inputs = [=](Rng& r) {
    return Inputs{floating("table", table, r.uniform_vector(numel_of(table), -1, 1)),
                  index_input("ids", ids_shape, ids)};
  };
  c.apply = [](const TensorList& in) { return TensorList{embedding(in[0], in[1])}; };
  c.reference = [](const std::vector<Array>& a) { return std::vector<Array>{ref::embedding(a[0], a[1])}; };
  return c;
}

}  // namespace

void add_embedding_rows(std::vector<OpCase>& t) {
  t.push_back(embedding_case({5, 3}, {2, 3}, {0, 2, 2, 4, 1, 2}));  // repeated ids accumulate
  t.push_back(embedding_case({4, 2}, {5}, {3, 3, 0, 1, 3}));
  {  // a transposed table and strided ids: [[1, 2], [3, 0]]
    Rng r(hash_name("embedding_of_transposed_table_strided_ids"));
    t.push_back(two_input_case(
        "embedding_of_transposed_table_strided_ids", floating("table", {3, 4}, r.uniform_vector(12, -1, 1)),
        index_input("ids", {2, 2}, {1, 3, 2, 0}),
        [](const Tensor& table, const Tensor& ids) { return embedding(table.transpose(0, 1), ids.transpose(0, 1)); },
        [](const Array& table, const Array& ids) {
          return ref::embedding(ref::permute(table, {1, 0}), ref::permute(ids, {1, 0}));
        }));
  }
}

}  // namespace remat::test
