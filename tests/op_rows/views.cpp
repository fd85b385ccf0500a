// The view and copy rows (src/autodiff/ops/views.cpp): reshape, view, permute, slice, expand,
// squeeze, contiguous, clone, Tensor::to of a dtype and of a device.
#include "op_rows/builders.h"
#include "emulated_backend.h"

namespace remat::test {

using remat::testing::emulated_device;

void add_views_rows(std::vector<OpCase>& t) {
  t.push_back(view_case("reshape_2x3x4_to_6x4", {2, 3, 4}, [](const Tensor& x) { return x.reshape({6, 4}); },
                        [](const Array& x) { return ref::reshape(x, {6, 4}); }));
  t.push_back(view_case("reshape_infer", {2, 3, 4}, [](const Tensor& x) { return x.reshape({4, -1}); },
                        [](const Array& x) { return ref::reshape(x, {4, 6}); }));
  t.push_back(view_case("reshape_of_transposed_copies", {3, 4},
                        [](const Tensor& x) { return x.transpose(0, 1).reshape({2, 6}); },
                        [](const Array& x) { return ref::reshape(ref::permute(x, {1, 0}), {2, 6}); }));
  t.push_back(view_case("view_2x6", {3, 4}, [](const Tensor& x) { return x.view({2, 6}); },
                        [](const Array& x) { return ref::reshape(x, {2, 6}); }));
  t.push_back(view_case("flatten", {2, 3, 2}, [](const Tensor& x) { return x.flatten(); },
                        [](const Array& x) { return ref::reshape(x, {12}); }));
  t.push_back(view_case("permute_201", {2, 3, 4}, [](const Tensor& x) { return x.permute({2, 0, 1}); },
                        [](const Array& x) { return ref::permute(x, {2, 0, 1}); }));
  t.push_back(view_case("permute_negative_axes", {2, 3, 4}, [](const Tensor& x) { return x.permute({-1, -3, -2}); },
                        [](const Array& x) { return ref::permute(x, {2, 0, 1}); }));
  t.push_back(view_case("transpose_0_2", {2, 3, 4}, [](const Tensor& x) { return x.transpose(0, 2); },
                        [](const Array& x) { return ref::permute(x, {2, 1, 0}); }));
  t.push_back(view_case("transpose_m1_m2", {2, 3, 4}, [](const Tensor& x) { return x.transpose(-1, -2); },
                        [](const Array& x) { return ref::permute(x, {0, 2, 1}); }));
  t.push_back(view_case("slice_step2", {2, 5, 3}, [](const Tensor& x) { return x.slice(1, 0, 5, 2); },
                        [](const Array& x) { return ref::slice(x, 1, 0, 5, 2); }));
  t.push_back(view_case("slice_step3_offset", {7, 2}, [](const Tensor& x) { return x.slice(0, 1, 7, 3); },
                        [](const Array& x) { return ref::slice(x, 0, 1, 7, 3); }));
  t.push_back(view_case("slice_negative_bounds", {3, 5}, [](const Tensor& x) { return x.slice(-1, -4, -1); },
                        [](const Array& x) { return ref::slice(x, 1, 1, 4, 1); }));
  t.push_back(view_case("slice_clamped_stop", {4, 3}, [](const Tensor& x) { return x.slice(0, 2, 100); },
                        [](const Array& x) { return ref::slice(x, 0, 2, 4, 1); }));
  t.push_back(view_case("slice_of_slice", {6, 4}, [](const Tensor& x) { return x.slice(0, 1, 6, 2).slice(1, 1, 4, 2); },
                        [](const Array& x) { return ref::slice(ref::slice(x, 0, 1, 6, 2), 1, 1, 4, 2); }));
  t.push_back(view_case("expand_3x1_to_2x3x4", {3, 1}, [](const Tensor& x) { return x.expand({2, 3, 4}); },
                        [](const Array& x) { return ref::expand(x, {2, 3, 4}); }));
  t.push_back(view_case("expand_keep_minus1", {1, 3}, [](const Tensor& x) { return x.expand({4, -1}); },
                        [](const Array& x) { return ref::expand(x, {4, 3}); }));
  t.push_back(view_case("unsqueeze_0", {2, 3}, [](const Tensor& x) { return x.unsqueeze(0); },
                        [](const Array& x) { return ref::reshape(x, {1, 2, 3}); }));
  t.push_back(view_case("unsqueeze_m1", {2, 3}, [](const Tensor& x) { return x.unsqueeze(-1); },
                        [](const Array& x) { return ref::reshape(x, {2, 3, 1}); }));
  t.push_back(view_case("squeeze_1", {2, 1, 3}, [](const Tensor& x) { return x.squeeze(1); },
                        [](const Array& x) { return ref::reshape(x, {2, 3}); }));
  t.push_back(view_case("squeeze_of_transposed", {3, 1, 2}, [](const Tensor& x) { return x.transpose(0, 2).squeeze(1); },
                        [](const Array& x) { return ref::reshape(ref::permute(x, {2, 1, 0}), {2, 3}); }));
  t.push_back(view_case("contiguous_of_transposed", {3, 4}, [](const Tensor& x) { return x.transpose(0, 1).contiguous(); },
                        [](const Array& x) { return ref::permute(x, {1, 0}); }));
  t.push_back(view_case("contiguous_noop", {3, 4}, [](const Tensor& x) { return x.contiguous(); },
                        [](const Array& x) { return x; }));
  t.push_back(view_case("clone", {3, 4}, [](const Tensor& x) { return x.clone(); }, [](const Array& x) { return x; }));
  t.push_back(view_case("clone_of_slice", {3, 4}, [](const Tensor& x) { return x.slice(1, 1, 4, 2).clone(); },
                        [](const Array& x) { return ref::slice(x, 1, 1, 4, 2); }));
  t.push_back(view_case("to_other_dtype", {3, 4},
                        [](const Tensor& x) { return x.to(x.dtype() == DType::f32 ? DType::f64 : DType::f32); },
                        [](const Array& x) { return x; }));
  t.push_back(view_case("to_same_dtype", {3, 4}, [](const Tensor& x) { return x.to(x.dtype()); },
                        [](const Array& x) { return x; }));
  t.push_back(view_case("to_other_dtype_and_back_mul", {2, 3},
                        [](const Tensor& x) {
                          Tensor y = x.to(x.dtype() == DType::f32 ? DType::f64 : DType::f32);
                          return mul(y, y).to(x.dtype());
                        },
                        [](const Array& x) { return ref::map(x, [](double v) { return v * v; }); }));
  t.back().computes_in_f32 = true;
  // Tensor::to(Device): to the other device (the emulated one from the CPU, the CPU from it), an op
  // there, and back; the gradient crosses both ways.
  t.push_back(view_case("to_device_and_back_mul", {2, 3},
                        [](const Tensor& x) {
                          const Device other = x.device() == kCpu ? emulated_device() : kCpu;
                          Tensor y = x.to(other);
                          return mul(y, y).to(x.device());
                        },
                        [](const Array& x) { return ref::map(x, [](double v) { return v * v; }); }));

  // reshape of strided tensors that regroup without a copy (views with computed strides)
  t.push_back(view_case("reshape_strided_slice_view", {2, 3, 4}, [](const Tensor& x) { return x.slice(2, 0, 4, 2).reshape({12}); },
                        [](const Array& x) { return ref::reshape(ref::slice(x, 2, 0, 4, 2), {12}); }));
  t.push_back(view_case("reshape_split_last_axis_of_slice", {2, 3, 6},
                        [](const Tensor& x) { return x.slice(2, 2, 6).reshape({2, 3, 2, 2}).permute({0, 2, 1, 3}); },
                        [](const Array& x) { return ref::permute(ref::reshape(ref::slice(x, 2, 2, 6, 1), {2, 3, 2, 2}), {0, 2, 1, 3}); }));
}

}  // namespace remat::test
