#include "remat/policy.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>

#include "remat/autodiff.h"
#include "remat/error.h"
#include "remat/memory.h"

namespace remat {

namespace {
thread_local std::optional<Policy> scoped_policy;

const char* kValidForms =
    "valid forms: save-all, every-layer, every-k:K (K >= 1), selective:OP[,OP...] (e.g. selective:matmul), "
    "budget:BYTES (e.g. budget:64MiB)";

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}
}  // namespace

Policy Policy::every_k(int k) {
  REMAT_CHECK(k >= 1, "policy every-k: K must be at least 1, got ", k);
  Policy p{Kind::every_k, 1, {}, 0};
  p.k = k;
  return p;
}

static std::string known_op_kinds() {
  std::string list;
  for (const auto& kind : autodiff::op_kinds()) list += (list.empty() ? "" : ", ") + kind;
  return list;
}

Policy Policy::selective(std::vector<std::string> ops) {
  REMAT_CHECK(!ops.empty(), "policy selective: list at least one op kind (e.g. selective:matmul)");
  for (const auto& op : ops) {
    REMAT_CHECK(!op.empty() && op.rfind("custom:", 0) != 0, "policy selective: invalid op kind '", op,
                "' (custom ops are always recomputed)");
    REMAT_CHECK(autodiff::is_op_kind(op), "policy selective: unknown op kind '", op, "'; the op kinds are ",
                known_op_kinds());
  }
  Policy p{Kind::selective, 1, {}, 0};
  p.ops = std::move(ops);
  return p;
}

Policy Policy::budget(size_t bytes) {
  REMAT_CHECK(bytes > 0, "policy budget: the budget must be positive");
  Policy p{Kind::budget, 1, {}, 0};
  p.budget_bytes = bytes;
  return p;
}

Policy Policy::parse(const std::string& raw) {
  std::string text = trim(raw);
  auto colon = text.find(':');
  std::string head = text.substr(0, colon);
  std::string arg = colon == std::string::npos ? "" : trim(text.substr(colon + 1));
  bool has_arg = colon != std::string::npos;
  if (head == "save-all" && !has_arg) return save_all();
  if (head == "every-layer" && !has_arg) return every_layer();
  if (head == "every-k" && has_arg) {
    // digits only (no sign, no spaces inside), and a value that fits in int
    int k = 0;
    const char* end = arg.data() + arg.size();
    auto [ptr, ec] = std::from_chars(arg.data(), end, k);
    REMAT_CHECK(!arg.empty() && std::isdigit(static_cast<unsigned char>(arg[0])) && ec != std::errc::result_out_of_range,
                "cannot parse policy '", raw, "': K must be a positive integer of at most ",
                std::numeric_limits<int>::max(), "; ", kValidForms);
    REMAT_CHECK(ec == std::errc() && ptr == end && k >= 1, "cannot parse policy '", raw,
                "': K must be a positive integer; ", kValidForms);
    return every_k(k);
  }
  if (head == "selective" && has_arg) {
    std::vector<std::string> ops;
    size_t start = 0;
    while (start <= arg.size()) {
      size_t comma = arg.find(',', start);
      std::string op = trim(arg.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      REMAT_CHECK(!op.empty(), "cannot parse policy '", raw, "': empty op name; ", kValidForms);
      ops.push_back(op);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    try {
      return selective(ops);
    } catch (const Error& e) {
      throw Error(detail::concat("cannot parse policy '", raw, "': ", e.what()));
    }
  }
  if (head == "budget" && has_arg) {
    size_t bytes = 0;
    try {
      bytes = memory::parse_bytes(arg);
    } catch (const Error& e) {
      throw Error(detail::concat("cannot parse policy '", raw, "': ", e.what(), "; ", kValidForms));
    }
    REMAT_CHECK(bytes > 0, "cannot parse policy '", raw, "': the budget must be positive; ", kValidForms);
    return budget(bytes);
  }
  throw Error(detail::concat("cannot parse policy '", raw, "'; ", kValidForms));
}

std::string Policy::to_string() const {
  switch (kind) {
    case Kind::save_all: return "save-all";
    case Kind::every_layer: return "every-layer";
    case Kind::every_k: return "every-k:" + std::to_string(k);
    case Kind::selective: {
      std::string s = "selective:";
      for (size_t i = 0; i < ops.size(); ++i) s += (i ? "," : "") + ops[i];
      return s;
    }
    case Kind::budget: return "budget:" + std::to_string(budget_bytes);
  }
  return "?";
}

bool Policy::keeps_op(const std::string& op) const {
  return kind == Kind::selective && std::find(ops.begin(), ops.end(), op) != ops.end();
}

Policy current_policy() { return scoped_policy.value_or(Policy::every_layer()); }

ScopedPolicy::ScopedPolicy(Policy policy) : previous_(scoped_policy) { scoped_policy = std::move(policy); }
ScopedPolicy::~ScopedPolicy() { scoped_policy = previous_; }

}  // namespace remat
