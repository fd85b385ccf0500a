// tests/op_reference.h - the float64 references of the op tests: plain arrays of doubles, index
// helpers, and each op written as plain loops (namespace remat::test::ref), independently of
// remat's kernels and of its broadcasting and view code. Only remat's Shape and its RNG words
// (philox_word, uniform_double, uniform_float, for the dropout mask) are used.
//
//   using namespace remat::test;
//   Array x{{2, 3}, {1, 2, 3, 4, 5, 6}};
//   Array y = ref::softmax(x, -1, /*log=*/false);   // rows of x, normalised
//   Array s = ref::reduce(x, {0}, false, ref::Reduce::sum);   // {5, 7, 9}
//
// The table-driven harness (op_harness.h) checks remat's ops against these; the references of the
// convolution family are in op_reference_conv.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "remat/random.h"
#include "remat/tensor.h"

namespace remat::test {

// ============================================================================================
// Plain float64 arrays and index helpers for the references (independent of remat's code).
// ============================================================================================

struct Array {
  Shape shape;
  std::vector<double> v;
};

inline int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

inline std::string shape_text(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

inline std::vector<int64_t> unravel(int64_t flat, const Shape& s) {
  std::vector<int64_t> idx(s.size(), 0);
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] == 0) continue;
    idx[i] = flat % s[i];
    flat /= s[i];
  }
  return idx;
}

inline int64_t ravel(const std::vector<int64_t>& idx, const Shape& s) {
  int64_t flat = 0;
  for (size_t i = 0; i < s.size(); ++i) flat = flat * s[i] + idx[i];
  return flat;
}

inline Array make_array(Shape shape, double fill = 0.0) {
  Array a;
  a.v.assign(static_cast<size_t>(numel_of(shape)), fill);
  a.shape = std::move(shape);
  return a;
}

