// Embedding lookup: table [V, D] gathered by i64 ids of any shape S -> [S..., D]. The gradient
// goes to the table only (a deterministic scatter-add of the output gradient rows); the backward
// keeps the ids, never the table or the output.
#include "autodiff/kernels.h"
#include "autodiff/op.h"

namespace remat {

using autodiff::BackwardContext;
using autodiff::OpSpec;

namespace {

const OpSpec kEmbedding{autodiff::OpKind::embedding, autodiff::save_inputs, 0, 0b10};  // keeps the ids only


// Checks every id against the table size before anything is allocated (CPU ids; ids on another
// device are checked by that backend's kernel).
void check_ids(const Tensor& ids, int64_t rows) {
  if (ids.device().type != DeviceType::cpu || ids.numel() == 0) return;
  auto check = [&](int64_t id, int64_t position) {
    REMAT_CHECK(id >= 0 && id < rows, "embedding: id ", id, " at position ", position,
                " is out of range for a table of ", rows, " rows (ids of shape ", shape_str(ids.shape()), ")");
  };
  if (ids.is_contiguous()) {
    const int64_t* p = ids.data<int64_t>();
    for (int64_t i = 0, n = ids.numel(); i < n; ++i) check(p[i], i);
  } else {
    std::vector<double> values = ids.to_vector();
    for (size_t i = 0; i < values.size(); ++i) check(static_cast<int64_t>(values[i]), static_cast<int64_t>(i));
  }
}

}  // namespace

Tensor embedding(const Tensor& table, const Tensor& ids) {
  REMAT_CHECK(table.defined() && ids.defined(), "embedding: input is undefined");
  REMAT_CHECK(is_floating(table.dtype()) && table.dim() == 2, "embedding: table must be a 2-D floating tensor [V, D], got ",
              dtype_name(table.dtype()), " of shape ", shape_str(table.shape()));
  REMAT_CHECK(ids.dtype() == DType::i64, "embedding: ids must be i64, got ", dtype_name(ids.dtype()), " of shape ",
              shape_str(ids.shape()));
  REMAT_CHECK(table.device() == ids.device(), "embedding: table is on ", device_name(table.device()), ", ids on ",
              device_name(ids.device()));
  REMAT_CHECK(ids.dim() + 1 <= kMaxRank, "embedding: ids of shape ", shape_str(ids.shape()),
              " give an output rank above ", kMaxRank);
  const int64_t rows = table.size(0), dim = table.size(1);
  check_ids(ids, rows);
  Shape out_shape = ids.shape();
  out_shape.push_back(dim);
  check_shape(out_shape, "embedding");

  return autodiff::apply1(
      kEmbedding, {table, ids},
      [out_shape](const TensorList& in) {
        Tensor out = kernels::empty(out_shape, in[0].dtype(), in[0].device());
        kernels::backend_of(out).embedding(in[0], in[1], out);
        return TensorList{out};
      },
      [rows, dim](BackwardContext& ctx) {
        if (!ctx.needs_input_grad(0)) return;
        const auto& meta = ctx.input_meta(0);
        Tensor gtable = kernels::empty({rows, dim}, meta.dtype, meta.device);
        Backend& b = kernels::backend_of(gtable);
        b.fill(gtable, 0.0);
        b.embedding_backward(ctx.input(1), kernels::contiguous(ctx.grad_output(0)), gtable);
        ctx.set_input_grad(0, gtable);
      });
}

}  // namespace remat
