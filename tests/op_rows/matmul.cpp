// The matrix product rows (src/autodiff/ops/matmul.cpp): matmul and linear.
#include "op_rows/builders.h"
namespace remat::test {

namespace {

OpCase matmul_case(const std::string& variant, Shape sa, Shape sb, bool ta, bool tb) {
  OpCase c;
  c.name = "matmul_" + variant + "_" + dims(sa) + (ta ? "T" : "") + "_by_" + dims(sb) + (tb ? "T" : "");
  c.make_inputs = [=](Rng& r) {
    return Inputs{floating("a", sa, r.uniform_vector(numel_of(sa), -1, 1)),
                  floating("b", sb, r.uniform_vector(numel_of(sb), -1, 1))};
  };
  c.apply = [=](const TensorList& in) { return TensorList{matmul(in[0], in[1], ta, tb)}; };
  c.reference = [=](const std::vector<Array>& a) { return std::vector<Array>{ref::matmul(a[0], a[1], ta, tb)}; };
  return c;
}

}  // namespace

void add_matmul_rows(std::vector<OpCase>& t) {
  t.push_back(matmul_case("nn", {3, 4}, {4, 5}, false, false));
  t.push_back(matmul_case("tn", {4, 3}, {4, 5}, true, false));
  t.push_back(matmul_case("nt", {3, 4}, {5, 4}, false, true));
  t.push_back(matmul_case("tt", {4, 3}, {5, 4}, true, true));
  t.push_back(matmul_case("batched", {2, 3, 4}, {2, 4, 5}, false, false));
  t.push_back(matmul_case("batched_tt", {2, 4, 3}, {2, 5, 4}, true, true));
  t.push_back(matmul_case("batched_by_2d", {2, 3, 4}, {4, 5}, false, false));
  t.push_back(matmul_case("batched_by_2d_nt", {2, 3, 4}, {5, 4}, false, true));
  t.push_back(matmul_case("batched_by_2d_tn", {2, 4, 3}, {4, 5}, true, false));
  t.push_back(matmul_case("2d_by_batched", {3, 4}, {2, 4, 5}, false, false));
  t.push_back(matmul_case("bcast_batch", {2, 1, 3, 4}, {3, 4, 5}, false, false));
  t.push_back(matmul_case("bcast_batch_tt", {2, 1, 4, 3}, {3, 5, 4}, true, true));
  t.push_back(matmul_case("outer_k1", {3, 1}, {1, 4}, false, false));
  {
    OpCase c = matmul_case("view_operands", {4, 3}, {5, 4}, false, false);
    c.name = "matmul_view_operands_transposed_views";
    c.apply = [](const TensorList& in) { return TensorList{matmul(in[0].transpose(0, 1), in[1].transpose(0, 1))}; };
    c.reference = [](const std::vector<Array>& a) { return std::vector<Array>{ref::matmul(a[0], a[1], true, true)}; };
    t.push_back(c);
  }
  {
    OpCase c = matmul_case("sliced", {3, 8}, {4, 5}, false, false);
    c.name = "matmul_strided_slice_operand";
    c.apply = [](const TensorList& in) { return TensorList{matmul(in[0].slice(1, 0, 8, 2), in[1])}; };
    c.reference = [](const std::vector<Array>& a) {
      return std::vector<Array>{ref::matmul(ref::slice(a[0], 1, 0, 8, 2), a[1], false, false)};
    };
    t.push_back(c);
  }

  // linear: x @ W^T + b in one op
  for (Shape sx : {Shape{4, 3}, Shape{2, 3, 3}}) {
    OpCase c;
    c.name = "linear_" + dims(sx) + "_by_5x3_bias";
    c.make_inputs = [sx](Rng& r) {
      return Inputs{floating("x", sx, r.uniform_vector(numel_of(sx), -1, 1)),
                    floating("weight", {5, 3}, r.uniform_vector(15, -1, 1)), floating("bias", {5}, r.uniform_vector(5, -1, 1))};
    };
    c.apply = [](const TensorList& in) { return TensorList{linear(in[0], in[1], in[2])}; };
    c.reference = [](const std::vector<Array>& a) {
      Array y = ref::matmul(a[0], a[1], false, true);
      return std::vector<Array>{ref::binary(y, a[2], [](double u, double v) { return u + v; })};
    };
    t.push_back(c);
  }
  {  // a strided input is a batch of products (not folded into one) sharing the weight and the bias
    OpCase c;
    c.name = "linear_transposed_2x3x3_by_5x3_bias";
    c.make_inputs = [](Rng& r) {
      return Inputs{floating("x", {3, 2, 3}, r.uniform_vector(18, -1, 1)),
                    floating("weight", {5, 3}, r.uniform_vector(15, -1, 1)), floating("bias", {5}, r.uniform_vector(5, -1, 1))};
    };
    c.apply = [](const TensorList& in) { return TensorList{linear(in[0].transpose(0, 1), in[1], in[2])}; };
    c.reference = [](const std::vector<Array>& a) {
      Array y = ref::matmul(ref::permute(a[0], {1, 0, 2}), a[1], false, true);
      return std::vector<Array>{ref::binary(y, a[2], [](double u, double v) { return u + v; })};
    };
    t.push_back(c);
  }
}

}  // namespace remat::test
