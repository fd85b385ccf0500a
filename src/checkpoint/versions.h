// Internal: the versions of the storages a recomputation will read again (Note [what a
// recomputation version-checks] in region.h). Used by scan loops.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "remat/error.h"
#include "remat/memory.h"
#include "remat/tensor.h"

namespace remat::detail {

class ReadVersions {
 public:
  // While the forward runs: every storage an op reads (kept weakly: a storage that dies could not
  // be read again anyway).
  void track(const TensorList& inputs) {
    for (const auto& t : inputs)
      if (t.defined()) reading_.try_emplace(t.storage().get(), t.storage());
  }
  // When the forward is over: the versions to compare against.
  void freeze() {
    for (auto& [raw, weak] : reading_)
      if (auto s = weak.lock()) versions_.emplace_back(weak, s->version());
    reading_.clear();
  }
  // Before a recomputation: throws remat::Error, naming `what`, if a storage was written since.
  void check(const std::string& what) const {
    for (const auto& [weak, version] : versions_) {
      std::shared_ptr<Storage> s = weak.lock();
      if (!s || s->version() == version) continue;
      throw Error(detail::concat(what, ": a tensor (", memory::format_bytes(static_cast<double>(s->bytes())),
                                 " of storage) that it reads was modified in place after the forward pass; "
                                 "recomputing from the new values would give a wrong gradient (save-all raises for "
                                 "the same program: a value saved for the backward pass was modified in place)"));
    }
  }
  void clear() {
    reading_.clear();
    versions_.clear();
  }

 private:
  std::unordered_map<const Storage*, std::weak_ptr<Storage>> reading_;
  std::vector<std::pair<std::weak_ptr<Storage>, uint64_t>> versions_;
};

}  // namespace remat::detail
