#include "remat/policy.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>

#include "remat/autodiff.h"
#include "remat/dynamic.h"
#include "remat/offload.h"
#include "remat/error.h"
#include "remat/memory.h"

namespace remat {

namespace {
thread_local std::optional<Policy> scoped_policy;

const char* kValidForms =
    "valid forms: save-all, every-layer, every-k:K (K >= 1), selective:OP[,OP...] (e.g. selective:matmul), "
    "budget:BYTES (e.g. budget:64MiB), budget:auto[,limit=BYTES], dynamic:BYTES (e.g. dynamic:64MiB), "
    "offload:DIR[,threshold=BYTES][,ram=BYTES] (e.g. offload:/tmp,threshold=1MiB), and KEEP+offload:DIR[,...] "
    "for any of the first six (e.g. every-layer+offload:/tmp; dynamic: without ram=)";

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::string trim_left(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a);
}

// The text of a number (K, a byte count): spaces before it are ignored as around any separator,
// but nothing may follow it, not even a space (the parse is strict).
std::string number_text(const std::string& text, const std::string& raw) {
  const std::string number = trim_left(text);
  REMAT_CHECK(number.empty() || (number.back() != ' ' && number.back() != '\t'), "cannot parse policy '", raw,
              "': nothing may follow the number '", trim(number), "', not even a space; ", kValidForms);
  return number;
}
}  // namespace

Policy Policy::every_k(int k) {
  REMAT_CHECK(k >= 1, "policy every-k: K must be at least 1, got ", k);
  Policy p = every_layer();
  p.keep.kind = Kind::every_k;
  p.keep.k = k;
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
  p.keep.kind = Kind::selective;
  p.keep.ops = std::move(ops);
  return p;
}

Policy Policy::budget(size_t bytes) {
  REMAT_CHECK(bytes > 0, "policy budget: the budget must be positive");
  Policy p = every_layer();
  p.keep.kind = Kind::budget;
  p.keep.budget_bytes = bytes;
  return p;
}

Policy Policy::budget_from_memory(size_t memory_limit_bytes) {
  Policy p = every_layer();
  p.keep.kind = Kind::budget;
  p.keep.budget_auto = true;
  p.keep.memory_limit_bytes = memory_limit_bytes;
  return p;
}

Policy Policy::dynamic(size_t bytes) {
  REMAT_CHECK(bytes > 0, "policy dynamic: the budget must be positive");
  Policy p = save_all();
  p.saved.dynamic_bytes = bytes;
  return p;
}

Policy Policy::offload(std::string directory, size_t threshold_bytes, size_t ram_bytes) {
  return save_all().with_offload(OffloadTarget{std::move(directory), threshold_bytes, ram_bytes});
}

Policy Policy::with_offload(OffloadTarget target) const {
  REMAT_CHECK(!target.directory.empty(), "policy offload: the directory is empty");
  REMAT_CHECK(target.directory.find('\0') == std::string::npos, "policy offload: the directory contains a NUL byte");
  Policy p = *this;
  p.saved.offload.reset();
  REMAT_CHECK(saved.dynamic_bytes == 0 || target.ram_bytes == 0, "policy ", p.to_string(), "+", target.to_string(),
              ": ram= does not apply to dynamic:+offload: (its evicted values are written by the evicting thread, "
              "none is in flight); leave it out");
  p.saved.offload = std::move(target);
  return p;
}

void Policy::validate() const {
  if (keep.kind == Kind::every_k) REMAT_CHECK(keep.k >= 1, "policy every-k: K must be at least 1, got ", keep.k);
  if (keep.kind == Kind::selective) (void)selective(keep.ops);
  if (keep.kind == Kind::budget && !keep.budget_auto)
    REMAT_CHECK(keep.budget_bytes > 0, "policy budget: the budget must be positive");
  REMAT_CHECK(saved.dynamic_bytes == 0 || keep.kind == Kind::save_all, "policy ", to_string(),
              ": dynamic: decides value by value what is kept, so its keep axis is save-all (write dynamic:",
              saved.dynamic_bytes, " alone, or give the layers that should be regions a policy of their own)");
  if (saved.offload) (void)Policy{keep, Saved{saved.dynamic_bytes, {}}}.with_offload(*saved.offload);
}

