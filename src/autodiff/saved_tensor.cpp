// SavedTensor: the one holder of values kept for a backward pass, with or without saved-value
// hooks (remat/saved_hooks.h).
#include <algorithm>
#include <atomic>
#include <unordered_map>
#include <vector>

#include "remat/autodiff.h"
#include "remat/saved_hooks.h"
#include "state.h"

namespace remat::autodiff {

struct PackedStorage;

namespace hooks_detail {

// The hooks in force on a thread, and what they packed (by storage: each storage packs once).
struct HooksState {
  SavedTensorHooks hooks;
  std::unordered_map<const Storage*, std::weak_ptr<PackedStorage>> packed;
};

std::atomic<int64_t> prefetching_packed{0};  // live packed storages whose hooks can prefetch

}  // namespace hooks_detail

struct PackedStorage {
  ~PackedStorage() {
    if (state && state->hooks.prefetch) --hooks_detail::prefetching_packed;
  }
  std::shared_ptr<hooks_detail::HooksState> state;  // the hooks that packed it unpack it
  PackedValue value;
  std::weak_ptr<Storage> original;
  DType dtype = DType::f32;
  int64_t numel = 0;
  size_t bytes = 0;
};

namespace {

thread_local std::vector<std::shared_ptr<hooks_detail::HooksState>> hooks_stack;
thread_local bool inside_hook = false;  // a hook's own ops never pack
thread_local StreamProbe* stream_probe = nullptr;

// A contiguous 1-D tensor over the whole of `storage`, read as `dtype`.
Tensor whole_storage(const std::shared_ptr<Storage>& storage, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = storage;
  impl->offset = 0;
  impl->dtype = dtype;
  impl->shape = {static_cast<int64_t>(storage->bytes() / dtype_size(dtype))};
  impl->strides = {1};
  return Tensor(impl);
}

class InsideHook {
 public:
  InsideHook() : previous_(inside_hook) { inside_hook = true; }
  ~InsideHook() { inside_hook = previous_; }
  InsideHook(const InsideHook&) = delete;
  InsideHook& operator=(const InsideHook&) = delete;

