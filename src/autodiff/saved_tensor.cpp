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
  uint64_t version = 0;  // of the original when packed: a storage written since is another value
  DType dtype = DType::f32;
  int64_t numel = 0;
  size_t bytes = 0;
};

namespace {

thread_local std::vector<std::shared_ptr<hooks_detail::HooksState>> hooks_stack;
thread_local bool inside_hook = false;  // a hook's own ops never pack

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

// Note [hooks that decline]. Hooks nest, and the innermost may not want every value: a checkpoint
// segment drops the values it can make again and declines the rest (a parameter, a value made
// before it opened), which must then be kept exactly as if the segment were not there: packed by
// the hooks around it (an offload target, an enclosing segment that made it), or held plainly.
// So a SavedTensor asks the hooks from the innermost outwards, and the first that packs the value
// keeps it; a declined storage is not remembered, and is asked about again at its next save.
//
// The packed form of `storage` under `state`: packed now, shared with an earlier save, or null
// where the hooks decline it.
std::shared_ptr<PackedStorage> pack_storage(const std::shared_ptr<hooks_detail::HooksState>& state,
                                                    const std::shared_ptr<Storage>& storage, DType dtype) {
  auto it = state->packed.find(storage.get());
  if (it != state->packed.end()) {
    std::shared_ptr<PackedStorage> existing = it->second.lock();
    if (existing && existing->original.lock() == storage && existing->dtype == dtype &&
        existing->version == storage->version()) {
      if (state->hooks.repack) {
        InsideHook guard;
        state->hooks.repack(existing->value);
      }
      return existing;
    }
  }
  PackedValue value;
  {
    InsideHook guard;
    value = state->hooks.pack(whole_storage(storage, dtype));
  }
  if (!value) return nullptr;  // declined: the enclosing hooks (or none) keep it
  auto packed = std::make_shared<PackedStorage>();
  packed->state = state;
  if (state->hooks.prefetch) ++hooks_detail::prefetching_packed;
  packed->original = storage;
  packed->version = storage->version();
  packed->dtype = dtype;
  packed->bytes = storage->bytes();
  packed->numel = static_cast<int64_t>(storage->bytes() / dtype_size(dtype));
  packed->value = std::move(value);
  state->packed[storage.get()] = packed;
  if (state->packed.size() > 64 && state->packed.size() % 64 == 0) {
    for (auto i = state->packed.begin(); i != state->packed.end();)
      i = i->second.expired() ? state->packed.erase(i) : std::next(i);
  }
  return packed;
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
  // the innermost hooks that take it (Note [hooks that decline])
  for (size_t h = hooks_stack.size(); h-- > 0 && !inside_hook && !packed_;)
    packed_ = pack_storage(hooks_stack[h], value.storage(), value.dtype());
  if (packed_) {
    const std::shared_ptr<Storage>& storage = value.storage();
    offset_ = value.offset();
    shape_ = value.shape();
    strides_ = value.strides();
    dtype_ = value.dtype();
    version_ = storage->version();
    watch_ = storage->version_watch();
    return;
  }
  value_ = value.detach();  // no grad_fn: no cycle through the node that keeps it
  version_ = value_.storage()->version();
  value_.storage()->add_saved_reference();
}

SavedTensor::~SavedTensor() { release(); }

SavedTensor::SavedTensor(SavedTensor&& other) noexcept
    : value_(std::move(other.value_)), packed_(std::move(other.packed_)), offset_(other.offset_),
      shape_(std::move(other.shape_)), strides_(std::move(other.strides_)), dtype_(other.dtype_),
      watch_(std::move(other.watch_)), version_(other.version_), released_(other.released_) {
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
    watch_ = std::move(other.watch_);
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
  if (packed_) {
    // the watch, not the storage: the hooks may have let the storage go, and a write made before it
    // was freed is still a write
    REMAT_CHECK(*watch_ == version_, "a tensor of shape ", shape_str(shape_),
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
