// The pooling rows (src/autodiff/ops/pool.cpp): max, average and adaptive average pooling.
#include "op_rows/builders.h"
#include "op_reference_conv.h"

namespace remat::test {

namespace {

std::string size2_text(Size2 s) { return std::to_string(s[0]) + "x" + std::to_string(s[1]); }

struct PoolRow {
  std::string kind;  // max, avg
  Shape x;
  Size2 kernel, stride, padding{0, 0}, dilation{1, 1};
  bool ceil_mode = false, count_include_pad = true;
};

OpCase pool_case(const PoolRow& r) {
  OpCase c;
  c.name = r.kind + "_pool2d_k" + size2_text(r.kernel) + "_s" + size2_text(r.stride) + "_p" + size2_text(r.padding) +
           (r.dilation[0] > 1 || r.dilation[1] > 1 ? "_d" + size2_text(r.dilation) : "") +
           (r.ceil_mode ? "_ceil" : "") + (!r.count_include_pad ? "_exclude_pad" : "") + "_" + dims(r.x);
  // distinct values 0.05 apart: no ties in a max window
  c.make_inputs = [r](Rng& rng) { return Inputs{floating("x", r.x, rng.distinct(numel_of(r.x), -2.0, 0.05))}; };
  c.apply = [r](const TensorList& in) {
    if (r.kind == "max") return TensorList{max_pool2d(in[0], r.kernel, r.stride, r.padding, r.dilation, r.ceil_mode)};
    return TensorList{avg_pool2d(in[0], r.kernel, r.stride, r.padding, r.ceil_mode, r.count_include_pad)};
  };
  c.reference = [r](const std::vector<Array>& a) {
    if (r.kind == "max")
      return std::vector<Array>{ref::max_pool2d(a[0], r.kernel, r.stride, r.padding, r.dilation, r.ceil_mode)};
    return std::vector<Array>{ref::avg_pool2d(a[0], r.kernel, r.stride, r.padding, r.ceil_mode, r.count_include_pad)};
  };
  return c;
}

OpCase adaptive_case(Shape x, Size2 out) {
  OpCase c;
  c.name = "adaptive_avg_pool2d_" + dims(x) + "_to_" + size2_text(out);
  c.make_inputs = [x](Rng& rng) { return Inputs{floating("x", x, rng.uniform_vector(numel_of(x), -2, 2))}; };
  c.apply = [out](const TensorList& in) { return TensorList{adaptive_avg_pool2d(in[0], out)}; };
  c.reference = [out](const std::vector<Array>& a) { return std::vector<Array>{ref::adaptive_avg_pool2d(a[0], out)}; };
  return c;
}

}  // namespace

void add_pool_rows(std::vector<OpCase>& t) {
  for (const PoolRow& r : std::vector<PoolRow>{
           {"max", {2, 2, 4, 6}, {2, 2}, {2, 2}},
           {"max", {1, 2, 7, 7}, {3, 3}, {2, 2}, {1, 1}},
           {"max", {1, 2, 7, 8}, {2, 2}, {2, 2}, {0, 0}, {2, 2}, true},
           {"avg", {2, 2, 4, 6}, {2, 2}, {2, 2}},
           {"avg", {1, 2, 6, 7}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true, true},
           {"avg", {1, 2, 6, 7}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true, false},
       })
    t.push_back(pool_case(r));
  t.push_back(adaptive_case({2, 2, 5, 7}, {1, 1}));
  t.push_back(adaptive_case({1, 2, 5, 7}, {2, 3}));
}

}  // namespace remat::test