// NumPy broadcasting of shapes (reference version, written independently of remat's).
inline Shape ref_broadcast(const Shape& a, const Shape& b) {
  size_t rank = std::max(a.size(), b.size());
  Shape out(rank, 1);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i + a.size() >= rank ? a[i + a.size() - rank] : 1;
    int64_t db = i + b.size() >= rank ? b[i + b.size() - rank] : 1;
    if (da != db && da != 1 && db != 1) throw std::logic_error("reference: shapes do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Flat index into an array of shape `in` for a multi-index of the (larger) broadcast shape.
inline int64_t bcast_index(const Shape& in, const std::vector<int64_t>& out_idx) {
  size_t lead = out_idx.size() - in.size();
  int64_t flat = 0;
  for (size_t i = 0; i < in.size(); ++i) flat = flat * in[i] + (in[i] == 1 ? 0 : out_idx[lead + i]);
  return flat;
}

inline int64_t norm_axis(int64_t axis, size_t rank) { return axis < 0 ? axis + static_cast<int64_t>(rank) : axis; }

// ============================================================================================
// Reference implementations (float64, plain loops).
// ============================================================================================
namespace ref {

template <class F>
Array map(const Array& x, F f) {
  Array y = x;
  for (auto& v : y.v) v = f(v);
  return y;
}

template <class F>
Array binary(const Array& a, const Array& b, F f) {
  Array out = make_array(ref_broadcast(a.shape, b.shape));
  for (int64_t i = 0; i < numel_of(out.shape); ++i) {
    auto idx = unravel(i, out.shape);
    out.v[i] = f(a.v[bcast_index(a.shape, idx)], b.v[bcast_index(b.shape, idx)]);
  }
  return out;
}

inline Array where(const Array& c, const Array& a, const Array& b) {
  Array out = make_array(ref_broadcast(ref_broadcast(c.shape, a.shape), b.shape));
  for (int64_t i = 0; i < numel_of(out.shape); ++i) {
    auto idx = unravel(i, out.shape);
    out.v[i] = c.v[bcast_index(c.shape, idx)] != 0.0 ? a.v[bcast_index(a.shape, idx)] : b.v[bcast_index(b.shape, idx)];
  }
  return out;
}

// Broadcasting copy of x to `shape` (the value of expand).
inline Array expand(const Array& x, const Shape& shape) {
  Array out = make_array(shape);
  for (int64_t i = 0; i < numel_of(shape); ++i) out.v[i] = x.v[bcast_index(x.shape, unravel(i, shape))];
  return out;
}

enum class Reduce { sum, mean, max, argmax };

inline Array reduce(const Array& x, std::vector<int64_t> axes, bool keepdim, Reduce op) {
  const size_t rank = x.shape.size();
  std::vector<bool> red(rank, axes.empty());
  for (auto a : axes) red[static_cast<size_t>(norm_axis(a, rank))] = true;
  Shape kshape = x.shape, oshape;
  int64_t count = 1;
  for (size_t i = 0; i < rank; ++i) {
    if (red[i]) {
      count *= x.shape[i];
      kshape[i] = 1;
      if (keepdim) oshape.push_back(1);
    } else {
      oshape.push_back(x.shape[i]);
    }
  }
  Array acc = make_array(kshape, op == Reduce::sum || op == Reduce::mean ? 0.0 : -std::numeric_limits<double>::infinity());
  Array arg = make_array(kshape, 0.0);
  for (int64_t i = 0; i < numel_of(x.shape); ++i) {
    auto idx = unravel(i, x.shape);
    int64_t along = 0;
    for (size_t d = 0; d < rank; ++d)
      if (red[d]) along = idx[d];  // argmax reduces one axis
    for (size_t d = 0; d < rank; ++d)
      if (red[d]) idx[d] = 0;
    int64_t o = ravel(idx, kshape);
    if (op == Reduce::sum || op == Reduce::mean) {
      acc.v[o] += x.v[i];
    } else if (x.v[i] > acc.v[o]) {
      acc.v[o] = x.v[i];
      arg.v[o] = static_cast<double>(along);
    }
  }
  if (op == Reduce::mean)
    for (auto& v : acc.v) v /= static_cast<double>(count);
  Array out = op == Reduce::argmax ? arg : acc;
  out.shape = oshape;
  return out;
}

// a [..., m, k] (or [..., k, m] with ta) @ b [..., k, n] (or [..., n, k] with tb), batch broadcast.
inline Array matmul(const Array& a, const Array& b, bool ta, bool tb) {
  const size_t ra = a.shape.size(), rb = b.shape.size();
  int64_t a0 = a.shape[ra - 2], a1 = a.shape[ra - 1], b0 = b.shape[rb - 2], b1 = b.shape[rb - 1];
  int64_t m = ta ? a1 : a0, k = ta ? a0 : a1, n = tb ? b0 : b1;
  if ((tb ? b1 : b0) != k) throw std::logic_error("reference matmul: inner dimensions differ");
  Shape abatch(a.shape.begin(), a.shape.end() - 2), bbatch(b.shape.begin(), b.shape.end() - 2);
  Shape batch = ref_broadcast(abatch, bbatch);
  Shape oshape = batch;
  oshape.push_back(m);
  oshape.push_back(n);
  Array out = make_array(oshape);
  for (int64_t bi = 0; bi < numel_of(batch); ++bi) {
    auto bidx = unravel(bi, batch);
    int64_t abase = bcast_index(abatch, bidx) * a0 * a1, bbase = bcast_index(bbatch, bidx) * b0 * b1;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) {
          double av = ta ? a.v[abase + p * a1 + i] : a.v[abase + i * a1 + p];
          double bv = tb ? b.v[bbase + j * b1 + p] : b.v[bbase + p * b1 + j];
          s += av * bv;
        }
        out.v[(bi * m + i) * n + j] = s;
      }
  }
  return out;
}

// Splits a shape around `axis` into outer * n * inner.
struct AxisSplit {
  int64_t outer = 1, n = 1, inner = 1;
};
inline AxisSplit axis_split(const Shape& s, int64_t axis) {
  AxisSplit r;
  axis = norm_axis(axis, s.size());
  for (int64_t i = 0; i < static_cast<int64_t>(s.size()); ++i) {
    if (i < axis) r.outer *= s[i];
    else if (i == axis) r.n = s[i];
    else r.inner *= s[i];
  }
  return r;
}

inline Array softmax(const Array& x, int64_t axis, bool log) {
  Array y = x;
  AxisSplit sp = axis_split(x.shape, axis);
  for (int64_t o = 0; o < sp.outer; ++o)
    for (int64_t j = 0; j < sp.inner; ++j) {
      auto at = [&](int64_t i) { return (o * sp.n + i) * sp.inner + j; };
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t i = 0; i < sp.n; ++i) mx = std::max(mx, x.v[at(i)]);
      double s = 0;
      for (int64_t i = 0; i < sp.n; ++i) s += std::exp(x.v[at(i)] - mx);
      for (int64_t i = 0; i < sp.n; ++i)
        y.v[at(i)] = log ? x.v[at(i)] - mx - std::log(s) : std::exp(x.v[at(i)] - mx) / s;
    }
  return y;
}

