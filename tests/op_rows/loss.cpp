// The cross-entropy rows (src/autodiff/ops/loss.cpp).
#include "op_rows/builders.h"
namespace remat::test {

namespace {

OpCase cross_entropy_case(const std::string& variant, Shape logits, std::vector<double> targets, double smoothing,
                          int64_t ignore_index) {
  OpCase c;
  c.name = "cross_entropy_" + variant + "_" + dims(logits);
  c.make_inputs = [=](Rng& r) {
    return Inputs{floating("logits", logits, r.uniform_vector(numel_of(logits), -2, 2)),
                  index_input("targets", {logits[0]}, targets)};
  };
  c.apply = [=](const TensorList& in) {
    return TensorList{cross_entropy(in[0], in[1], smoothing, ignore_index)};
  };
  c.reference = [=](const std::vector<Array>& a) {
    return std::vector<Array>{ref::cross_entropy(a[0], a[1], smoothing, ignore_index)};
  };
  return c;
}

}  // namespace

void add_loss_rows(std::vector<OpCase>& t) {
  t.push_back(cross_entropy_case("plain", {4, 5}, {1, 0, 4, 2}, 0.0, -100));
  t.push_back(cross_entropy_case("smoothing", {4, 5}, {1, 0, 4, 2}, 0.1, -100));
  t.push_back(cross_entropy_case("ignore_default", {4, 5}, {3, -100, 0, 4}, 0.0, -100));
  t.push_back(cross_entropy_case("ignore_custom_smoothing", {5, 3}, {2, 1, 2, 0, 1}, 0.2, 2));
  t.push_back(cross_entropy_case("wide", {3, 21}, {4, 20, 0}, 0.0, -100));
  t.push_back(cross_entropy_case("wide_smoothing", {3, 21}, {13, -100, 7}, 0.1, -100));
  t.push_back(cross_entropy_case("smoothing_1", {4, 5}, {1, 0, 4, 2}, 1.0, -100));  // the uniform term alone
  {  // transposed logits [3, 5] and strided targets [0, 4, 2]
    Rng r(hash_name("cross_entropy_transposed_logits_strided_targets"));
    t.push_back(two_input_case(
        "cross_entropy_transposed_logits_strided_targets", floating("logits", {5, 3}, r.uniform_vector(15, -2, 2)),
        index_input("targets", {6}, {0, 9, 4, 9, 2, 9}),
        [](const Tensor& x, const Tensor& targets) { return cross_entropy(x.transpose(0, 1), targets.slice(0, 0, 6, 2), 0.1); },
        [](const Array& x, const Array& targets) {
          return ref::cross_entropy(ref::permute(x, {1, 0}), ref::slice(targets, 0, 0, 6, 2), 0.1, -100);
        }));
  }
}

}  // namespace remat::test
