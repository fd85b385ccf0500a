#include "costs.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "io/strict_json.h"
#include "remat/error.h"

namespace remat::tools {

namespace {

constexpr int kMaxDepth = 3;                           // {"stages": [{...}]}
constexpr uint64_t kMaxFileBytes = 256ull << 20;       // far above any real chain
constexpr double kMaxSeconds = 1e12;
// The grouped planner's work grows linearly with the stages (about 5 s for 100,000 on one loaded
// core, docs/planners.md): a longer chain is refused here rather than left to run for minutes.
constexpr size_t kMaxStages = 100000;

template <class... Parts>
[[noreturn]] void fail(const std::string& name, Parts&&... parts) {
  throw Error(detail::concat("plan: --costs ", name, ": ", std::forward<Parts>(parts)...));
}

std::string brief(const nlohmann::json& value) {
  std::string text = value.dump();  // depth <= kMaxDepth
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

// JSON nested at most kMaxDepth levels, each key once per object, at most kMaxStages stages
// (every object below the top level is a stage: a stage can hold no object within kMaxDepth),
// checked before anything is built (Note [strict JSON]).
nlohmann::json parse_json(std::string_view text, const std::string& name) {
  using io::strict_json::Problem;
  const Problem p = io::strict_json::check(text, {.max_depth = kMaxDepth, .max_objects = kMaxStages});
  switch (p.kind) {
    case Problem::none:
      return nlohmann::json::parse(text);
    case Problem::too_deep:
      fail(name, "values are nested more than ", kMaxDepth, " levels deep");
    case Problem::repeated_key:
      fail(name, "the key \"", p.detail, "\" appears twice in one object");
    case Problem::too_many_objects:
      fail(name, "the chain has more than ", kMaxStages, " stages; remat plan reads at most ", kMaxStages);
    case Problem::invalid:
      break;
  }
  fail(name, "not valid JSON: ", p.detail);
}

double seconds(const std::string& name, const std::string& where, const nlohmann::json& v) {
  // bounded, so that the planner's sums over a chain stay finite
  if (!v.is_number() || !(v.get<double>() >= 0 && v.get<double>() <= kMaxSeconds))
    fail(name, where, " is ", brief(v), "; it must be a number of seconds from 0 to 1e12");
  return v.get<double>();
}

size_t bytes(const std::string& name, const std::string& where, const nlohmann::json& v) {
  // a JSON integer without sign, fraction or exponent (1.5, 1e30 and -1 are not byte counts)
  if (!v.is_number_unsigned()) fail(name, where, " is ", brief(v), "; it must be a whole number of bytes");
  constexpr uint64_t kLimit = uint64_t{1} << 59;  // the planner's limit on the sum
  if (v.get<uint64_t>() > kLimit) fail(name, where, " is ", v.get<uint64_t>(), " bytes, above the limit of 2^59");
  return static_cast<size_t>(v.get<uint64_t>());
}

// An offload target's cost: a positive number of seconds per byte, at most 1 (far below any disk).
double seconds_per_byte(const std::string& name, const std::string& where, const nlohmann::json& v) {
  if (!v.is_number() || !(v.get<double>() > 0 && v.get<double>() <= 1))
    fail(name, where, " is ", brief(v), "; it must be a number of seconds per byte above 0 and at most 1");
  return v.get<double>();
}

constexpr const char* kWrite = "offload_write_seconds_per_byte";
constexpr const char* kRead = "offload_read_seconds_per_byte";

}  // namespace

schedule::ChainCosts parse_costs(std::string_view text, const std::string& name) {
  const nlohmann::json j = parse_json(text, name);
  const nlohmann::json* stages = &j;
  const nlohmann::json* output = nullptr;
  const nlohmann::json* write = nullptr;
  const nlohmann::json* read = nullptr;
  if (j.is_object()) {
    for (const auto& [key, value] : j.items())
      if (key != "stages" && key != "output_bytes" && key != kWrite && key != kRead)
        fail(name, "unknown key \"", key, "\" (expected \"stages\" and optionally \"output_bytes\", \"", kWrite,
             "\" and \"", kRead, "\")");
    auto it = j.find("stages");
    if (it == j.end()) fail(name, "has no \"stages\"");
    stages = &*it;
    if (auto out = j.find("output_bytes"); out != j.end()) output = &*out;
    if (auto w = j.find(kWrite); w != j.end()) write = &*w;
    if (auto r = j.find(kRead); r != j.end()) read = &*r;
    if ((write == nullptr) != (read == nullptr))
      fail(name, "has \"", write ? kWrite : kRead, "\" but no \"", write ? kRead : kWrite,
           "\" (an offload target's cost is both)");
  }
  if (!stages->is_array() || stages->empty())
    fail(name, "expected a non-empty list of stages, or {\"stages\": [...], \"output_bytes\": N}");
  if (stages->size() > kMaxStages)  // stages that are not objects, which the parser did not count
    fail(name, "the chain has ", stages->size(), " stages; remat plan reads at most ", kMaxStages);
  schedule::ChainCosts c;
  for (size_t i = 0; i < stages->size(); ++i) {
    const nlohmann::json& s = (*stages)[i];
    const std::string where = detail::concat("stage ", i);
    if (!s.is_object()) fail(name, where, " is ", brief(s), ", not an object");
    for (const auto& [key, value] : s.items())
      if (key != "forward_seconds" && key != "backward_seconds" && key != "boundary_bytes" && key != "saved_bytes")
        fail(name, where, " has the unknown key \"", key, "\"");
    auto field = [&](const char* key) -> const nlohmann::json& {
      auto it = s.find(key);
      if (it == s.end())
        fail(name, where, " has no \"", key, "\" (each stage needs forward_seconds, backward_seconds, boundary_bytes "
             "and saved_bytes)");
      return *it;
    };
    c.forward_time.push_back(seconds(name, where + " forward_seconds", field("forward_seconds")));
    c.backward_time.push_back(seconds(name, where + " backward_seconds", field("backward_seconds")));
    c.boundary_bytes.push_back(bytes(name, where + " boundary_bytes", field("boundary_bytes")));
    c.saved_bytes.push_back(bytes(name, where + " saved_bytes", field("saved_bytes")));
  }
  c.boundary_bytes.push_back(output ? bytes(name, "output_bytes", *output) : c.boundary_bytes.back());
  if (write) {
    c.offload_write_seconds_per_byte = seconds_per_byte(name, kWrite, *write);
    c.offload_seconds_per_byte = c.offload_write_seconds_per_byte + seconds_per_byte(name, kRead, *read);
  }
  try {
    c.validate();
  } catch (const std::exception& e) {
    fail(name, e.what());
  }
  return c;
}

schedule::ChainCosts read_costs(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(detail::concat("plan: cannot read the --costs file ", path));
  std::string text;
  char buffer[65536];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    text.append(buffer, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxFileBytes) fail(path, "the file is larger than ", kMaxFileBytes, " bytes");
  }
  if (in.bad()) fail(path, "reading failed");
  return parse_costs(text, path);
}

}  // namespace remat::tools
