// einsum over any number of operands: parse, per-operand preparation (diagonals, dropped
// broadcast axes, private sums), the contraction order (einsum_path.cpp), pairwise batched
// matmuls, a final permutation. See include/remat/nn/einsum.h.
#include "remat/nn/einsum.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "nn/einsum_path.h"
#include "remat/ops.h"

namespace remat::nn {

using detail::kEllipsisLabel;
using detail::LabelSizes;
using detail::Labels;

namespace {

bool contains(const Labels& labels, int l) { return std::find(labels.begin(), labels.end(), l) != labels.end(); }

// The spec with every "..." expanded into ellipsis labels, validated against the shapes.
struct ParsedSpec {
  std::vector<Labels> terms;
  Labels output;
  LabelSizes sizes;
};

class Parser {
 public:
  Parser(const std::string& spec, const std::vector<Shape>& shapes) : spec_(spec), shapes_(shapes) {}

  template <class... Parts>
  [[noreturn]] void fail(Parts&&... parts) const {
    throw Error(remat::detail::concat("einsum(\"", spec_, "\"): ", std::forward<Parts>(parts)...));
  }
  template <class... Parts>
  void check(bool condition, Parts&&... parts) const {
    if (!condition) fail(std::forward<Parts>(parts)...);
  }

  ParsedSpec parse() {
    std::string s;
    for (char c : spec_)
      if (!std::isspace(static_cast<unsigned char>(c))) s += c;
    const size_t arrow = s.find("->");
    const bool explicit_output = arrow != std::string::npos;
    const std::string lhs = explicit_output ? s.substr(0, arrow) : s;
    const std::string rhs = explicit_output ? s.substr(arrow + 2) : "";
    check(rhs.find(',') == std::string::npos, "the output \"", rhs, "\" names one tensor; remove the ','");
    std::vector<std::string> raw;
    for (size_t start = 0;;) {
      const size_t comma = lhs.find(',', start);
      raw.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    check(!shapes_.empty(), "needs at least one operand, got none");
    check(raw.size() == shapes_.size(), "the spec has ", raw.size(), " operand terms but ", shapes_.size(),
          " operands were given");

    // the ellipsis rank: the most axes any operand's "..." covers
    std::vector<Term> terms;
    for (size_t k = 0; k < raw.size(); ++k) {
      terms.push_back(split_term(raw[k], "operand term"));
      const int64_t rank = static_cast<int64_t>(shapes_[k].size());
      const int64_t named = static_cast<int64_t>(terms[k].letters.size());
      check(terms[k].has_ellipsis ? rank >= named : rank == named, "operand ", k, " has shape ",
            shape_str(shapes_[k]), " (rank ", rank, ") but its term \"", raw[k], "\" names ", named, " indices",
            terms[k].has_ellipsis ? " besides \"...\"" : "");
      if (terms[k].has_ellipsis) ellipsis_rank_ = std::max(ellipsis_rank_, rank - named);
    }
    ParsedSpec p;
    for (size_t k = 0; k < raw.size(); ++k) {
      p.terms.push_back(expand(terms[k], static_cast<int64_t>(shapes_[k].size())));
      record_sizes(k, p.terms[k], p.sizes);
    }
    if (explicit_output) {
      Term out = split_term(rhs, "output");
      p.output = expand(out, static_cast<int64_t>(out.letters.size()) + ellipsis_rank_);
      for (size_t i = 0; i < p.output.size(); ++i) {
        const int l = p.output[i];
        check(std::find(p.output.begin(), p.output.end(), l) == p.output.begin() + static_cast<std::ptrdiff_t>(i),
              "index ", detail::label_name(l), " appears twice in the output \"", rhs, "\"");
        check(p.sizes.count(l) == 1, "output index ", detail::label_name(l), " does not occur in any operand");
      }
    } else {
      // implicit: the ellipsis axes, then the letters that occur exactly once, alphabetically
      for (int64_t i = 0; i < ellipsis_rank_; ++i) p.output.push_back(kEllipsisLabel + static_cast<int>(i));
      std::map<int, int> count;
      for (const auto& t : p.terms)
        for (int l : t) ++count[l];
      for (auto [l, n] : count)
        if (n == 1 && l < kEllipsisLabel) p.output.push_back(l);
    }
    check(static_cast<int>(p.output.size()) <= kMaxRank, "the output has rank ", p.output.size(),
          ", above the maximum rank ", kMaxRank);
    return p;
  }

 private:
  struct Term {
    std::string letters;           // without the dots
    bool has_ellipsis = false;
    size_t ellipsis_at = 0;        // letters before the "..."
  };

  Term split_term(const std::string& text, const char* what) const {
    Term t;
    for (size_t i = 0; i < text.size(); ++i) {
      const char c = text[i];
      if (c == '.') {
        check(!t.has_ellipsis && text.compare(i, 3, "...") == 0, "a '.' in the ", what, " \"", text,
              "\" is not part of one \"...\"");
        t.has_ellipsis = true;
        t.ellipsis_at = t.letters.size();
        i += 2;
        continue;
      }
      check(std::isalpha(static_cast<unsigned char>(c)) != 0, "invalid character '", c, "' in the ", what, " \"",
            text, "\" (indices are letters a-z, A-Z, and \"...\")");
      t.letters += c;
    }
    return t;
  }

  // Labels of a term over `rank` axes: letters, with the "..." covering the rest, right-aligned
  // against the ellipsis rank.
  Labels expand(const Term& t, int64_t rank) const {
    Labels labels;
    for (size_t i = 0; i < t.ellipsis_at && t.has_ellipsis; ++i) labels.push_back(static_cast<unsigned char>(t.letters[i]));
    if (t.has_ellipsis) {
      const int64_t covered = rank - static_cast<int64_t>(t.letters.size());
      for (int64_t i = ellipsis_rank_ - covered; i < ellipsis_rank_; ++i)
        labels.push_back(kEllipsisLabel + static_cast<int>(i));
    }
    for (size_t i = t.has_ellipsis ? t.ellipsis_at : 0; i < t.letters.size(); ++i)
      labels.push_back(static_cast<unsigned char>(t.letters[i]));
    return labels;
  }

  void record_sizes(size_t k, const Labels& term, LabelSizes& sizes) {
    for (size_t i = 0; i < term.size(); ++i) {
      const int l = term[i];
      const int64_t size = shapes_[k][i];
      check(size >= 0, "operand ", k, " has shape ", shape_str(shapes_[k]), ": sizes must not be negative");
      auto [it, inserted] = sizes.emplace(l, size);
      holder_.emplace(l, k);
      if (!inserted && it->second != size) {
        if (l >= kEllipsisLabel) {
          check(it->second == 1 || size == 1, "the \"...\" axes of operand ", k, " (shape ", shape_str(shapes_[k]),
                ") do not broadcast with the other operands': ", detail::label_name(l), " has sizes ", it->second,
                " and ", size);
          it->second = std::max(it->second, size);
        } else {
          const size_t first = holder_.at(l);
          fail("index ", detail::label_name(l), " has size ", it->second, " in operand ", first, " (shape ",
               shape_str(shapes_[first]), ") but size ", size, " in operand ", k, " (shape ", shape_str(shapes_[k]),
               "); sizes must be equal (no broadcasting)");
        }
      }
    }
  }

  const std::string& spec_;
  const std::vector<Shape>& shapes_;
  int64_t ellipsis_rank_ = 0;
  std::map<int, size_t> holder_;  // the first operand holding each label
};

// What one operand needs before the contractions, and its labels afterwards.
struct Preparation {
  std::vector<int64_t> squeezed;                      // broadcast size-1 axes, dropped (descending)
  std::vector<std::pair<int64_t, int64_t>> diagonals;  // (i, j): take diagonal(i, j), label appended
  std::vector<int64_t> summed;                        // axes summed away (indices of its own)
  Labels labels;
};

std::vector<Preparation> prepare(const ParsedSpec& p, const std::vector<Shape>& shapes) {
  std::vector<Preparation> preps(p.terms.size());
  for (size_t k = 0; k < p.terms.size(); ++k) {
    Preparation& prep = preps[k];
    Labels labels = p.terms[k];
    for (size_t i = labels.size(); i-- > 0;) {
      if (labels[i] >= kEllipsisLabel && shapes[k][i] == 1 && p.sizes.at(labels[i]) > 1) {
        prep.squeezed.push_back(static_cast<int64_t>(i));
        labels.erase(labels.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    for (bool found = true; found;) {
      found = false;
      for (size_t i = 0; i < labels.size() && !found; ++i)
        for (size_t j = i + 1; j < labels.size() && !found; ++j)
          if (labels[i] == labels[j]) {
            const int l = labels[i];
            prep.diagonals.emplace_back(static_cast<int64_t>(i), static_cast<int64_t>(j));
            labels.erase(labels.begin() + static_cast<std::ptrdiff_t>(j));
            labels.erase(labels.begin() + static_cast<std::ptrdiff_t>(i));
            labels.push_back(l);
            found = true;
          }
    }
    prep.labels = std::move(labels);
  }
  // indices in no other operand and not in the output are summed first
  for (size_t k = 0; k < preps.size(); ++k) {
    Labels kept;
    for (size_t i = 0; i < preps[k].labels.size(); ++i) {
      const int l = preps[k].labels[i];
      bool needed = contains(p.output, l);
      for (size_t other = 0; other < preps.size() && !needed; ++other)
        if (other != k && contains(preps[other].labels, l)) needed = true;
      if (needed) kept.push_back(l);
      else preps[k].summed.push_back(static_cast<int64_t>(i));
    }
    preps[k].labels = std::move(kept);
  }
  return preps;
}

// ---- pairwise lowering

std::vector<int64_t> permutation(const Labels& from, const Labels& to) {
  std::vector<int64_t> perm;
  for (int l : to) perm.push_back(static_cast<int64_t>(std::find(from.begin(), from.end(), l) - from.begin()));
  return perm;
}

bool is_identity(const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return true;
}

Tensor permute_if_needed(const Tensor& x, const std::vector<int64_t>& perm) {
  return is_identity(perm) ? x : x.permute(perm);
}

// Would x.permute(perm) be contiguous? (Decided from the strides, without recording a view.)
bool permuted_is_contiguous(const Tensor& x, const std::vector<int64_t>& perm) {
  int64_t expected = 1;
  for (size_t i = perm.size(); i-- > 0;) {
    const int64_t size = x.shape()[perm[i]], stride = x.strides()[perm[i]];
    if (size != 1 && stride != expected) return false;
    expected *= size;
  }
  return true;
}

int64_t product(const Labels& labels, const LabelSizes& sizes) {
  int64_t n = 1;
  for (int l : labels) n *= sizes.at(l);
  return n;
}

Labels concat(const Labels& a, const Labels& b) {
  Labels r = a;
  r.insert(r.end(), b.begin(), b.end());
  return r;
}

// Lays an operand out as [batch, rows, cols] (transposed = false) or [batch, cols, rows]
// (transposed = true), preferring the one that needs no copy.
Tensor as_matrix_batch(const Tensor& x, const Labels& term, const Labels& batch, const Labels& rows,
                       const Labels& cols, const LabelSizes& sizes, bool& transposed) {
  const std::vector<int64_t> straight = permutation(term, concat(concat(batch, rows), cols));
  const std::vector<int64_t> swapped = permutation(term, concat(concat(batch, cols), rows));
  transposed = !permuted_is_contiguous(x, straight) && permuted_is_contiguous(x, swapped);
  const int64_t nb = product(batch, sizes), r = product(rows, sizes), c = product(cols, sizes);
  if (transposed) return permute_if_needed(x, swapped).reshape({nb, c, r});
  return permute_if_needed(x, straight).reshape({nb, r, c});
}

struct Operand {
  Tensor t;
  Labels labels;
};

// Sums the labels of x that the other operand lacks and `keep` does not hold.
Operand sum_private(const Operand& x, const Labels& other, const Labels& keep) {
  std::vector<int64_t> axes;
  Labels kept;
  for (size_t i = 0; i < x.labels.size(); ++i) {
    if (!contains(other, x.labels[i]) && !contains(keep, x.labels[i])) axes.push_back(static_cast<int64_t>(i));
    else kept.push_back(x.labels[i]);
  }
  if (axes.empty()) return x;
  return {sum(x.t, axes), kept};
}

// The product of a and b keeping `keep` (labels ordered as in `order` first, then as met).
Operand contract_pair(const Operand& a_in, const Operand& b_in, const Labels& keep, const Labels& order,
                      const LabelSizes& sizes) {
  const Operand a = sum_private(a_in, b_in.labels, keep), b = sum_private(b_in, a_in.labels, keep);
  auto rank_of = [&](int l) {
    auto it = std::find(order.begin(), order.end(), l);
    if (it != order.end()) return static_cast<int64_t>(it - order.begin());
    auto ia = std::find(a.labels.begin(), a.labels.end(), l);
    if (ia != a.labels.end()) return static_cast<int64_t>(order.size() + (ia - a.labels.begin()));
    return static_cast<int64_t>(order.size() + a.labels.size() + (std::find(b.labels.begin(), b.labels.end(), l) - b.labels.begin()));
  };
  Labels batch, m, n, k;
  for (int l : a.labels) {
    const bool in_b = contains(b.labels, l), kept = contains(keep, l);
    if (in_b && kept) batch.push_back(l);
    else if (in_b) k.push_back(l);
    else m.push_back(l);
  }
  for (int l : b.labels)
    if (!contains(a.labels, l)) n.push_back(l);
  auto by_rank = [&](int x, int y) { return rank_of(x) < rank_of(y); };
  std::sort(batch.begin(), batch.end(), by_rank);
  std::sort(m.begin(), m.end(), by_rank);
  std::sort(n.begin(), n.end(), by_rank);
  const Labels result = concat(concat(batch, m), n);
  if (k.empty()) {
    // nothing summed: a broadcasting multiply [batch, m, 1...] * [batch, 1..., n]
    Tensor at = permute_if_needed(a.t, permutation(a.labels, concat(batch, m)));
    Tensor bt = permute_if_needed(b.t, permutation(b.labels, concat(batch, n)));
    for (size_t i = 0; i < n.size(); ++i) at = at.unsqueeze(-1);
    for (size_t i = 0; i < m.size(); ++i) bt = bt.unsqueeze(static_cast<int64_t>(batch.size()));
    return {mul(at, bt), result};
  }
  bool trans_a = false, trans_b = false;
  Tensor a3 = as_matrix_batch(a.t, a.labels, batch, m, k, sizes, trans_a);  // [nb, M, K] (or [nb, K, M])
  Tensor b3 = as_matrix_batch(b.t, b.labels, batch, k, n, sizes, trans_b);  // [nb, K, N] (or [nb, N, K])
  Tensor c3 = matmul(a3, b3, trans_a, trans_b);                             // [nb, M, N]
  Shape shape;
  for (int l : result) shape.push_back(sizes.at(l));
  return {c3.reshape(shape), result};
}

std::vector<Shape> shapes_of(const TensorList& operands, const std::string& spec) {
  std::vector<Shape> shapes;
  for (size_t k = 0; k < operands.size(); ++k) {
    const Tensor& t = operands[k];
    REMAT_CHECK(t.defined(), "einsum(\"", spec, "\"): operand ", k, " is undefined");
    REMAT_CHECK(is_floating(t.dtype()), "einsum(\"", spec, "\"): operand ", k, " must be floating (f32, f64, bf16, f16), got ",
                dtype_name(t.dtype()));
    REMAT_CHECK(t.dtype() == operands[0].dtype(), "einsum(\"", spec, "\"): operands have different dtypes ",
                dtype_name(operands[0].dtype()), " (operand 0) and ", dtype_name(t.dtype()), " (operand ", k, ")");
    shapes.push_back(t.shape());
  }
  return shapes;
}

std::string labels_text(const Labels& labels) {
  std::string s;
  for (int l : labels) s += l >= kEllipsisLabel ? '.' : static_cast<char>(l);
  return s;
}

}  // namespace

EinsumPath einsum_path(const std::string& spec, const std::vector<Shape>& shapes) {
  ParsedSpec p = Parser(spec, shapes).parse();
  std::vector<Preparation> preps = prepare(p, shapes);
  std::vector<Labels> labels;
  for (const auto& prep : preps) labels.push_back(prep.labels);
  EinsumPath path;
  for (const auto& step : detail::plan_contraction(labels, p.output, p.sizes, path.optimal, &path.method)) {
    path.steps.push_back({step.first, step.second, labels_text(step.result), step.flops});
    path.flops += step.flops;
  }
  return path;
}

Tensor einsum(const std::string& spec, const TensorList& operands) {
  const std::vector<Shape> shapes = shapes_of(operands, spec);
  ParsedSpec p = Parser(spec, shapes).parse();
  std::vector<Preparation> preps = prepare(p, shapes);

  std::vector<Operand> current;
  for (size_t k = 0; k < operands.size(); ++k) {
    const Preparation& prep = preps[k];
    Tensor t = operands[k];
    for (int64_t axis : prep.squeezed) t = t.squeeze(axis);
    for (auto [i, j] : prep.diagonals) t = diagonal(t, i, j);
    if (!prep.summed.empty()) t = sum(t, prep.summed);
    current.push_back({t, prep.labels});
  }
  bool optimal = false;
  std::vector<Labels> labels;
  for (const auto& op : current) labels.push_back(op.labels);
  for (const auto& step : detail::plan_contraction(labels, p.output, p.sizes, optimal)) {
    Operand product = contract_pair(current[step.first], current[step.second], step.result, p.output, p.sizes);
    current.erase(current.begin() + static_cast<std::ptrdiff_t>(step.second));
    current.erase(current.begin() + static_cast<std::ptrdiff_t>(step.first));
    current.push_back(std::move(product));
  }
  const Operand& last = current.front();
  REMAT_ASSERT(last.labels.size() == p.output.size(), "einsum: the contraction left ", labels_text(last.labels),
               " for the output ", labels_text(p.output));
  return permute_if_needed(last.t, permutation(last.labels, p.output));
}

// ---- the Einsum layer

Einsum::Einsum(std::string spec, std::vector<Shape> weight_shapes, DType dtype) : spec_(std::move(spec)) {
  REMAT_CHECK(is_floating(dtype), "Einsum: the weights must be floating (f32, f64, bf16, f16), got ", dtype_name(dtype));
  // Validate against a stand-in input shape: the input term is checked at forward time.
  const std::string lhs = spec_.substr(0, spec_.find("->"));
  std::vector<std::string> terms;
  for (size_t start = 0;;) {
    const size_t comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  REMAT_CHECK(terms.size() == weight_shapes.size() + 1, "Einsum(\"", spec_, "\"): the spec has ", terms.size(),
              " operand terms; it needs one for the input and one per weight (", weight_shapes.size(), " given)");
  for (size_t k = 1; k < terms.size(); ++k)
    REMAT_CHECK(terms[k].find('.') == std::string::npos, "Einsum(\"", spec_, "\"): weight term \"", terms[k],
                "\" may not use \"...\"");
  for (const auto& shape : weight_shapes)
    for (auto d : shape)
      REMAT_CHECK(d > 0, "Einsum(\"", spec_, "\"): weight shape ", shape_str(shape), " has a non-positive size");
  // The weights alone, with the input's term dropped, must form a valid spec (sizes agree, ranks
  // match the terms); the output is checked at forward time.
  {
    std::string weights_only;
    for (size_t k = 1; k < terms.size(); ++k) weights_only += (k > 1 ? "," : "") + terms[k];
    try {
      if (!weight_shapes.empty()) (void)einsum_path(weights_only + "->", weight_shapes);
    } catch (const Error& e) {
      throw Error(remat::detail::concat("Einsum(\"", spec_, "\"): the weight shapes do not fit the spec: ", e.what()));
    }
  }
  // the output's letters (implicit: those occurring once)
  std::string rhs;
  if (spec_.find("->") != std::string::npos) {
    rhs = spec_.substr(spec_.find("->") + 2);
  } else {
    for (char c : lhs)
      if (std::isalpha(static_cast<unsigned char>(c)) && std::count(lhs.begin(), lhs.end(), c) == 1) rhs += c;
  }
  for (size_t k = 0; k < weight_shapes.size(); ++k) {
    const std::string& term = terms[k + 1];
    std::string letters;
    for (char c : term)
      if (!std::isspace(static_cast<unsigned char>(c))) letters += c;
    double fan_in = 1;
    for (size_t i = 0; i < letters.size() && i < weight_shapes[k].size(); ++i)
      if (rhs.find(letters[i]) == std::string::npos) fan_in *= static_cast<double>(weight_shapes[k][i]);
    const double bound = 1.0 / std::sqrt(fan_in);
    weights.push_back(register_parameter(weight_shapes.size() == 1 ? "weight" : "weight" + std::to_string(k),
                                         weight_shapes[k], dtype, Init::uniform(-bound, bound)));
  }
}

std::string Einsum::type_name() const { return "Einsum(\"" + spec_ + "\")"; }

Tensor Einsum::forward_impl(const Tensor& x) {
  TensorList operands{x};
  for (const Tensor& w : weights) operands.push_back(compute_weight(w));
  return einsum(spec_, operands);
}

}  // namespace remat::nn
