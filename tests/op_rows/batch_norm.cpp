// The batch-norm rows (src/autodiff/ops/batch_norm.cpp) in training and evaluation mode.
#include "op_rows/builders.h"
#include "op_reference_conv.h"

namespace remat::test {

namespace {

// Training mode (batch statistics) with or without the affine parameters; running statistics are
// checked elsewhere (test_nn_conv.cpp), since they carry no gradient.
OpCase batch_norm_train_case(Shape x, bool affine) {
  OpCase c;
  c.name = "batch_norm_train_" + dims(x) + (affine ? "_affine" : "_plain");
  const int64_t ch = x[1];
  c.make_inputs = [=](Rng& rng) {
    Inputs in{floating("x", x, rng.uniform_vector(numel_of(x), -2, 2))};
    if (affine) {
      in.push_back(floating("weight", {ch}, rng.uniform_vector(ch, 0.5, 1.5)));
      in.push_back(floating("bias", {ch}, rng.uniform_vector(ch, -1, 1)));
    }
    return in;
  };
  c.apply = [=](const TensorList& in) {
    return TensorList{batch_norm(in[0], affine ? in[1] : Tensor(), affine ? in[2] : Tensor(), Tensor(), Tensor(),
                                 /*training=*/true, 0.1, 1e-5)};
  };
  c.reference = [=](const std::vector<Array>& a) {
    return std::vector<Array>{ref::batch_norm_train(a[0], affine ? &a[1] : nullptr, affine ? &a[2] : nullptr, 1e-5)};
  };
  return c;
}

// Evaluation mode: the running statistics (constants) normalise.
OpCase batch_norm_eval_case(Shape x) {
  OpCase c;
  c.name = "batch_norm_eval_" + dims(x) + "_affine";
  const int64_t ch = x[1];
  c.make_inputs = [=](Rng& rng) {
    return Inputs{floating("x", x, rng.uniform_vector(numel_of(x), -2, 2)),
                  floating("weight", {ch}, rng.uniform_vector(ch, 0.5, 1.5)),
                  floating("bias", {ch}, rng.uniform_vector(ch, -1, 1)),
                  constant("running_mean", {ch}, rng.uniform_vector(ch, -0.5, 0.5)),
                  constant("running_var", {ch}, rng.uniform_vector(ch, 0.5, 2.0))};
  };
  c.apply = [](const TensorList& in) {
    return TensorList{batch_norm(in[0], in[1], in[2], in[3], in[4], /*training=*/false, 0.1, 1e-5)};
  };
  c.reference = [](const std::vector<Array>& a) {
    return std::vector<Array>{ref::batch_norm_with(a[0], a[3].v, a[4].v, &a[1], &a[2], 1e-5)};
  };
  return c;
}

}  // namespace

void add_batch_norm_rows(std::vector<OpCase>& t) {
  t.push_back(batch_norm_train_case({3, 2, 2, 3}, true));
  t.push_back(batch_norm_train_case({4, 3}, false));
  t.push_back(batch_norm_train_case({3, 2, 4}, true));
  t.push_back(batch_norm_eval_case({2, 3, 2, 2}));
}

}  // namespace remat::test
