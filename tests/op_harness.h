// tests/op_harness.h - the table-driven op test harness.
//
// A test case (OpCase) is one row of a table:
//   - make_inputs: builds seeded random inputs (plain doubles, kept away from kinks),
//   - apply:       runs the remat op on tensors made from them,
//   - reference:   the same op written with plain loops over std::vector<double> (no remat ops;
//                  the references are in op_reference.h, those of the convolution family in
//                  op_reference_conv.h).
// For a dtype (f32, f64, or the 16-bit bf16 and f16) the harness checks
//   (a) check_forward:       remat's forward value against the float64 reference;
//   (b) check_case_gradient: d/dx sum_k <op(x)_k, R_k> for fixed random R_k, computed by remat's
//       backward, against central finite differences of the float64 reference, for every
//       differentiable input element.
// Inputs are generated as values exactly representable in f32, so the f32 and f64 runs evaluate
// the op at the same point and only the arithmetic precision differs. For a 16-bit dtype the
// inputs (and the loss weights R_k) are rounded to it first, and the reference runs at those
// rounded values: the comparison then measures the op's arithmetic alone, which the CPU does in
// float32 with one rounding of each kernel's results (Note [16-bit floats on the CPU] in
// src/tensor/cpu/widen.cpp), within forward_tolerance and the row's grad_tol_16bit.
//
// The gradient checker itself (check_gradient) takes the analytic gradient as data, so a test can
// feed it a deliberately wrong one and assert that it reports the mismatch (see test_ops.cpp).
//
// The device axis: every check takes the Device the op runs on (inputs are made there, outputs
// and gradients must come back there and are copied to the host to be compared). On a device
// other than the CPU, check_matches_cpu also requires the forward values and the gradients to equal
// the CPU's bit for bit, which holds for a backend that reuses the CPU kernels (the test-only
// emulated device, tests/emulated_backend.h); a real accelerator runs the same rows against the
// float64 references with the tolerances above.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "op_reference.h"
#include "remat/autodiff.h"
#include "remat/ops.h"
#include "remat/random.h"
#include "remat/tensor.h"

namespace remat::test {

// ============================================================================================
// Random inputs (seeded; every value exactly representable in f32).
// ============================================================================================

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  // Uniform in [lo, hi), rounded to the nearest float.
  double uniform(double lo, double hi) {
    double u = static_cast<double>(gen_() >> 11) * (1.0 / 9007199254740992.0);
    return static_cast<double>(static_cast<float>(lo + (hi - lo) * u));
  }
  int64_t integer(int64_t lo, int64_t hi) {  // [lo, hi)
    return lo + static_cast<int64_t>(gen_() % static_cast<uint64_t>(hi - lo));
  }
  std::vector<double> uniform_vector(int64_t n, double lo, double hi) {
    std::vector<double> v(static_cast<size_t>(n));
    for (auto& x : v) x = uniform(lo, hi);
    return v;
  }
  // Uniform in [lo, hi) but at least `margin` away from every point in `kinks`.
  std::vector<double> away_from(int64_t n, double lo, double hi, const std::vector<double>& kinks, double margin) {
    std::vector<double> v(static_cast<size_t>(n));
    for (auto& x : v) {
      do x = uniform(lo, hi);
      while (std::any_of(kinks.begin(), kinks.end(), [&](double k) { return std::abs(x - k) < margin; }));
    }
    return v;
  }
  // n distinct values spaced at least `gap` apart, in random order (no ties for max).
  std::vector<double> distinct(int64_t n, double lo, double gap) {
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<double>(static_cast<float>(lo + gap * static_cast<double>(i)));
    for (int64_t i = n - 1; i > 0; --i) std::swap(v[i], v[integer(0, i + 1)]);
    return v;
  }
  std::mt19937_64& engine() { return gen_; }

 private:
  std::mt19937_64 gen_;
};

