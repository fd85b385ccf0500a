// Strict JSON for the files remat reads from outside (safetensors headers, Transformers'
// config.json, `remat plan --costs` files): one linear pass over the text checks its nesting, its
// keys and its size before any value is built; only then is the text parsed into a value.
//
//   const strict_json::Problem p = strict_json::check(text, {.max_depth = 3});
//   if (p.kind != strict_json::Problem::none) throw Error(... p.detail ...);
//   nlohmann::json value = nlohmann::json::parse(text);
//
// Header-only (the command line's tools and the fuzz targets compile it into themselves).
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

namespace remat::io::strict_json {

struct Limits {
  int max_depth = 8;                 // arrays and objects nested at most this many levels
  size_t max_objects = SIZE_MAX;     // objects below the top-level value
};

struct Problem {
  enum Kind { none, invalid, too_deep, repeated_key, too_many_objects } kind = none;
  std::string detail;  // invalid: the parser's message; repeated_key: the key
};

// Note [strict JSON]. nlohmann's parser with a callback (the way to bound depth while parsing)
// rescans the enclosing container's elements each time an object or array ends, so a list of n
// objects costs n^2/2 steps: over two minutes for 100,000 stages under AddressSanitizer. This
// check is a SAX pass with a stack of key sets instead, linear in the text, and the value is then
// built by the plain parser, which is linear too. The first problem met ends the pass, so a
// hostile file is refused without being read to its end.
class Checker {
 public:
  using json = nlohmann::json;
  explicit Checker(const Limits& limits) : limits_(limits) {}
  Problem problem;

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const json::string_t&) { return true; }
  bool string(json::string_t&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(size_t) {
    if (!open(true)) return false;
    if (depth_ > 1 && ++objects_ > limits_.max_objects) return stop(Problem::too_many_objects, "");
    return true;
  }
  bool key(json::string_t& k) {
    return keys_.back().insert(k).second ? true : stop(Problem::repeated_key, k);
  }
  bool end_object() {
    keys_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(size_t) { return open(false); }
  bool end_array() {
    --depth_;
    return true;
  }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& e) {
    return stop(Problem::invalid, e.what());
  }

 private:
  bool open(bool object) {
    if (depth_ >= limits_.max_depth) return stop(Problem::too_deep, "");
    ++depth_;
    if (object) keys_.emplace_back();
    return true;
  }
  bool stop(Problem::Kind kind, std::string detail) {
    problem = {kind, std::move(detail)};
    return false;
  }
  Limits limits_;
  int depth_ = 0;
  size_t objects_ = 0;
  std::vector<std::unordered_set<std::string>> keys_;
};

inline Problem check(std::string_view text, const Limits& limits) {
  Checker checker(limits);
  if (!nlohmann::json::sax_parse(text, &checker) && checker.problem.kind == Problem::none)
    checker.problem = {Problem::invalid, "the parser stopped"};
  return checker.problem;
}

}  // namespace remat::io::strict_json
