// View ops (share storage) and copies: reshape/view, permute/transpose, slice, expand,
// squeeze/unsqueeze, contiguous, clone, dtype conversion. Backward formulas map the gradient
// back to the input's layout.
#include <algorithm>
#include <numeric>
#include <optional>

#include "autodiff/kernels.h"
#include "autodiff/op.h"

namespace remat {

using autodiff::BackwardContext;
using autodiff::OpSpec;

namespace {

Tensor make_view(const Tensor& x, Shape shape, Strides strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = x.storage();
  impl->offset = offset;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->dtype = x.dtype();
  return Tensor(std::move(impl));
}

int64_t norm_axis(int64_t axis, int64_t rank, const char* op, const Shape& shape) {
  int64_t a = axis < 0 ? axis + rank : axis;
  REMAT_CHECK(a >= 0 && a < rank, op, ": axis ", axis, " out of range for shape ", shape_str(shape));
  return a;
}

Shape infer_shape(const Shape& requested, int64_t numel, const Shape& from, const char* op) {
  REMAT_CHECK(static_cast<int>(requested.size()) <= kMaxRank, op, ": rank of ", shape_str(requested), " exceeds ",
              kMaxRank);
  Shape shape = requested;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      REMAT_CHECK(infer < 0, op, ": more than one -1 in shape ", shape_str(requested));
      infer = static_cast<int64_t>(i);
    } else {
      REMAT_CHECK(shape[i] >= 0, op, ": invalid dimension ", shape[i], " in shape ", shape_str(requested));
    }
  }
  if (infer >= 0) {
    Shape rest = shape;
    rest[infer] = 1;
    check_shape(rest, op);  // the known part alone must be a valid shape
    known = shape_numel(rest);
    REMAT_CHECK(known > 0 && numel % known == 0, op, ": cannot reshape ", shape_str(from), " into ",
                shape_str(requested));
    shape[infer] = numel / known;
  }
  check_shape(shape, op);
  REMAT_CHECK(shape_numel(shape) == numel, op, ": cannot reshape ", shape_str(from), " (", numel, " elements) into ",
              shape_str(requested));
  return shape;
}

const OpSpec kView{autodiff::OpKind::view, autodiff::save_nothing};
const OpSpec kPermute{autodiff::OpKind::permute, autodiff::save_nothing};
const OpSpec kSlice{autodiff::OpKind::slice, autodiff::save_nothing};
const OpSpec kExpand{autodiff::OpKind::expand, autodiff::save_nothing};
const OpSpec kContiguous{autodiff::OpKind::contiguous, autodiff::save_nothing};
const OpSpec kConvert{autodiff::OpKind::convert, autodiff::save_nothing};
const OpSpec kToDevice{autodiff::OpKind::to_device, autodiff::save_nothing};

}  // namespace

Tensor Tensor::view(const Shape& requested) const {
  Shape shape = infer_shape(requested, numel(), this->shape(), "view");
  REMAT_CHECK(is_contiguous(), "view: tensor of shape ", shape_str(this->shape()),
              " is not contiguous; use reshape() (which copies) or contiguous() first");
  return autodiff::apply1(
      kView, {*this},
      [shape](const TensorList& in) { return TensorList{make_view(in[0], shape, contiguous_strides(shape), in[0].offset())}; },
      [](BackwardContext& ctx) { ctx.set_input_grad(0, ctx.grad_output(0).reshape(ctx.input_meta(0).shape)); }, 0);
}

