#include "remat/policy.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>

#include "remat/autodiff.h"
#include "remat/dynamic.h"
#include "remat/error.h"
#include "remat/memory.h"

namespace remat {

namespace {
thread_local std::optional<Policy> scoped_policy;

const char* kValidForms =
    "valid forms: save-all, every-layer, every-k:K (K >= 1), selective:OP[,OP...] (e.g. selective:matmul), "
    "budget:BYTES (e.g. budget:64MiB), dynamic:BYTES (e.g. dynamic:64MiB), "
    "offload:DIR[,threshold=BYTES][,ram=BYTES] (e.g. offload:/tmp,threshold=1MiB)";

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}
}  // namespace

Policy Policy::every_k(int k) {
  REMAT_CHECK(k >= 1, "policy every-k: K must be at least 1, got ", k);
  Policy p = every_layer();
  p.kind = Kind::every_k;
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
  Policy p = every_layer();
  p.kind = Kind::selective;
  p.ops = std::move(ops);
  return p;
}

Policy Policy::budget(size_t bytes) {
  REMAT_CHECK(bytes > 0, "policy budget: the budget must be positive");
  Policy p = every_layer();
  p.kind = Kind::budget;
  p.budget_bytes = bytes;
  return p;
}

Policy Policy::dynamic(size_t bytes) {
  REMAT_CHECK(bytes > 0, "policy dynamic: the budget must be positive");
  Policy p = every_layer();
  p.kind = Kind::dynamic;
  p.budget_bytes = bytes;
  return p;
}

Policy Policy::offload(std::string directory, size_t threshold_bytes, size_t ram_bytes) {
  REMAT_CHECK(!directory.empty(), "policy offload: the directory is empty");
  REMAT_CHECK(directory.find('\0') == std::string::npos, "policy offload: the directory contains a NUL byte");
  Policy p = every_layer();
  p.kind = Kind::offload;
  p.directory = std::move(directory);
  p.threshold_bytes = threshold_bytes;
  p.ram_bytes = ram_bytes;
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
  if ((head == "budget" || head == "dynamic") && has_arg) {
    size_t bytes = 0;
    try {
      bytes = memory::parse_bytes(arg);
    } catch (const Error& e) {
      throw Error(detail::concat("cannot parse policy '", raw, "': ", e.what(), "; ", kValidForms));
    }
    REMAT_CHECK(bytes > 0, "cannot parse policy '", raw, "': the budget must be positive; ", kValidForms);
    return head == "budget" ? budget(bytes) : dynamic(bytes);
  }
  if (head == "offload" && has_arg) {
    std::vector<std::string> parts;
    size_t start = 0;
    while (true) {
      size_t comma = arg.find(',', start);
      parts.push_back(trim(arg.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    REMAT_CHECK(!parts[0].empty(), "cannot parse policy '", raw, "': the directory is empty; ", kValidForms);
    size_t threshold = size_t{1} << 20, ram = 0;
    bool seen_threshold = false, seen_ram = false;
    for (size_t i = 1; i < parts.size(); ++i) {
      const size_t eq = parts[i].find('=');
      const std::string key = eq == std::string::npos ? parts[i] : parts[i].substr(0, eq);
      REMAT_CHECK(eq != std::string::npos && (key == "threshold" || key == "ram"), "cannot parse policy '", raw,
                  "': unknown offload option '", parts[i], "' (threshold=BYTES or ram=BYTES); ", kValidForms);
      bool& seen = key == "threshold" ? seen_threshold : seen_ram;
      REMAT_CHECK(!seen, "cannot parse policy '", raw, "': the offload option ", key, " is given twice; ", kValidForms);
      seen = true;
      size_t bytes = 0;
      try {
        bytes = memory::parse_bytes(parts[i].substr(eq + 1));
      } catch (const Error& e) {
        throw Error(detail::concat("cannot parse policy '", raw, "': ", key, ": ", e.what(), "; ", kValidForms));
      }
      (key == "threshold" ? threshold : ram) = bytes;
    }
    return offload(parts[0], threshold, ram);
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
    case Kind::dynamic: return "dynamic:" + std::to_string(budget_bytes);
    case Kind::offload: {
      std::string s = "offload:" + directory + ",threshold=" + std::to_string(threshold_bytes);
      if (ram_bytes > 0) s += ",ram=" + std::to_string(ram_bytes);
      return s;
    }
  }
  return "?";
}

bool Policy::keeps_op(const std::string& op) const {
  return kind == Kind::selective && std::find(ops.begin(), ops.end(), op) != ops.end();
}

Policy current_policy() { return scoped_policy.value_or(Policy::every_layer()); }

namespace {
// The policy whose runtime a ScopedPolicy started on this thread (none: no runtime, or one made
// directly as a DynamicScope / OffloadScope).
thread_local std::optional<std::string> runtime_policy;
}  // namespace

ScopedPolicy::ScopedPolicy(Policy policy) : previous_(scoped_policy) {
  if (policy.kind == Policy::Kind::dynamic || policy.kind == Policy::Kind::offload) {
    const std::string text = policy.to_string();
    if (detail::dynamic_running() || detail::offload_running()) {
      REMAT_CHECK(runtime_policy == text, "policy ", text, ": cannot start inside ",
                  runtime_policy ? "policy " + *runtime_policy : std::string("a DynamicScope or OffloadScope"),
                  ", which is running on this thread (one dynamic: or offload: runtime at a time); end it first");
    } else if (policy.kind == Policy::Kind::dynamic) {
      runtime_ = std::make_shared<DynamicScope>(policy.budget_bytes);
    } else {
      OffloadOptions options;
      options.directory = policy.directory;
      options.threshold_bytes = policy.threshold_bytes;
      options.ram_bytes = policy.ram_bytes;
      runtime_ = std::make_shared<OffloadScope>(options);
    }
    if (runtime_) runtime_policy = text;
  }
  scoped_policy = std::move(policy);
}
ScopedPolicy::~ScopedPolicy() {
  scoped_policy = previous_;
  if (runtime_) runtime_policy.reset();
  runtime_.reset();
}

}  // namespace remat
