// Offloading saved values (policy offload:DIR): an OffloadScope installs saved-value hooks that hand
// values to an offload store (offload_store.cpp, Note [offload threads]); OffloadGate and
// OffloadPlanNode set what a budget plan's store writes. The contract is in include/remat/offload.h.
#include <memory>
#include <utility>

#include "offload_store.h"
#include "remat/offload.h"
#include "remat/saved_hooks.h"

namespace remat {

namespace detail {

thread_local OffloadGate::Mode offload_gate = OffloadGate::Mode::threshold;
thread_local size_t offload_cap = 0;
thread_local std::shared_ptr<const OffloadReadPlan> offload_reads;
thread_local int offload_plan_node = -1;

namespace {

thread_local int offload_scopes = 0;

}  // namespace

bool offload_running() { return offload_scopes > 0; }

OffloadGate::OffloadGate(Mode mode) : previous_(offload_gate), previous_cap_(offload_cap), previous_reads_(offload_reads) {
  offload_gate = mode;
}
OffloadGate::OffloadGate(Mode mode, size_t saved_cap_bytes, std::shared_ptr<const OffloadReadPlan> reads)
    : OffloadGate(mode) {
  offload_cap = saved_cap_bytes;
  offload_reads = std::move(reads);
}
OffloadGate::~OffloadGate() {
  offload_gate = previous_;
  offload_cap = previous_cap_;
  offload_reads = std::move(previous_reads_);
}
OffloadPlanNode::OffloadPlanNode(int node) : previous_(offload_plan_node) { offload_plan_node = node; }
OffloadPlanNode::~OffloadPlanNode() { offload_plan_node = previous_; }

OffloadEntry::~OffloadEntry() {
  if (store) store->release_entry(*this);
}

}  // namespace detail

struct OffloadScope::State {
  std::shared_ptr<detail::OffloadStore> store;
  std::unique_ptr<ScopedSavedTensorHooks> hooks;
};

OffloadScope::OffloadScope(const OffloadTarget& options, const OffloadFaults& faults) : state_(std::make_unique<State>()) {
  REMAT_CHECK(options.directory.find('\0') == std::string::npos, "offload: the directory contains a NUL byte");
  state_->store = std::make_shared<detail::OffloadStore>(options, faults);
  std::shared_ptr<detail::OffloadStore> store = state_->store;
  SavedTensorHooks hooks;
  hooks.pack = [store](const Tensor& storage) -> PackedValue { return store->pack(storage); };
  hooks.unpack = [](const PackedValue& packed) {
    auto entry = std::static_pointer_cast<detail::OffloadEntry>(packed);
    return entry->store->unpack(entry);
  };
  hooks.prefetch = [](const PackedValue& packed) {
    auto entry = std::static_pointer_cast<detail::OffloadEntry>(packed);
    entry->store->prefetch(entry);
  };
  hooks.repack = [](const PackedValue& packed) {
    auto entry = std::static_pointer_cast<detail::OffloadEntry>(packed);
    entry->store->saved_again(*entry);
  };
  state_->hooks = std::make_unique<ScopedSavedTensorHooks>(std::move(hooks));
  ++detail::offload_scopes;
}

void OffloadScope::wait_for_writes() { state_->store->wait_for_writes(); }

OffloadScope::~OffloadScope() {
  --detail::offload_scopes;
  state_->hooks.reset();
  if (state_->store) state_->store->close_scope();
}

}  // namespace remat