inline uint64_t hash_name(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// ============================================================================================
// Test cases
// ============================================================================================

enum class Kind {
  floating,  // in the test dtype, requires grad, checked by finite differences
  index,     // i64 (ids, targets, i64 conditions and masks); no gradient
  constant,  // in the test dtype but no gradient (e.g. a float condition for where)
};

struct Input {
  std::string name;
  Shape shape;
  std::vector<double> values;
  Kind kind = Kind::floating;
};
using Inputs = std::vector<Input>;

inline Input floating(std::string name, Shape shape, std::vector<double> values) {
  return {std::move(name), std::move(shape), std::move(values), Kind::floating};
}
inline Input index_input(std::string name, Shape shape, std::vector<double> values) {
  return {std::move(name), std::move(shape), std::move(values), Kind::index};
}
inline Input constant(std::string name, Shape shape, std::vector<double> values) {
  return {std::move(name), std::move(shape), std::move(values), Kind::constant};
}

struct OpCase {
  std::string name;                                          // "op_variant", used in test names
  std::function<Inputs(Rng&)> make_inputs;                   // seeded random inputs
  std::function<TensorList(const TensorList&)> apply;       // the remat op (one or more outputs)
  std::function<std::vector<Array>(const std::vector<Array>&)> reference;  // float64 loops
  bool differentiable = true;  // false: outputs must not require grad (argmax)
  double grad_tol_f32 = 5e-4;  // |analytic - numeric| <= tol * (1 + |numeric|)
  double grad_tol_f64 = 1e-5;
  double grad_tol_16bit = 4e-2;  // bf16; f16 (3 more bits) uses an eighth of it
  bool computes_in_f32 = false;  // converts to f32 inside: f32 tolerances whatever the dtype
};

struct Tolerance {
  double atol, rtol;
};
// f64 1e-10 + 1e-9 relative; f32 2e-5 + 1e-4 relative; bf16 (8 bits) 1.6e-2 + 1.6e-2 relative
// (four units in the last place, for ops of several kernels each rounding once); f16 (11 bits)
// an eighth of bf16's.
inline Tolerance forward_tolerance(DType dtype) {
  switch (dtype) {
    case DType::f64: return {1e-10, 1e-9};
    case DType::bf16: return {1.6e-2, 1.6e-2};
    case DType::f16: return {2e-3, 2e-3};
    default: return {2e-5, 1e-4};
  }
}

// v rounded to `dtype` (bf16, f16), or v itself for a wider dtype.
inline double round_to(DType dtype, double v) {
  if (dtype == DType::bf16) return static_cast<double>(bfloat16(v));
  if (dtype == DType::f16) return static_cast<double>(float16(v));
  return v;
}
inline std::vector<double> round_to(DType dtype, std::vector<double> values) {
  for (double& v : values) v = round_to(dtype, v);
  return values;
}

struct CheckResult {
  bool ok = true;
  int mismatches = 0;
  double max_error = 0;
  std::string message;
};

// The row's inputs, the floating ones rounded to a 16-bit `dtype`.
inline Inputs inputs_of(const OpCase& c, DType dtype = DType::f32) {
  Rng rng(hash_name(c.name));
  Inputs inputs = c.make_inputs(rng);
  for (auto& in : inputs)
    if (in.kind != Kind::index) in.values = round_to(dtype, std::move(in.values));
  return inputs;
}

inline std::vector<Array> arrays_of(const Inputs& inputs) {
  std::vector<Array> arrays;
  for (const auto& in : inputs) arrays.push_back({in.shape, in.values});
  return arrays;
}

inline TensorList tensors_of(const Inputs& inputs, DType dtype, bool with_grad, Device device = {}) {
  TensorList ts;
  for (const auto& in : inputs) {
    if (in.kind == Kind::index) {
      ts.push_back(from_vector(in.values, in.shape, DType::i64, memory::Tag::other, device));
    } else {
      Tensor t = from_vector(in.values, in.shape, dtype, memory::Tag::other, device);
      if (with_grad && in.kind == Kind::floating) t.requires_grad_();
      ts.push_back(t);
    }
  }
  return ts;
}

// The fixed random weights R_k of the scalar loss sum_k <out_k, R_k> (rounded to a 16-bit dtype).
inline std::vector<Array> loss_weights(const OpCase& c, const std::vector<Array>& ref_outputs,
                                       DType dtype = DType::f32) {
  Rng rng(hash_name(c.name) ^ 0x9e3779b97f4a7c15ull);
  std::vector<Array> r;
  for (const auto& out : ref_outputs)
    r.push_back({out.shape, round_to(dtype, rng.uniform_vector(numel_of(out.shape), -1.0, 1.0))});
  return r;
}

// Compares values element by element: |got - want| <= atol + rtol * |want|.
inline CheckResult compare_values(const std::vector<double>& got, const std::vector<double>& want, const Shape& shape,
                                  Tolerance tol, const std::string& what) {
  CheckResult r;
  std::ostringstream out;
  if (got.size() != want.size()) {
    r.ok = false;
    out << what << ": " << got.size() << " values, expected " << want.size() << "\n";
    r.message = out.str();
    return r;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    double err = std::abs(got[i] - want[i]);
    bool bad = !(err <= tol.atol + tol.rtol * std::abs(want[i]));  // also catches NaN
    if (!bad) {
      r.max_error = std::max(r.max_error, err);
      continue;
    }
    r.ok = false;
    if (r.mismatches++ < 6)
      out << what << " at " << shape_text(unravel(static_cast<int64_t>(i), shape)) << ": got " << got[i]
          << ", expected " << want[i] << " (error " << err << ")\n";
  }
  if (!r.ok) out << what << ": " << r.mismatches << " of " << got.size() << " elements differ\n";
  r.message = out.str();
  return r;
}

// (a) forward value against the reference.
inline CheckResult check_forward(const OpCase& c, DType dtype, Device device = {}) {
  Inputs inputs = inputs_of(c, dtype);
  std::vector<Array> want = c.reference(arrays_of(inputs));
  TensorList outs = c.apply(tensors_of(inputs, dtype, /*with_grad=*/false, device));
  CheckResult r;
  std::ostringstream out;
  if (outs.size() != want.size()) {
    r.ok = false;
    out << c.name << ": " << outs.size() << " outputs, expected " << want.size();
    r.message = out.str();
    return r;
  }
  for (size_t k = 0; k < outs.size(); ++k) {
    std::string what = c.name + " output " + std::to_string(k);
    if (outs[k].shape() != want[k].shape) {
      r.ok = false;
      out << what << ": shape " << shape_text(outs[k].shape()) << ", expected " << shape_text(want[k].shape) << "\n";
      continue;
    }
    if (outs[k].device() != device) {
      r.ok = false;
      out << what << ": on " << device_name(outs[k].device()) << ", expected " << device_name(device) << "\n";
      continue;
    }
    DType precision = is_16bit_float(dtype)                      ? dtype
                      : c.computes_in_f32 || dtype == DType::f32 ? DType::f32
                                                                 : outs[k].dtype();
    CheckResult e =
        compare_values(outs[k].to(kCpu).to_vector(), want[k].v, want[k].shape, forward_tolerance(precision), what);
    if (!e.ok) r.ok = false;
    r.mismatches += e.mismatches;
    r.max_error = std::max(r.max_error, e.max_error);
    out << e.message;
  }
  r.message = out.str();
  return r;
}

// The core gradient checker: compares `analytic` (one vector per input; checked only where
// wrt[i]) with central differences of `loss` at x, element by element:
//   |analytic - numeric| <= tol * (1 + |numeric|).
// An empty analytic vector for a checked input counts as "no gradient was produced".
inline CheckResult check_gradient(const std::function<double(const std::vector<std::vector<double>>&)>& loss,
                                  const std::vector<std::vector<double>>& x, const std::vector<bool>& wrt,
                                  const std::vector<std::vector<double>>& analytic, double tol,
                                  const std::vector<std::string>& names = {}, double h = 1e-6) {
  CheckResult r;
  std::ostringstream out;
  auto name_of = [&](size_t i) { return i < names.size() ? names[i] : "input " + std::to_string(i); };
  for (size_t i = 0; i < x.size(); ++i) {
    if (!wrt[i]) continue;
    if (i >= analytic.size() || analytic[i].size() != x[i].size()) {
      r.ok = false;
      ++r.mismatches;
      out << name_of(i) << ": no gradient of the right size (got "
          << (i < analytic.size() ? analytic[i].size() : 0) << " values, expected " << x[i].size() << ")\n";
      continue;
    }
    std::vector<std::vector<double>> xp = x;
    for (size_t j = 0; j < x[i].size(); ++j) {
      xp[i][j] = x[i][j] + h;
      double up = loss(xp);
      xp[i][j] = x[i][j] - h;
      double down = loss(xp);
      xp[i][j] = x[i][j];
      double numeric = (up - down) / (2 * h);
      double err = std::abs(analytic[i][j] - numeric);
      if (err <= tol * (1 + std::abs(numeric))) {
        r.max_error = std::max(r.max_error, err);
        continue;
      }
      r.ok = false;
      if (r.mismatches++ < 8)
        out << "d/d " << name_of(i) << "[" << j << "]: analytic " << analytic[i][j] << ", numeric " << numeric
            << " (error " << err << ")\n";
    }
  }
  if (!r.ok) out << r.mismatches << " gradient element(s) differ from finite differences\n";
  r.message = out.str();
  return r;
}

// Supplies the analytic gradient of sum_k <outputs_k, R_k> for each input (empty vector for
// inputs without a gradient). The default runs remat's backward.
using GradFn = std::function<std::vector<std::vector<double>>(const OpCase&, DType, const Inputs&,
                                                              const std::vector<Array>& weights)>;

inline std::vector<std::vector<double>> remat_gradient_on(Device device, const OpCase& c, DType dtype,
                                                          const Inputs& inputs, const std::vector<Array>& weights) {
  TensorList ts = tensors_of(inputs, dtype, /*with_grad=*/true, device);
  TensorList outs = c.apply(ts);
  if (outs.size() != weights.size())
    throw std::runtime_error(c.name + ": " + std::to_string(outs.size()) + " outputs, expected " +
                             std::to_string(weights.size()));
  TensorList roots, grads;
  for (size_t k = 0; k < outs.size(); ++k) {
    if (!outs[k].requires_grad()) continue;  // e.g. an output that is not floating
    if (outs[k].shape() != weights[k].shape)
      throw std::runtime_error(c.name + ": output shape " + shape_text(outs[k].shape()) + ", expected " +
                               shape_text(weights[k].shape));
    roots.push_back(outs[k]);
    grads.push_back(from_vector(weights[k].v, weights[k].shape, outs[k].dtype(), memory::Tag::other, device));
  }
  std::vector<std::vector<double>> result(inputs.size());
  if (roots.empty()) return result;

  // remat::grad (leaves untouched, graph retained) and then backward() into .grad(): both
  // paths must agree.
  TensorList wrt;
  std::vector<size_t> wrt_index;
  for (size_t i = 0; i < ts.size(); ++i)
    if (inputs[i].kind == Kind::floating) {
      wrt.push_back(ts[i]);
      wrt_index.push_back(i);
    }
  TensorList via_grad = remat::grad(roots, wrt, grads, /*retain_graph=*/true);
  remat::backward(roots, grads);
  for (size_t w = 0; w < wrt.size(); ++w) {
    size_t i = wrt_index[w];
    Tensor g = ts[i].grad();
    if (!g.defined()) continue;
    if (g.shape() != inputs[i].shape || g.dtype() != dtype || g.device() != device)
      throw std::runtime_error(c.name + ": gradient of " + inputs[i].name + " has shape " + shape_text(g.shape()) +
                               ", dtype " + dtype_name(g.dtype()) + " and device " + device_name(g.device()) +
                               ", expected " + shape_text(inputs[i].shape) + " on " + device_name(device));
    result[i] = g.to(kCpu).to_vector();
    auto other = via_grad[w].to(kCpu).to_vector();
    for (size_t j = 0; j < other.size(); ++j)
      if (std::abs(other[j] - result[i][j]) > 1e-12 * (1 + std::abs(result[i][j])))
        throw std::runtime_error(c.name + ": remat::grad and backward() disagree on " + inputs[i].name);
  }
  return result;
}
inline std::vector<std::vector<double>> remat_gradient(const OpCase& c, DType dtype, const Inputs& inputs,
                                                       const std::vector<Array>& weights) {
  return remat_gradient_on(kCpu, c, dtype, inputs, weights);
}
inline GradFn gradient_on(Device device) {
  return [device](const OpCase& c, DType dtype, const Inputs& inputs, const std::vector<Array>& weights) {
    return remat_gradient_on(device, c, dtype, inputs, weights);
  };
}

// (b) the gradient check of one case in one dtype.
inline CheckResult check_case_gradient(const OpCase& c, DType dtype, const GradFn& grad_fn = remat_gradient) {
  Inputs inputs = inputs_of(c, dtype);
  std::vector<Array> base = arrays_of(inputs);
  std::vector<Array> weights = loss_weights(c, c.reference(base), dtype);
  std::vector<std::vector<double>> x;
  std::vector<bool> wrt;
  std::vector<std::string> names;
  for (const auto& in : inputs) {
    x.push_back(in.values);
    wrt.push_back(in.kind == Kind::floating);
    names.push_back(c.name + " " + in.name);
  }
  auto loss = [&](const std::vector<std::vector<double>>& values) {
    std::vector<Array> arrays = base;
    for (size_t i = 0; i < arrays.size(); ++i) arrays[i].v = values[i];
    std::vector<Array> outs = c.reference(arrays);
    double total = 0;
    for (size_t k = 0; k < outs.size(); ++k)
      for (size_t j = 0; j < outs[k].v.size(); ++j) total += outs[k].v[j] * weights[k].v[j];
    return total;
  };
  std::vector<std::vector<double>> analytic = grad_fn(c, dtype, inputs, weights);
  const double tol = dtype == DType::bf16           ? c.grad_tol_16bit
                     : dtype == DType::f16          ? c.grad_tol_16bit / 8
                     : dtype == DType::f64 && !c.computes_in_f32 ? c.grad_tol_f64
                                                                 : c.grad_tol_f32;
  return check_gradient(loss, x, wrt, analytic, tol, names);
}

// (c) on a device other than the CPU whose kernels are the CPU's: forward values and gradients
// bitwise equal to the CPU's.
inline CheckResult check_matches_cpu(const OpCase& c, DType dtype, Device device) {
  CheckResult r;
  std::ostringstream out;
  Inputs inputs = inputs_of(c, dtype);
  TensorList on_cpu = c.apply(tensors_of(inputs, dtype, false));
  TensorList on_device = c.apply(tensors_of(inputs, dtype, false, device));
  if (on_cpu.size() != on_device.size()) {
    r.ok = false;
    out << c.name << ": " << on_device.size() << " outputs on " << device_name(device) << ", " << on_cpu.size()
        << " on the CPU\n";
  }
  for (size_t k = 0; k < std::min(on_cpu.size(), on_device.size()); ++k) {
    if (on_cpu[k].to_vector() != on_device[k].to(kCpu).to_vector()) {
      r.ok = false;
      ++r.mismatches;
      out << c.name << " output " << k << " on " << device_name(device) << " differs from the CPU's\n";
    }
  }
  if (c.differentiable) {
    std::vector<Array> weights = loss_weights(c, c.reference(arrays_of(inputs)), dtype);
    auto g_cpu = remat_gradient_on(kCpu, c, dtype, inputs, weights);
    auto g_device = remat_gradient_on(device, c, dtype, inputs, weights);
    for (size_t i = 0; i < g_cpu.size(); ++i)
      if (g_cpu[i] != g_device[i]) {
        r.ok = false;
        ++r.mismatches;
        out << c.name << ": the gradient of " << inputs[i].name << " on " << device_name(device)
            << " differs from the CPU's\n";
      }
  }
  r.message = out.str();
  return r;
}

}  // namespace remat::test