namespace {

// "DIR[,threshold=BYTES][,ram=BYTES]" (the part after "offload:"); `raw` is the whole policy text.
OffloadTarget parse_offload_target(const std::string& arg, const std::string& raw) {
  std::vector<std::string> parts;  // the directory trimmed, each option with its trailing spaces (number_text)
  size_t start = 0;
  while (true) {
    size_t comma = arg.find(',', start);
    const std::string part = arg.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    parts.push_back(parts.empty() ? trim(part) : trim_left(part));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  REMAT_CHECK(!parts[0].empty(), "cannot parse policy '", raw, "': the directory is empty; ", kValidForms);
  OffloadTarget target;
  target.directory = parts[0];
  bool seen_threshold = false, seen_ram = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const size_t eq = parts[i].find('=');
    const std::string key = eq == std::string::npos ? parts[i] : parts[i].substr(0, eq);
    REMAT_CHECK(eq != std::string::npos && (key == "threshold" || key == "ram"), "cannot parse policy '", raw,
                "': unknown offload option '", trim(parts[i]), "' (threshold=BYTES or ram=BYTES); ", kValidForms);
    bool& seen = key == "threshold" ? seen_threshold : seen_ram;
    REMAT_CHECK(!seen, "cannot parse policy '", raw, "': the offload option ", key, " is given twice; ", kValidForms);
    seen = true;
    const std::string number = number_text(parts[i].substr(eq + 1), raw);
    try {
      (key == "threshold" ? target.threshold_bytes : target.ram_bytes) = memory::parse_bytes(number);
    } catch (const Error& e) {
      throw Error(detail::concat("cannot parse policy '", raw, "': ", key, ": ", e.what(), "; ", kValidForms));
    }
  }
  return target;
}

size_t parse_budget_bytes(const std::string& arg, const std::string& raw) {
  const std::string number = number_text(arg, raw);
  size_t bytes = 0;
  try {
    bytes = memory::parse_bytes(number);
  } catch (const Error& e) {
    throw Error(detail::concat("cannot parse policy '", raw, "': ", e.what(), "; ", kValidForms));
  }
  REMAT_CHECK(bytes > 0, "cannot parse policy '", raw, "': the budget must be positive; ", kValidForms);
  return bytes;
}

// "auto" or "auto,limit=BYTES" (the part after "budget:").
Policy parse_auto_budget(const std::string& arg, const std::string& raw) {
  if (trim(arg) == "auto") return Policy::budget_from_memory();
  const std::string prefix = "auto,";
  const std::string option = trim_left(trim_left(arg).substr(prefix.size()));
  REMAT_CHECK(option.rfind("limit=", 0) == 0, "cannot parse policy '", raw, "': unknown budget:auto option '",
              trim(option), "' (limit=BYTES); ", kValidForms);
  const std::string number = number_text(option.substr(6), raw);
  size_t limit = 0;
  try {
    limit = memory::parse_bytes(number);
  } catch (const Error& e) {
    throw Error(detail::concat("cannot parse policy '", raw, "': limit: ", e.what(), "; ", kValidForms));
  }
  REMAT_CHECK(limit > 0, "cannot parse policy '", raw, "': the memory limit must be positive; ", kValidForms);
  return Policy::budget_from_memory(limit);
}

std::vector<std::string> parse_op_list(const std::string& arg, const std::string& raw) {
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
  return ops;
}

int parse_k(const std::string& arg, const std::string& raw) {
  // digits only (no sign, no spaces inside), and a value that fits in int
  int k = 0;
  const char* end = arg.data() + arg.size();
  auto [ptr, ec] = std::from_chars(arg.data(), end, k);
  REMAT_CHECK(!arg.empty() && std::isdigit(static_cast<unsigned char>(arg[0])) && ec != std::errc::result_out_of_range,
              "cannot parse policy '", raw, "': K must be a positive integer of at most ",
              std::numeric_limits<int>::max(), "; ", kValidForms);
  REMAT_CHECK(ec == std::errc() && ptr == end && k >= 1, "cannot parse policy '", raw, "': K must be a positive integer; ",
              kValidForms);
  return k;
}

// One form of the keep axis (no "+"), or offload:... alone; `raw` is the whole policy text. `text`
// keeps its trailing spaces: a name ignores them, a number refuses them (number_text).
Policy parse_one(const std::string& text, const std::string& raw) {
  auto colon = text.find(':');
  std::string head = trim(text.substr(0, colon));
  const std::string untrimmed_arg = colon == std::string::npos ? "" : text.substr(colon + 1);
  std::string arg = trim(untrimmed_arg);
  bool has_arg = colon != std::string::npos;
  if (head == "save-all" && !has_arg) return Policy::save_all();
  if (head == "every-layer" && !has_arg) return Policy::every_layer();
  if (head == "every-k" && has_arg) return Policy::every_k(parse_k(number_text(untrimmed_arg, raw), raw));
  if (head == "selective" && has_arg) {
    std::vector<std::string> ops = parse_op_list(arg, raw);
    try {
      return Policy::selective(ops);
    } catch (const Error& e) {
      throw Error(detail::concat("cannot parse policy '", raw, "': ", e.what()));
    }
  }
  if (head == "budget" && has_arg && (arg == "auto" || arg.rfind("auto,", 0) == 0))
    return parse_auto_budget(untrimmed_arg, raw);
  if (head == "budget" && has_arg) return Policy::budget(parse_budget_bytes(untrimmed_arg, raw));
  if (head == "dynamic" && has_arg) return Policy::dynamic(parse_budget_bytes(untrimmed_arg, raw));
  if (head == "offload" && has_arg) return Policy::save_all().with_offload(parse_offload_target(untrimmed_arg, raw));
  throw Error(detail::concat("cannot parse policy '", raw, "'; ", kValidForms));
}

}  // namespace

