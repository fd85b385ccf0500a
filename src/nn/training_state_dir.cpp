// Training states in a directory (remat/nn/training_state.h): a state's path by step, the newest
// complete one, and pruning to the newest few.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "remat/error.h"
#include "remat/nn/training_state.h"
#include "training_state_names.h"

namespace remat::nn {

namespace {

namespace fs = std::filesystem;
using namespace state_names;

// The step of a state directory's name (step-NNNNNNNN), or -1 for any other name.
int64_t step_of(const std::string& name) {
  if (name.rfind(kStepPrefix, 0) != 0) return -1;
  const std::string digits = name.substr(std::strlen(kStepPrefix));
  if (digits.size() < 8 || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stoll(digits);
}

// The complete states under `directory`, by step.
std::map<int64_t, fs::path> states_under(const std::string& directory) {
  std::map<int64_t, fs::path> states;
  std::error_code ec;
  for (fs::directory_iterator it(directory, ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t step = step_of(it->path().filename().string());
    std::error_code e;
    if (step >= 0 && fs::is_regular_file(it->path() / kManifest, e)) states[step] = it->path();
  }
  return states;
}

}  // namespace

std::string training_state_path(const std::string& directory, int64_t step) {
  REMAT_CHECK(step >= 0, "training_state_path: negative step ", step);
  char name[32];
  std::snprintf(name, sizeof name, "%s%08lld", kStepPrefix, static_cast<long long>(step));
  return (fs::path(directory) / name).string();
}

std::string latest_training_state(const std::string& directory) {
  const std::map<int64_t, fs::path> states = states_under(directory);
  return states.empty() ? std::string() : states.rbegin()->second.string();
}

void prune_training_states(const std::string& directory, int keep) {
  std::map<int64_t, fs::path> states = states_under(directory);
  std::error_code ec;
  while (static_cast<int>(states.size()) > std::max(keep, 0)) {
    // renamed first, so that a kill in the middle of the removal leaves a partial directory (removed
    // below, now or by the next prune), never a state with files missing
    const fs::path& old = states.begin()->second;
    fs::path doomed = old;
    doomed += kPartial;
    fs::remove_all(doomed, ec);
    fs::rename(old, doomed, ec);
    fs::remove_all(ec ? old : doomed, ec);
    states.erase(states.begin());
  }
  std::vector<fs::path> partial;
  for (fs::directory_iterator it(directory, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t suffix = name.size() >= std::strlen(kPartial) ? name.size() - std::strlen(kPartial) : 0;
    if (name.compare(suffix, std::string::npos, kPartial) == 0 && step_of(name.substr(0, suffix)) >= 0)
      partial.push_back(it->path());
  }
  for (const fs::path& p : partial) fs::remove_all(p, ec);
}

}  // namespace remat::nn
