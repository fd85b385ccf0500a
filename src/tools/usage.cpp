#include "usage.h"

#include <algorithm>

#include "remat/memory.h"

namespace remat::tools {

size_t parse_bytes_option(const std::string& what, const std::string& text) {
  try {
    return memory::parse_bytes(text);
  } catch (const Error& e) {
    throw UsageError(detail::concat(what, ": ", e.what()));
  }
}

size_t edit_distance(const std::string& a, const std::string& b) {
  // optimal string alignment distance, three rows
  const size_t n = a.size(), m = b.size();
  std::vector<size_t> before(m + 1), previous(m + 1), current(m + 1);
  for (size_t j = 0; j <= m; ++j) previous[j] = j;
  for (size_t i = 1; i <= n; ++i) {
    current[0] = i;
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        current[j] = std::min(current[j], before[j - 2] + 1);
    }
    before.swap(previous);
    previous.swap(current);
  }
  return previous[m];
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  const size_t allowed = word.size() <= 4 ? 1 : word.size() <= 8 ? 2 : 3;
  std::string best;
  size_t best_distance = allowed + 1;
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

}  // namespace remat::tools
