// tests/op_reference_conv.h - float64 plain-loop references for the ops of issue 17 (convolution,
// pooling, batch normalisation, diagonal, general einsum), in the ref namespace of op_reference.h.
// Written from the definitions (each output element as a loop over its window or its indices),
// independently of remat's kernels; the rows that use them are in tests/op_rows/ (conv, pool,
// batch_norm, diagonal, einsum).
#pragma once

#include <map>
#include <string>

#include "op_reference.h"
#include "remat/ops.h"

namespace remat::test::ref {

// Output length of a window sliding along an axis (floor; ceil_mode drops a last window that
// starts in the right padding).
inline int64_t window_count(int64_t len, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  const int64_t span = len + 2 * p - d * (k - 1) - 1;
  int64_t out = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
  if (ceil_mode && (out - 1) * s >= len + p) --out;
  return out;
}

// x [N, C, H, W], w [O, C / g, KH, KW], b [O] or null.
inline Array conv2d(const Array& x, const Array& w, const Array* b, Size2 s, Size2 p, Size2 d, int64_t groups) {
  const int64_t n = x.shape[0], c = x.shape[1], h = x.shape[2], wd = x.shape[3];
  const int64_t o = w.shape[0], cg = w.shape[1], kh = w.shape[2], kw = w.shape[3], og = o / groups;
  const int64_t oh = window_count(h, kh, s[0], p[0], d[0], false), ow = window_count(wd, kw, s[1], p[1], d[1], false);
  Array y = make_array({n, o, oh, ow});
  for (int64_t in = 0; in < n; ++in)
    for (int64_t io = 0; io < o; ++io)
      for (int64_t y0 = 0; y0 < oh; ++y0)
        for (int64_t x0 = 0; x0 < ow; ++x0) {
          double acc = b ? b->v[io] : 0.0;
          const int64_t grp = io / og;
          for (int64_t ic = 0; ic < cg; ++ic)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t yy = y0 * s[0] - p[0] + i * d[0], xx = x0 * s[1] - p[1] + j * d[1];
                if (yy < 0 || yy >= h || xx < 0 || xx >= wd) continue;
                acc += x.v[((in * c + grp * cg + ic) * h + yy) * wd + xx] * w.v[((io * cg + ic) * kh + i) * kw + j];
              }
          y.v[((in * o + io) * oh + y0) * ow + x0] = acc;
        }
  return y;
}

inline Array max_pool2d(const Array& x, Size2 k, Size2 s, Size2 p, Size2 d, bool ceil_mode) {
  const int64_t n = x.shape[0], c = x.shape[1], h = x.shape[2], w = x.shape[3];
  const int64_t oh = window_count(h, k[0], s[0], p[0], d[0], ceil_mode);
  const int64_t ow = window_count(w, k[1], s[1], p[1], d[1], ceil_mode);
  Array y = make_array({n, c, oh, ow});
  for (int64_t plane = 0; plane < n * c; ++plane)
    for (int64_t y0 = 0; y0 < oh; ++y0)
      for (int64_t x0 = 0; x0 < ow; ++x0) {
        double best = -std::numeric_limits<double>::infinity();
        for (int64_t i = 0; i < k[0]; ++i)
          for (int64_t j = 0; j < k[1]; ++j) {
            const int64_t yy = y0 * s[0] - p[0] + i * d[0], xx = x0 * s[1] - p[1] + j * d[1];
            if (yy >= 0 && yy < h && xx >= 0 && xx < w) best = std::max(best, x.v[(plane * h + yy) * w + xx]);
          }
        y.v[(plane * oh + y0) * ow + x0] = best;
      }
  return y;
}