// KEEP or KEEP+offload:...: the keep axis never contains '+', the offload directory may, so the
// text splits at its first '+' (offload:DIR alone is read whole).
Policy Policy::parse(const std::string& raw) {
  const std::string text = trim_left(raw);  // trailing spaces: each part decides (parse_one)
  const size_t plus = text.find('+');
  if (text.rfind("offload:", 0) == 0 || plus == std::string::npos) return parse_one(text, raw);
  Policy keep = parse_one(text.substr(0, plus), raw);
  const std::string placement = trim_left(text.substr(plus + 1));
  REMAT_CHECK(placement.rfind("offload:", 0) == 0, "cannot parse policy '", raw,
              "': after '+' comes where kept values live, offload:DIR[,...], got '", trim(placement), "'; ",
              kValidForms);
  try {
    return keep.with_offload(parse_offload_target(placement.substr(8), raw));
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.rfind("cannot parse policy", 0) == 0) throw;
    throw Error(detail::concat("cannot parse policy '", raw, "': ", what));
  }
}

std::string Keep::to_string() const {
  switch (kind) {
    case Kind::save_all: return "save-all";
    case Kind::every_layer: return "every-layer";
    case Kind::every_k: return "every-k:" + std::to_string(k);
    case Kind::selective: {
      std::string text = "selective:";
      for (size_t i = 0; i < ops.size(); ++i) text += (i ? "," : "") + ops[i];
      return text;
    }
    case Kind::budget:
      if (!budget_auto) return "budget:" + std::to_string(budget_bytes);
      return memory_limit_bytes ? "budget:auto,limit=" + std::to_string(memory_limit_bytes) : "budget:auto";
  }
  return "?";
}

bool Keep::keeps_op(const std::string& op) const {
  return kind == Kind::selective && std::find(ops.begin(), ops.end(), op) != ops.end();
}

// The text parse_offload_target reads back.
std::string OffloadTarget::to_string() const {
  std::string s = "offload:" + directory + ",threshold=" + std::to_string(threshold_bytes);
  if (ram_bytes > 0) s += ",ram=" + std::to_string(ram_bytes);
  return s;
}

std::string Saved::to_string() const {
  if (in_memory()) return "memory";
  const std::string dynamic = dynamic_bytes ? "dynamic:" + std::to_string(dynamic_bytes) : "";
  if (!offload) return dynamic;
  return dynamic.empty() ? offload->to_string() : dynamic + "+" + offload->to_string();
}

// save-all with a placement prints as the placement alone (offload:DIR, dynamic:N, both).
std::string Policy::to_string() const {
  if (saved.in_memory()) return keep.to_string();
  if (keep.kind == Kind::save_all) return saved.to_string();
  return keep.to_string() + "+" + saved.to_string();
}

Policy current_policy() { return scoped_policy.value_or(Policy::every_layer()); }

namespace {
// The policy whose runtime a ScopedPolicy started on this thread (none: no runtime, or one made
// directly as a DynamicScope / OffloadScope).
thread_local std::optional<std::string> runtime_policy;
}  // namespace

ScopedPolicy::ScopedPolicy(Policy policy) : previous_(scoped_policy) {
  policy.validate();
  if (policy.saved.has_runtime()) {
    const std::string text = policy.saved.to_string();  // the runtime it starts
    if (detail::dynamic_running() || detail::offload_running()) {
      // the same runtime, or dynamic:N inside dynamic:N+offload:... (the keep axis of the running one)
      const bool same = runtime_policy && (*runtime_policy == text || (!policy.saved.offload &&
                                                                     runtime_policy->rfind(text + "+", 0) == 0));
      REMAT_CHECK(same, "policy ", policy.to_string(), ": cannot start inside ",
                  runtime_policy ? "policy " + *runtime_policy : std::string("a DynamicScope or OffloadScope"),
                  ", which is running on this thread (one dynamic: or offload: runtime at a time); end it first");
    } else if (policy.saved.dynamic_bytes > 0) {
      runtime_ = std::make_shared<DynamicScope>(policy.saved.dynamic_bytes, policy.saved.offload);
    } else {
      auto scope = std::make_shared<OffloadScope>(*policy.saved.offload);
      offload_ = scope.get();
      runtime_ = std::move(scope);
    }
    if (runtime_) runtime_policy = text;
  }
  scoped_policy = std::move(policy);
}
void ScopedPolicy::wait_for_offload_writes() const {
  if (offload_) offload_->wait_for_writes();
}

ScopedPolicy::~ScopedPolicy() {
  scoped_policy = previous_;
  if (runtime_) runtime_policy.reset();
  runtime_.reset();
}

}  // namespace remat