 private:
  bool previous_;
};

// The packed form of `storage` under `state`: packed now, or shared with an earlier save.
std::shared_ptr<PackedStorage> pack_storage(const std::shared_ptr<hooks_detail::HooksState>& state,
                                                    const std::shared_ptr<Storage>& storage, DType dtype) {
  auto it = state->packed.find(storage.get());
  if (it != state->packed.end()) {
    std::shared_ptr<PackedStorage> existing = it->second.lock();
    if (existing && existing->original.lock() == storage && existing->dtype == dtype) {
      if (state->hooks.repack) {
        InsideHook guard;
        state->hooks.repack(existing->value);
      }
      return existing;
    }
  }
  auto packed = std::make_shared<PackedStorage>();
  packed->state = state;
  if (state->hooks.prefetch) ++hooks_detail::prefetching_packed;
  packed->original = storage;
  packed->dtype = dtype;
  packed->bytes = storage->bytes();
  packed->numel = static_cast<int64_t>(storage->bytes() / dtype_size(dtype));
  {
    InsideHook guard;
    packed->value = state->hooks.pack(whole_storage(storage, dtype));
  }
  state->packed[storage.get()] = packed;
  if (state->packed.size() > 64 && state->packed.size() % 64 == 0) {
    for (auto i = state->packed.begin(); i != state->packed.end();)
      i = i->second.expired() ? state->packed.erase(i) : std::next(i);
  }
  return packed;
}

// The probe's key for a saved value: its packed form with hooks, else its storage.
const void* probe_key(const std::shared_ptr<PackedStorage>& packed, const Tensor& value) {
  return packed ? static_cast<const void*>(packed.get()) : value.storage().get();
}

}  // namespace

int saved_holders(const Storage& storage) {
  int holders = storage.saved_references();
  if (hooks_stack.empty()) return holders;
  const auto& packed = hooks_stack.back()->packed;
  if (auto it = packed.find(&storage); it != packed.end()) holders += static_cast<int>(it->second.use_count());
  return holders;
}

bool counted_as_saved(const Storage& storage) {
  return storage.tag() == memory::Tag::saved || storage.tag() == memory::Tag::other;
}

SavedTensor::SavedTensor(const Tensor& value) {
  if (!value.defined()) return;
  // a value a recomputation deferred (Storage's deferred constructor): computed now, on this thread
  if (value.storage()->pending()) value.storage()->data();
  // what the probe does not count: a storage held before, or not the saved bytes' (a parameter)
  const bool held_before =
      stream_probe && (saved_holders(*value.storage()) > 0 || !counted_as_saved(*value.storage()));
  if (!hooks_stack.empty() && !inside_hook) {
    const std::shared_ptr<Storage>& storage = value.storage();
    packed_ = pack_storage(hooks_stack.back(), storage, value.dtype());
    if (stream_probe) stream_probe->saved(packed_.get(), packed_->bytes, held_before);
    offset_ = value.offset();
    shape_ = value.shape();
    strides_ = value.strides();
    dtype_ = value.dtype();
    original_ = storage;
    version_ = storage->version();
    return;
  }
  value_ = value.detach();  // no grad_fn: no cycle through the node that keeps it
  version_ = value_.storage()->version();
  value_.storage()->add_saved_reference();
  if (stream_probe) stream_probe->saved(value_.storage().get(), value_.storage()->bytes(), held_before);
}

SavedTensor::~SavedTensor() { release(); }

SavedTensor::SavedTensor(SavedTensor&& other) noexcept
    : value_(std::move(other.value_)), packed_(std::move(other.packed_)), offset_(other.offset_),
      shape_(std::move(other.shape_)), strides_(std::move(other.strides_)), dtype_(other.dtype_),
      original_(std::move(other.original_)), version_(other.version_), released_(other.released_) {
  other.value_ = Tensor();
  other.packed_.reset();
}

SavedTensor& SavedTensor::operator=(SavedTensor&& other) noexcept {
  if (this != &other) {
    release();
    value_ = std::move(other.value_);
    packed_ = std::move(other.packed_);
    offset_ = other.offset_;
    shape_ = std::move(other.shape_);
    strides_ = std::move(other.strides_);
    dtype_ = other.dtype_;
    original_ = std::move(other.original_);
    version_ = other.version_;
    released_ = other.released_;
    other.value_ = Tensor();
    other.packed_.reset();
  }
  return *this;
}

Tensor SavedTensor::get() const {
  REMAT_CHECK(!released_, "a value saved for the backward pass was already freed: the graph was run backward "
                          "once already (pass retain_graph=true to run it again)");
  if (stream_probe && defined()) stream_probe->read(probe_key(packed_, value_));
  if (packed_) {
    if (std::shared_ptr<Storage> original = original_.lock())
      REMAT_CHECK(original->version() == version_, "a tensor of shape ", shape_str(shape_),
                  " saved for the backward pass was modified in place after it was saved; its gradient would be wrong");
    Tensor storage;
    {
      InsideHook guard;
      storage = packed_->state->hooks.unpack(packed_->value);
    }
    REMAT_CHECK(storage.defined() && storage.dtype() == packed_->dtype && storage.numel() == packed_->numel &&
                    storage.is_contiguous(),
                "saved-value hooks: unpack returned ",
                storage.defined() ? detail::concat(dtype_name(storage.dtype()), " ", shape_str(storage.shape()))
                                  : std::string("an undefined tensor"),
                " for a packed storage of ", packed_->numel, " ", dtype_name(packed_->dtype),
                " elements; it must return a contiguous tensor of that dtype and size");
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = storage.storage();
    impl->offset = storage.offset() + offset_;
    impl->shape = shape_;
    impl->strides = strides_;
    impl->dtype = dtype_;
    return Tensor(impl);
  }
  if (!value_.defined()) return Tensor();
  REMAT_CHECK(value_.storage()->version() == version_,
              "a tensor of shape ", shape_str(value_.shape()), " saved for the backward pass was modified in "
              "place after it was saved; its gradient would be wrong");
  return value_.detach();  // a fresh handle each time, so callers may attach history to it
}

void SavedTensor::release() {
  if (stream_probe && !released_ && defined()) stream_probe->released(probe_key(packed_, value_));
  if (value_.defined()) {
    value_.storage()->remove_saved_reference();
    value_ = Tensor();
    released_ = true;
  }
  if (packed_) {
    packed_.reset();
    released_ = true;
  }
}

// Note [a record read back value by value]. A record sent to the offload target need not come
// back whole: each value is read when its backward first reads it and is gone once its last
// holder is released, so while the record's backward runs it keeps in memory only the values
// between their first read and their last use. StreamProbe measures the most such bytes at once
// during a profiling re-run's backward (the engine's order: what the runtime does), keyed by the
// storage (or its packed form, one per storage). A storage another value held before the record
// saved it (its input, which the region keeps; the previous record's output) is the other
// holder's, and a parameter is no saved value: neither is counted, as the record's saved bytes do
// not count them (ChainCosts::streamed_bytes).
StreamProbe::StreamProbe() : previous_(stream_probe) { stream_probe = this; }
StreamProbe::~StreamProbe() { stream_probe = previous_; }

void StreamProbe::saved(const void* key, size_t bytes, bool held_before) {
  if (reading_) return;
  Value& v = values_[key];
  if (v.holders++ == 0) v = Value{bytes, 1, !held_before, false};
}

void StreamProbe::read(const void* key) {
  auto it = values_.find(key);
  if (it == values_.end() || it->second.read) return;
  it->second.read = true;
  if (!it->second.counted) return;
  live_ += it->second.bytes;
  peak_ = std::max(peak_, live_);
}

void StreamProbe::released(const void* key) {
  auto it = values_.find(key);
  if (it == values_.end() || --it->second.holders > 0) return;
  if (it->second.read && it->second.counted) live_ -= it->second.bytes;
  values_.erase(it);  // its address may be a new storage's later
}

size_t SavedTensor::bytes() const {
  if (packed_) return packed_->bytes;
  return value_.defined() ? value_.storage()->bytes() : 0;
}

void SavedTensor::prefetch() const {
  if (!packed_ || !packed_->state->hooks.prefetch) return;
  InsideHook guard;
  packed_->state->hooks.prefetch(packed_->value);
}

bool prefetch_wanted() { return hooks_detail::prefetching_packed.load(std::memory_order_relaxed) > 0; }

}  // namespace remat::autodiff

namespace remat {

ScopedSavedTensorHooks::ScopedSavedTensorHooks(SavedTensorHooks hooks) {
  REMAT_CHECK(static_cast<bool>(hooks.pack) && static_cast<bool>(hooks.unpack),
              "ScopedSavedTensorHooks: both pack and unpack must be set");
  auto state = std::make_shared<autodiff::hooks_detail::HooksState>();
  state->hooks = std::move(hooks);
  autodiff::hooks_stack.push_back(state);
  state_ = state;
}

ScopedSavedTensorHooks::~ScopedSavedTensorHooks() {
  auto it = std::find(autodiff::hooks_stack.begin(), autodiff::hooks_stack.end(),
                      std::static_pointer_cast<autodiff::hooks_detail::HooksState>(state_));
  if (it != autodiff::hooks_stack.end()) autodiff::hooks_stack.erase(it);
}

}  // namespace remat