inline Array avg_pool2d(const Array& x, Size2 k, Size2 s, Size2 p, bool ceil_mode, bool count_include_pad) {
  const int64_t n = x.shape[0], c = x.shape[1], h = x.shape[2], w = x.shape[3];
  const int64_t oh = window_count(h, k[0], s[0], p[0], 1, ceil_mode);
  const int64_t ow = window_count(w, k[1], s[1], p[1], 1, ceil_mode);
  Array y = make_array({n, c, oh, ow});
  for (int64_t plane = 0; plane < n * c; ++plane)
    for (int64_t y0 = 0; y0 < oh; ++y0)
      for (int64_t x0 = 0; x0 < ow; ++x0) {
        double total = 0;
        int64_t inside = 0, padded = 0;
        for (int64_t i = 0; i < k[0]; ++i)
          for (int64_t j = 0; j < k[1]; ++j) {
            const int64_t yy = y0 * s[0] - p[0] + i, xx = x0 * s[1] - p[1] + j;
            // positions in the padded input (not beyond it) count with count_include_pad
            if (yy < h + p[0] && xx < w + p[1]) ++padded;
            if (yy >= 0 && yy < h && xx >= 0 && xx < w) {
              total += x.v[(plane * h + yy) * w + xx];
              ++inside;
            }
          }
        y.v[(plane * oh + y0) * ow + x0] = total / static_cast<double>(count_include_pad ? padded : inside);
      }
  return y;
}

inline Array adaptive_avg_pool2d(const Array& x, Size2 out) {
  const int64_t n = x.shape[0], c = x.shape[1], h = x.shape[2], w = x.shape[3];
  Array y = make_array({n, c, out[0], out[1]});
  for (int64_t plane = 0; plane < n * c; ++plane)
    for (int64_t y0 = 0; y0 < out[0]; ++y0)
      for (int64_t x0 = 0; x0 < out[1]; ++x0) {
        // bin [floor(i L / n), ceil((i + 1) L / n))
        const int64_t h0 = static_cast<int64_t>(std::floor(static_cast<double>(y0 * h) / static_cast<double>(out[0])));
        const int64_t h1 = static_cast<int64_t>(std::ceil(static_cast<double>((y0 + 1) * h) / static_cast<double>(out[0])));
        const int64_t w0 = static_cast<int64_t>(std::floor(static_cast<double>(x0 * w) / static_cast<double>(out[1])));
        const int64_t w1 = static_cast<int64_t>(std::ceil(static_cast<double>((x0 + 1) * w) / static_cast<double>(out[1])));
        double total = 0;
        for (int64_t yy = h0; yy < h1; ++yy)
          for (int64_t xx = w0; xx < w1; ++xx) total += x.v[(plane * h + yy) * w + xx];
        y.v[(plane * out[0] + y0) * out[1] + x0] = total / static_cast<double>((h1 - h0) * (w1 - w0));
      }
  return y;
}

// Per-channel (axis 1) statistics of x [N, C, ...]: mean and biased variance.
inline void channel_statistics(const Array& x, std::vector<double>& mean, std::vector<double>& var) {
  const int64_t n = x.shape[0], c = x.shape[1], s = numel_of(x.shape) / (n * c);
  mean.assign(static_cast<size_t>(c), 0.0);
  var.assign(static_cast<size_t>(c), 0.0);
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < s; ++j) mean[ch] += x.v[(i * c + ch) * s + j];
    mean[ch] /= static_cast<double>(n * s);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < s; ++j) {
        const double dev = x.v[(i * c + ch) * s + j] - mean[ch];
        var[ch] += dev * dev;
      }
    var[ch] /= static_cast<double>(n * s);
  }
}

// y = (x - mean) / sqrt(var + eps) * w + b with the given per-channel mean and var.
inline Array batch_norm_with(const Array& x, const std::vector<double>& mean, const std::vector<double>& var,
                             const Array* w, const Array* b, double eps) {
  const int64_t n = x.shape[0], c = x.shape[1], s = numel_of(x.shape) / (n * c);
  Array y = x;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t j = 0; j < s; ++j) {
        double v = (x.v[(i * c + ch) * s + j] - mean[ch]) / std::sqrt(var[ch] + eps);
        if (w) v *= w->v[ch];
        if (b) v += b->v[ch];
        y.v[(i * c + ch) * s + j] = v;
      }
  return y;
}

inline Array batch_norm_train(const Array& x, const Array* w, const Array* b, double eps) {
  std::vector<double> mean, var;
  channel_statistics(x, mean, var);
  return batch_norm_with(x, mean, var, w, b, eps);
}

