// einsum over one or two operands, lowered to sum + permute + reshape + one batched matmul.
#include "remat/nn/einsum.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <numeric>

#include "remat/ops.h"

namespace remat::nn {

namespace {

struct ParsedSpec {
  std::vector<std::string> inputs;  // one index string per operand
  std::string output;
};

bool has(const std::string& s, char c) { return s.find(c) != std::string::npos; }

// Validates the spec against the operands; fills the size of every index.
class Parser {
 public:
  Parser(const std::string& spec, const TensorList& operands) : spec_(spec), operands_(operands) {}

  template <class... Parts>
  void check(bool condition, Parts&&... parts) const {
    if (!condition) throw Error(detail::concat("einsum(\"", spec_, "\"): ", std::forward<Parts>(parts)...));
  }

  ParsedSpec parse() {
    std::string s;
    for (char c : spec_)
      if (!std::isspace(static_cast<unsigned char>(c))) s += c;
    const size_t arrow = s.find("->");
    const bool explicit_output = arrow != std::string::npos;
    std::string lhs = explicit_output ? s.substr(0, arrow) : s;
    ParsedSpec p;
    if (explicit_output) p.output = s.substr(arrow + 2);
    check(!has(p.output, ','), "the output \"", p.output, "\" names one tensor; remove the ','");

    size_t start = 0;
    for (;;) {
      size_t comma = lhs.find(',', start);
      p.inputs.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    for (const auto& term : p.inputs) check_chars(term, "operand term");
    check_chars(p.output, "output");

    check(!operands_.empty(), "needs one or two operands, got none");
    check(operands_.size() <= 2, "contracts one or two operands, got ", operands_.size(),
          " (contract them pairwise with several einsum calls)");
    check(p.inputs.size() == operands_.size(), "the spec has ", p.inputs.size(), " operand terms but ",
          operands_.size(), " operands were given");

    for (size_t k = 0; k < operands_.size(); ++k) check_operand(k, p.inputs[k]);
    if (operands_.size() == 2)
      check(operands_[0].dtype() == operands_[1].dtype(), "operands have different dtypes ",
            dtype_name(operands_[0].dtype()), " and ", dtype_name(operands_[1].dtype()));

    if (!explicit_output) {
      // implicit: the indices that occur exactly once, in alphabetical order
      std::map<char, int> count;
      for (const auto& term : p.inputs)
        for (char c : term) ++count[c];
      for (auto [c, n] : count)
        if (n == 1) p.output += c;
    }
    for (size_t i = 0; i < p.output.size(); ++i) {
      const char c = p.output[i];
      check(p.output.find(c) == i, "index '", c, "' appears twice in the output \"", p.output, "\"");
      check(sizes.count(c) == 1, "output index '", c, "' does not occur in any operand");
    }
    check(static_cast<int>(p.output.size()) <= kMaxRank, "the output \"", p.output, "\" has rank ", p.output.size(),
          ", above the maximum rank ", kMaxRank);
    return p;
  }

  std::map<char, int64_t> sizes;

 private:
  void check_chars(const std::string& term, const char* what) const {
    for (size_t i = 0; i < term.size(); ++i) {
      const char c = term[i];
      check(c != '.', "ellipsis (\"...\") is not supported; name every axis");
      check(std::isalpha(static_cast<unsigned char>(c)) != 0, "invalid character '", c, "' in the ", what, " \"",
            term, "\" (indices are letters a-z, A-Z)");
    }
  }

  void check_operand(size_t k, const std::string& term) {
    const Tensor& t = operands_[k];
    check(t.defined(), "operand ", k, " is undefined");
    check(is_floating(t.dtype()), "operand ", k, " must be f32 or f64, got ", dtype_name(t.dtype()));
    check(t.dim() == static_cast<int64_t>(term.size()), "operand ", k, " has shape ", shape_str(t.shape()), " (rank ",
          t.dim(), ") but its term \"", term, "\" names ", term.size(), " indices");
    for (size_t i = 0; i < term.size(); ++i) {
      const char c = term[i];
      check(term.find(c) == i, "index '", c, "' appears twice in operand ", k, "'s term \"", term,
            "\" (traces and diagonals are not supported)");
      const int64_t size = t.shape()[i];
      auto [it, inserted] = sizes.emplace(c, size);
      if (!inserted) {
        check(it->second == size, "index '", c, "' has size ", it->second, " in operand 0 (shape ",
              shape_str(operands_[0].shape()), ") but size ", size, " in operand ", k, " (shape ",
              shape_str(t.shape()), "); sizes must be equal (no broadcasting)");
      }
    }
  }

  const std::string& spec_;
  const TensorList& operands_;
};

// Sums away the indices of `term` that occur neither in `other` nor in `output`.
Tensor sum_private_indices(const Tensor& x, std::string& term, const std::string& other, const std::string& output) {
  std::vector<int64_t> axes;
  std::string kept;
  for (size_t i = 0; i < term.size(); ++i) {
    if (!has(other, term[i]) && !has(output, term[i])) {
      axes.push_back(static_cast<int64_t>(i));
    } else {
      kept += term[i];
    }
  }
  if (axes.empty()) return x;
  term = kept;
  return sum(x, axes);
}

// The permutation that takes `from` (index letters) to the order `to`.
std::vector<int64_t> permutation(const std::string& from, const std::string& to) {
  std::vector<int64_t> perm;
  for (char c : to) perm.push_back(static_cast<int64_t>(from.find(c)));
  return perm;
}

bool is_identity(const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return true;
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

Tensor permute_if_needed(const Tensor& x, const std::vector<int64_t>& perm) {
  return is_identity(perm) ? x : x.permute(perm);
}

int64_t product(const std::string& indices, const std::map<char, int64_t>& sizes) {
  int64_t n = 1;
  for (char c : indices) n *= sizes.at(c);
  return n;
}

// Lays an operand out as [batch, rows, cols] (transposed = false) or [batch, cols, rows]
// (transposed = true), preferring the one that needs no copy.
Tensor as_matrix_batch(const Tensor& x, const std::string& term, const std::string& batch, const std::string& rows,
                       const std::string& cols, const std::map<char, int64_t>& sizes, bool& transposed) {
  const std::vector<int64_t> straight = permutation(term, batch + rows + cols);
  const std::vector<int64_t> swapped = permutation(term, batch + cols + rows);
  transposed = !permuted_is_contiguous(x, straight) && permuted_is_contiguous(x, swapped);
  const int64_t nb = product(batch, sizes), r = product(rows, sizes), c = product(cols, sizes);
  if (transposed) return permute_if_needed(x, swapped).reshape({nb, c, r});
  return permute_if_needed(x, straight).reshape({nb, r, c});
}

}  // namespace

Tensor einsum(const std::string& spec, const TensorList& operands) {
  Parser parser(spec, operands);
  ParsedSpec p = parser.parse();
  const std::string& out = p.output;

  if (operands.size() == 1) {
    std::string term = p.inputs[0];
    Tensor x = sum_private_indices(operands[0], term, "", out);
    return permute_if_needed(x, permutation(term, out));
  }

  std::string ta = p.inputs[0], tb = p.inputs[1];
  Tensor a = sum_private_indices(operands[0], ta, tb, out);
  Tensor b = sum_private_indices(operands[1], tb, ta, out);
  // Groups: batch (a, b, out), m (a, out), n (b, out), k (a, b; summed by the product).
  std::string batch, m, n, k;
  for (char c : out) {
    if (has(ta, c) && has(tb, c)) {
      batch += c;
    } else if (has(ta, c)) {
      m += c;
    } else {
      n += c;
    }
  }
  for (char c : ta)
    if (has(tb, c) && !has(out, c)) k += c;

  bool trans_a = false, trans_b = false;
  Tensor a3 = as_matrix_batch(a, ta, batch, m, k, parser.sizes, trans_a);  // [nb, M, K] (or [nb, K, M])
  Tensor b3 = as_matrix_batch(b, tb, batch, k, n, parser.sizes, trans_b);  // [nb, K, N] (or [nb, N, K])
  Tensor c3 = matmul(a3, b3, trans_a, trans_b);                             // [nb, M, N]
  const std::string result = batch + m + n;
  Shape shape;
  for (char c : result) shape.push_back(parser.sizes.at(c));
  return permute_if_needed(c3.reshape(shape), permutation(result, out));
}

}  // namespace remat::nn