namespace {
// Strides under which a tensor of shape `from` / strides `strides` can be seen as `to` without a
// copy, if any: each run of input axes that are contiguous over each other (stride[i] ==
// stride[i+1] * size[i+1]) may be split or merged freely into output axes of the same total size;
// a copy is needed only when an output axis would span two such runs.
std::optional<Strides> view_strides(const Shape& from, const Strides& strides, const Shape& to) {
  if (shape_numel(from) == 0 || from.empty()) return contiguous_strides(to);
  Strides out(to.size(), 0);
  int64_t view_d = static_cast<int64_t>(to.size()) - 1;
  int64_t chunk_stride = strides.back();  // stride of the innermost axis of the current run
  int64_t run_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(from.size()) - 1; d >= 0; --d) {
    run_numel *= from[d];
    const bool run_ends = d == 0 || (from[d - 1] != 1 && strides[d - 1] != run_numel * chunk_stride);
    if (!run_ends) continue;
    while (view_d >= 0 && (view_numel < run_numel || to[view_d] == 1)) {
      out[view_d] = view_numel * chunk_stride;
      view_numel *= to[view_d];
      --view_d;
    }
    if (view_numel != run_numel) return std::nullopt;
    if (d > 0) {
      chunk_stride = strides[d - 1];
      run_numel = 1;
      view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}
}  // namespace

Tensor Tensor::reshape(const Shape& requested) const {
  Shape shape = infer_shape(requested, numel(), this->shape(), "reshape");
  if (shape == this->shape()) return *this;
  if (is_contiguous()) return view(shape);
  // A strided tensor whose axes can be regrouped (splitting the last axis of a slice, adding or
  // dropping size-1 axes, ...) is viewed, not copied.
  if (std::optional<Strides> strides = view_strides(this->shape(), this->strides(), shape)) {
    return autodiff::apply1(
        kView, {*this},
        [shape, st = *strides](const TensorList& in) { return TensorList{make_view(in[0], shape, st, in[0].offset())}; },
        [](BackwardContext& ctx) { ctx.set_input_grad(0, ctx.grad_output(0).reshape(ctx.input_meta(0).shape)); }, 0);
  }
  return contiguous().view(shape);
}

Tensor Tensor::permute(const std::vector<int64_t>& axes) const {
  int64_t rank = dim();
  REMAT_CHECK(static_cast<int64_t>(axes.size()) == rank, "permute: ", axes.size(), " axes given for shape ",
              shape_str(shape()));
  std::vector<int64_t> order;
  std::vector<bool> seen(static_cast<size_t>(rank), false);
  for (auto a : axes) {
    int64_t n = norm_axis(a, rank, "permute", shape());
    REMAT_CHECK(!seen[n], "permute: axis ", a, " repeated in the permutation");
    seen[n] = true;
    order.push_back(n);
  }
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) inverse[order[i]] = static_cast<int64_t>(i);
  return autodiff::apply1(
      kPermute, {*this},
      [order](const TensorList& in) {
        Shape s;
        Strides st;
        for (auto o : order) {
          s.push_back(in[0].shape()[o]);
          st.push_back(in[0].strides()[o]);
        }
        return TensorList{make_view(in[0], s, st, in[0].offset())};
      },
      [inverse](BackwardContext& ctx) { ctx.set_input_grad(0, ctx.grad_output(0).permute(inverse)); }, 0);
}

Tensor Tensor::transpose(int64_t axis0, int64_t axis1) const {
  int64_t rank = dim();
  int64_t a = norm_axis(axis0, rank, "transpose", shape()), b = norm_axis(axis1, rank, "transpose", shape());
  std::vector<int64_t> order(static_cast<size_t>(rank));
  std::iota(order.begin(), order.end(), 0);
  std::swap(order[a], order[b]);
  return permute(order);
}

Tensor Tensor::slice(int64_t axis, int64_t start, int64_t stop, int64_t step) const {
  int64_t rank = dim();
  int64_t a = norm_axis(axis, rank, "slice", shape());
  int64_t n = shape()[a];
  REMAT_CHECK(step >= 1, "slice: step must be positive, got ", step);
  // Python semantics: negative bounds count from the end, then clamp to [0, n]. No sum below can
  // overflow: n <= 2^60 and the bounds are clamped before any arithmetic that could.
  if (start < 0) start = start < -n ? 0 : start + n;
  if (stop < 0) stop = stop < -n ? 0 : stop + n;
  start = std::clamp<int64_t>(start, 0, n);
  stop = std::clamp<int64_t>(stop, start, n);
  const int64_t len = stop > start ? (stop - start - 1) / step + 1 : 0;
  return autodiff::apply1(
      kSlice, {*this},
      [a, start, step, len](const TensorList& in) {
        Shape s = in[0].shape();
        Strides st = in[0].strides();
        int64_t off = in[0].offset() + start * st[a];  // inside the viewed storage
        s[a] = len;
        if (len > 1) st[a] *= step;  // then step < n, and the stride stays inside the storage
        return TensorList{make_view(in[0], s, st, off)};
      },
      [a, start, stop, step](BackwardContext& ctx) {
        const auto& meta = ctx.input_meta(0);
        Tensor gx = zeros(meta.shape, meta.dtype, memory::Tag::other, meta.device);
        gx.slice(a, start, stop, step).copy_(ctx.grad_output(0));
        ctx.set_input_grad(0, gx);
      },
      0);
}