// Over the last axis; weight/bias may be null.
inline Array layer_norm(const Array& x, const Array* w, const Array* b, double eps) {
  Array y = x;
  int64_t c = x.shape.back(), rows = numel_of(x.shape) / c;
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < c; ++i) mean += x.v[r * c + i];
    mean /= static_cast<double>(c);
    for (int64_t i = 0; i < c; ++i) var += (x.v[r * c + i] - mean) * (x.v[r * c + i] - mean);
    var /= static_cast<double>(c);
    double rstd = 1.0 / std::sqrt(var + eps);
    for (int64_t i = 0; i < c; ++i) {
      double v = (x.v[r * c + i] - mean) * rstd;
      if (w) v *= w->v[i];
      if (b) v += b->v[i];
      y.v[r * c + i] = v;
    }
  }
  return y;
}

inline Array rms_norm(const Array& x, const Array* w, double eps) {
  Array y = x;
  int64_t c = x.shape.back(), rows = numel_of(x.shape) / c;
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t i = 0; i < c; ++i) ms += x.v[r * c + i] * x.v[r * c + i];
    double rstd = 1.0 / std::sqrt(ms / static_cast<double>(c) + eps);
    for (int64_t i = 0; i < c; ++i) y.v[r * c + i] = x.v[r * c + i] * rstd * (w ? w->v[i] : 1.0);
  }
  return y;
}

inline Array embedding(const Array& table, const Array& ids) {
  int64_t d = table.shape[1];
  Shape oshape = ids.shape;
  oshape.push_back(d);
  Array out = make_array(oshape);
  for (size_t i = 0; i < ids.v.size(); ++i)
    for (int64_t j = 0; j < d; ++j) out.v[i * d + j] = table.v[static_cast<int64_t>(ids.v[i]) * d + j];
  return out;
}

// Mean over non-ignored rows of (1 - eps) * -logp[target] + eps * mean_c(-logp[c]).
inline Array cross_entropy(const Array& logits, const Array& targets, double smoothing, int64_t ignore_index) {
  Array logp = softmax(logits, -1, true);
  int64_t n = logits.shape[0], c = logits.shape[1];
  double total = 0;
  int64_t counted = 0;
  for (int64_t r = 0; r < n; ++r) {
    auto t = static_cast<int64_t>(targets.v[r]);
    if (t == ignore_index) continue;
    double uniform = 0;
    for (int64_t j = 0; j < c; ++j) uniform -= logp.v[r * c + j];
    total += (1.0 - smoothing) * -logp.v[r * c + t] + smoothing * uniform / static_cast<double>(c);
    ++counted;
  }
  Array out = make_array({});
  out.v[0] = total / static_cast<double>(counted);
  return out;
}