// x with axes a and b replaced by a last axis along their diagonal.
inline Array diagonal(const Array& x, int64_t a, int64_t b) {
  const size_t rank = x.shape.size();
  a = norm_axis(a, rank);
  b = norm_axis(b, rank);
  Shape oshape;
  for (size_t i = 0; i < rank; ++i)
    if (static_cast<int64_t>(i) != a && static_cast<int64_t>(i) != b) oshape.push_back(x.shape[i]);
  oshape.push_back(std::min(x.shape[a], x.shape[b]));
  Array y = make_array(oshape);
  for (int64_t i = 0; i < numel_of(oshape); ++i) {
    auto oidx = unravel(i, oshape);
    std::vector<int64_t> idx(rank);
    size_t k = 0;
    for (size_t d = 0; d < rank; ++d)
      if (static_cast<int64_t>(d) != a && static_cast<int64_t>(d) != b) idx[d] = oidx[k++];
    idx[a] = idx[b] = oidx.back();
    y.v[i] = x.v[ravel(idx, x.shape)];
  }
  return y;
}

// Einstein summation by brute force: out[o] = sum over every other index of the product of the
// operands. Supports "..." (broadcast, aligned right; size-1 axes broadcast), repeated indices,
// implicit output (the ellipsis, then the letters that occur once, alphabetically).
inline Array einsum(const std::string& spec_in, const std::vector<Array>& ops) {
  std::string spec;
  for (char ch : spec_in)
    if (ch != ' ') spec += ch;
  const size_t arrow = spec.find("->");
  const std::string lhs = spec.substr(0, arrow);
  std::vector<std::string> terms;
  for (size_t start = 0;;) {
    const size_t comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  // ellipsis dims become the characters '0', '1', ... (right-aligned across operands)
  int64_t ellipsis_rank = 0;
  for (size_t k = 0; k < terms.size(); ++k) {
    const size_t e = terms[k].find("...");
    if (e != std::string::npos)
      ellipsis_rank = std::max<int64_t>(ellipsis_rank, static_cast<int64_t>(ops[k].shape.size() + 3 - terms[k].size()));
  }
  auto expand = [&](const std::string& term, int64_t rank) {
    const size_t e = term.find("...");
    if (e == std::string::npos) return term;
    std::string mid;
    for (int64_t i = ellipsis_rank - rank; i < ellipsis_rank; ++i) mid += static_cast<char>('0' + i);
    return term.substr(0, e) + mid + term.substr(e + 3);
  };
  std::vector<std::string> t;
  for (size_t k = 0; k < terms.size(); ++k) {
    const int64_t named = static_cast<int64_t>(terms[k].size()) - (terms[k].find("...") != std::string::npos ? 3 : 0);
    t.push_back(expand(terms[k], static_cast<int64_t>(ops[k].shape.size()) - named));
  }
  std::string out;
  if (arrow != std::string::npos) {
    out = expand(spec.substr(arrow + 2), ellipsis_rank);
  } else {
    for (int64_t i = 0; i < ellipsis_rank; ++i) out += static_cast<char>('0' + i);
    std::map<char, int> count;
    for (const auto& term : t)
      for (char ch : term) ++count[ch];
    for (auto [ch, cnt] : count)
      if (cnt == 1 && !(ch >= '0' && ch <= '9')) out += ch;
  }
  std::map<char, int64_t> size;
  for (size_t k = 0; k < t.size(); ++k)
    for (size_t i = 0; i < t[k].size(); ++i) size[t[k][i]] = std::max(size[t[k][i]], ops[k].shape[i]);
  std::string letters;
  for (auto [ch, n] : size) letters += ch;
  Shape oshape;
  for (char ch : out) oshape.push_back(size[ch]);
  Array y = make_array(oshape);
  std::map<char, int64_t> at;
  for (char ch : letters) at[ch] = 0;
  for (;;) {
    double product = 1;
    for (size_t k = 0; k < t.size(); ++k) {
      int64_t flat = 0;
      for (size_t i = 0; i < t[k].size(); ++i) {
        const int64_t dim = ops[k].shape[i];
        flat = flat * dim + (dim == 1 ? 0 : at[t[k][i]]);
      }
      product *= ops[k].v[static_cast<size_t>(flat)];
    }
    int64_t o = 0;
    for (char ch : out) o = o * size[ch] + at[ch];
    y.v[static_cast<size_t>(o)] += product;
    size_t i = letters.size();
    while (i-- > 0) {
      if (++at[letters[i]] < size[letters[i]]) break;
      at[letters[i]] = 0;
    }
    if (i == static_cast<size_t>(-1)) break;
  }
  return y;
}

}  // namespace remat::test::ref