Tensor Tensor::expand(const Shape& target) const {
  REMAT_CHECK(target.size() >= shape().size(), "expand: cannot expand shape ", shape_str(shape()), " to the lower rank ",
              shape_str(target));
  REMAT_CHECK(static_cast<int>(target.size()) <= kMaxRank, "expand: rank of ", shape_str(target), " exceeds ",
              kMaxRank);
  size_t lead = target.size() - shape().size();
  Shape out = target;
  for (size_t i = 0; i < target.size(); ++i) {
    const int64_t t = target[i];
    // -1 keeps an existing axis's size; new leading axes need an explicit size
    REMAT_CHECK(t >= 0 || (t == -1 && i >= lead), "expand: invalid size ", t, " for axis ", i, " in ",
                shape_str(target), " (expanding shape ", shape_str(shape()), "; -1 keeps an existing axis only)");
    if (i < lead) continue;
    const int64_t d = shape()[i - lead];
    if (t == -1) out[i] = d;
    else
      REMAT_CHECK(d == t || d == 1, "expand: cannot expand shape ", shape_str(shape()), " to ", shape_str(target),
                  " (axis ", i, ")");
  }
  check_shape(out, "expand");
  if (out == shape()) return *this;
  return autodiff::apply1(
      kExpand, {*this},
      [out, lead](const TensorList& in) {
        Strides st(out.size(), 0);
        for (size_t i = 0; i < in[0].shape().size(); ++i)
          st[lead + i] = in[0].shape()[i] == 1 && out[lead + i] != 1 ? 0 : in[0].strides()[i];
        return TensorList{make_view(in[0], out, st, in[0].offset())};
      },
      [](BackwardContext& ctx) { ctx.set_input_grad(0, sum_to(ctx.grad_output(0), ctx.input_meta(0).shape)); }, 0);
}

Tensor Tensor::unsqueeze(int64_t axis) const {
  int64_t rank = dim() + 1;
  int64_t a = norm_axis(axis, rank, "unsqueeze", shape());
  Shape s = shape();
  s.insert(s.begin() + a, 1);
  return reshape(s);
}

Tensor Tensor::squeeze(int64_t axis) const {
  int64_t a = norm_axis(axis, dim(), "squeeze", shape());
  REMAT_CHECK(shape()[a] == 1, "squeeze: axis ", axis, " of shape ", shape_str(shape()), " has size ", shape()[a], ", not 1");
  Shape s = shape();
  s.erase(s.begin() + a);
  return reshape(s);
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  return autodiff::apply1(
      kContiguous, {*this}, [](const TensorList& in) { return TensorList{kernels::copy(in[0])}; },
      [](BackwardContext& ctx) { ctx.set_input_grad(0, ctx.grad_output(0)); }, 0);
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == this->dtype()) return *this;
  if (!is_floating(dtype) || !is_floating(this->dtype())) {
    // index conversions carry no gradient
    return kernels::convert(*this, dtype);
  }
  return autodiff::apply1(
      kConvert, {*this}, [dtype](const TensorList& in) { return TensorList{kernels::convert(in[0], dtype)}; },
      [](BackwardContext& ctx) { ctx.set_input_grad(0, kernels::convert(ctx.grad_output(0), ctx.input_meta(0).dtype)); },
      0);
}

namespace {
// A contiguous copy of x on `device` (the kernel of Tensor::to(Device)).
Tensor copy_to_device(const Tensor& x, Device device) {
  Tensor out = kernels::empty(x.shape(), x.dtype(), device);
  copy_between_devices(x, out);
  return out;
}
}  // namespace

Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  backend(device);  // a device without a backend is an error before anything is recorded
  if (!is_floating(dtype())) return copy_to_device(*this, device);  // index tensors carry no gradient
  return autodiff::apply1(
      kToDevice, {*this}, [device](const TensorList& in) { return TensorList{copy_to_device(in[0], device)}; },
      [](BackwardContext& ctx) { ctx.set_input_grad(0, copy_to_device(ctx.grad_output(0), ctx.input_meta(0).device)); },
      0);
}

}  // namespace remat
