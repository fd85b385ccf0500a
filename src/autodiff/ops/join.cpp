// Joining and splitting along an axis. concat copies its inputs into slices of one new tensor;
// its backward hands each input the matching slice (a view) of the output gradient. split
// returns slice views of its input, so its gradient is that of slice().
#include "autodiff/kernels.h"
#include "autodiff/op.h"

namespace remat {

using autodiff::BackwardContext;
using autodiff::OpSpec;

namespace {

const OpSpec kConcat{autodiff::OpKind::concat, autodiff::save_nothing};
const OpSpec kSplit{autodiff::OpKind::split, autodiff::save_nothing};

}  // namespace

Tensor concat(const TensorList& tensors, int64_t axis) {
  REMAT_CHECK(!tensors.empty(), "concat: no tensors given");
  for (size_t i = 0; i < tensors.size(); ++i) REMAT_CHECK(tensors[i].defined(), "concat: tensor ", i, " is undefined");
  const Tensor& first = tensors[0];
  const int64_t rank = first.dim();
  REMAT_CHECK(rank >= 1, "concat: cannot concatenate tensors of rank 0 (tensor 0 has shape ", shape_str(first.shape()),
              ")");
  const int64_t a = axis < 0 ? axis + rank : axis;
  REMAT_CHECK(a >= 0 && a < rank, "concat: axis ", axis, " out of range for shape ", shape_str(first.shape()));
  std::vector<int64_t> offsets;  // start of each input along the axis
  Shape out_shape = first.shape();
  out_shape[a] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    REMAT_CHECK(t.dtype() == first.dtype(), "concat: tensor ", i, " has dtype ", dtype_name(t.dtype()),
                ", tensor 0 has ", dtype_name(first.dtype()));
    REMAT_CHECK(t.device() == first.device(), "concat: tensor ", i, " is on ", device_name(t.device()),
                ", tensor 0 on ", device_name(first.device()));
    bool same = t.dim() == rank;
    for (int64_t d = 0; same && d < rank; ++d) same = d == a || t.shape()[d] == first.shape()[d];
    REMAT_CHECK(same, "concat: tensor ", i, " of shape ", shape_str(t.shape()), " does not match tensor 0 of shape ",
                shape_str(first.shape()), " outside axis ", a);
    offsets.push_back(out_shape[a]);
    out_shape[a] = checked_add(out_shape[a], t.shape()[a], [&] { return detail::concat("concat: the size of axis ", a); });
  }
  check_shape(out_shape, "concat");

  return autodiff::apply1(
      kConcat, tensors,
      [out_shape, offsets, a](const TensorList& in) {
        Tensor out = kernels::empty(out_shape, in[0].dtype(), in[0].device());
        Backend& b = kernels::backend_of(out);
        for (size_t i = 0; i < in.size(); ++i) {
          const int64_t len = in[i].shape()[a];
          if (len > 0) b.copy(in[i], out.slice(a, offsets[i], offsets[i] + len));
        }
        return TensorList{out};
      },
      [offsets, a](BackwardContext& ctx) {
        Tensor g = ctx.grad_output(0);
        for (size_t i = 0; i < ctx.num_inputs(); ++i) {
          if (!ctx.needs_input_grad(i)) continue;
          const int64_t len = ctx.input_meta(i).shape[a];
          ctx.set_input_grad(i, g.slice(a, offsets[i], offsets[i] + len));
        }
      },
      0);
}

TensorList split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis) {
  REMAT_CHECK(x.defined(), "split: input is undefined");
  const int64_t rank = x.dim();
  REMAT_CHECK(rank >= 1, "split: cannot split a tensor of rank 0");
  const int64_t a = axis < 0 ? axis + rank : axis;
  REMAT_CHECK(a >= 0 && a < rank, "split: axis ", axis, " out of range for shape ", shape_str(x.shape()));
  int64_t total = 0;
  std::string listed;
  for (size_t i = 0; i < sizes.size(); ++i) {
    listed += (i ? ", " : "") + std::to_string(sizes[i]);
    REMAT_CHECK(sizes[i] >= 0, "split: negative size ", sizes[i], " at position ", i);
    total = checked_add(total, sizes[i], [&] { return detail::concat("split: the sum of sizes [", listed, "...]"); });
  }
  REMAT_CHECK(total == x.shape()[a], "split: sizes [", listed, "] sum to ", total, ", but axis ", a, " of shape ",
              shape_str(x.shape()), " has size ", x.shape()[a]);
  REMAT_CHECK(!sizes.empty(), "split: no sizes given for axis ", a, " of shape ", shape_str(x.shape()));
  // One op with several outputs (views of x). Its backward writes every part's gradient into one
  // buffer of x's shape (zeros for parts that got none): O(numel), not one full buffer per part.
  return autodiff::apply(
      kSplit, {x},
      [a, sizes](const TensorList& in) {
        TensorList parts;
        int64_t start = 0;
        for (int64_t s : sizes) {
          parts.push_back(in[0].detach().slice(a, start, start + s));
          start += s;
        }
        return parts;
      },
      [a, sizes](autodiff::BackwardContext& ctx) {
        const auto& meta = ctx.input_meta(0);
        Tensor gx = Tensor::empty(meta.shape, meta.dtype, memory::Tag::other, meta.device);
        int64_t start = 0;
        for (size_t i = 0; i < sizes.size(); ++i) {
          Tensor part = gx.slice(a, start, start + sizes[i]);
          if (ctx.has_grad_output(i))
            part.copy_(ctx.grad_output(i));
          else
            part.fill_(0.0);
          start += sizes[i];
        }
        ctx.set_input_grad(0, gx);
      },
      0);
}

}  // namespace remat