// Element i (row-major) is kept iff uniform(philox word i of `state`) >= p. The f32 kernel may
// convert the word with uniform_float and the f64 one with uniform_double; the cases are built
// so that both conversions give the same mask (see dropout_mask_is_unambiguous).
inline std::vector<bool> dropout_mask(int64_t n, double p, RngState state) {
  std::vector<bool> keep(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) keep[i] = uniform_double(philox_word(state, static_cast<uint64_t>(i))) >= p;
  return keep;
}
inline bool dropout_mask_is_unambiguous(int64_t n, double p, RngState state) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t w = philox_word(state, static_cast<uint64_t>(i));
    if ((uniform_double(w) >= p) != (uniform_float(w) >= static_cast<float>(p))) return false;
  }
  return true;
}
inline Array dropout(const Array& x, double p, RngState state) {
  Array y = x;
  auto keep = dropout_mask(numel_of(x.shape), p, state);
  for (size_t i = 0; i < y.v.size(); ++i) y.v[i] = keep[i] ? x.v[i] / (1.0 - p) : 0.0;
  return y;
}

inline Array concat(const std::vector<Array>& xs, int64_t axis) {
  axis = norm_axis(axis, xs[0].shape.size());
  Shape oshape = xs[0].shape;
  oshape[axis] = 0;
  for (auto& x : xs) oshape[axis] += x.shape[axis];
  Array out = make_array(oshape);
  int64_t base = 0;
  for (auto& x : xs) {
    for (int64_t i = 0; i < numel_of(x.shape); ++i) {
      auto idx = unravel(i, x.shape);
      idx[axis] += base;
      out.v[ravel(idx, oshape)] = x.v[i];
    }
    base += x.shape[axis];
  }
  return out;
}

inline std::vector<Array> split(const Array& x, const std::vector<int64_t>& sizes, int64_t axis) {
  axis = norm_axis(axis, x.shape.size());
  std::vector<Array> outs;
  int64_t base = 0;
  for (auto size : sizes) {
    Shape s = x.shape;
    s[axis] = size;
    Array out = make_array(s);
    for (int64_t i = 0; i < numel_of(s); ++i) {
      auto idx = unravel(i, s);
      idx[axis] += base;
      out.v[i] = x.v[ravel(idx, x.shape)];
    }
    outs.push_back(out);
    base += size;
  }
  return outs;
}

inline Array reshape(const Array& x, const Shape& shape) {
  Array y = x;
  y.shape = shape;
  return y;
}

inline Array permute(const Array& x, const std::vector<int64_t>& axes) {
  Shape oshape;
  for (auto a : axes) oshape.push_back(x.shape[a]);
  Array out = make_array(oshape);
  for (int64_t i = 0; i < numel_of(oshape); ++i) {
    auto oidx = unravel(i, oshape);
    std::vector<int64_t> idx(x.shape.size());
    for (size_t d = 0; d < axes.size(); ++d) idx[axes[d]] = oidx[d];
    out.v[i] = x.v[ravel(idx, x.shape)];
  }
  return out;
}

inline Array slice(const Array& x, int64_t axis, int64_t start, int64_t stop, int64_t step) {
  axis = norm_axis(axis, x.shape.size());
  int64_t n = x.shape[axis];
  if (start < 0) start += n;
  if (stop < 0) stop += n;
  start = std::clamp<int64_t>(start, 0, n);
  stop = std::clamp<int64_t>(stop, start, n);
  Shape oshape = x.shape;
  oshape[axis] = (stop - start + step - 1) / step;
  Array out = make_array(oshape);
  for (int64_t i = 0; i < numel_of(oshape); ++i) {
    auto idx = unravel(i, oshape);
    idx[axis] = start + idx[axis] * step;
    out.v[i] = x.v[ravel(idx, x.shape)];
  }
  return out;
}

}  // namespace ref

}  // namespace remat::test
