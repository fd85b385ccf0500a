// Dynamic rematerialization (policy dynamic:BYTES): lineage of every op, eviction of saved
// storages under a byte budget, recomputation on demand. See include/remat/dynamic.h.
//
// Note [cells]. A Cell stands for one storage made by one op call: the op (an OpReplay), which of
// its outputs, and how to get each of its inputs again (the input's own cell and its view on that
// cell's storage, or the input itself when no op made it). A tensor finds its cell through
// TensorImpl::lineage (views share their base's cell); the runtime also maps storages to cells.
// A cell holds its storage only once a SavedTensor packed it ("saved") and until it is evicted;
// otherwise it sees the storage through a weak pointer (the program owns it). Cells hold their
// input cells, so the lineage of every saved value lives as long as the value may be needed.
#include "remat/dynamic.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <unordered_map>

#include "autodiff/history.h"
#include "autodiff/digest.h"
#include "dynamic_internal.h"
#include "autodiff/replay.h"
#include "offload_file.h"
#include "remat/autodiff.h"
#include "remat/memory.h"
#include "remat/saved_hooks.h"
#include "tensor/allocate.h"

namespace remat {

namespace detail {

DynamicCounters& dynamic_counters() {
  thread_local DynamicCounters c;
  return c;
}

namespace {
thread_local int dynamic_scopes = 0;
}
size_t& measured_smallest_budget() {
  thread_local size_t measured = 0;
  return measured;
}
bool dynamic_running() { return dynamic_scopes > 0; }

namespace {

std::string mib(size_t bytes) {
  char text[64];
  std::snprintf(text, sizeof text, "%.3f MiB", static_cast<double>(bytes) / 1048576.0);
  return text;
}

// The cost model of the eviction score: a roofline estimate of an op's time from its FLOPs and
// the bytes it reads and writes, time = FLOPs / F + bytes / M with F / M = 10 FLOP per byte (about
// these CPUs' balance: some 200 GFLOP/s of sgemm against some 20 GB/s of streaming). Counting
// FLOPs alone made an elementwise op (one FLOP per element, by the op layer's default estimate)
// hundreds of times cheaper per byte than the matmul that feeds it, where the two differ by a
// factor of a few in time; the bytes term restores that. It is a formula, not a measurement, so
// eviction decisions stay reproducible (independent of timing noise). Only ratios matter.
double estimated_seconds(double flops, double bytes) { return std::max(1.0, flops) * 1e-11 + bytes * 1e-10; }

bool counts_as_saved(const Storage& s) { return s.tag() == memory::Tag::other || s.tag() == memory::Tag::saved; }

// All of a storage, as a flat tensor.
Tensor whole(const std::shared_ptr<Storage>& storage, DType dtype) {
  return detail::tensor_over(storage, 0, {static_cast<int64_t>(storage->bytes() / dtype_size(dtype))}, {1}, dtype);
}

}  // namespace

class DynamicRuntime;

struct Cell : std::enable_shared_from_this<Cell> {
  struct Input {
    std::shared_ptr<Cell> cell;  // how it was made, or
    Tensor constant;             // the value itself (not made by an op)
    uint64_t version = 0;        // of the storage the op read, when it read it
    int64_t offset = 0;
    Shape shape;
    Strides strides;
    DType dtype = DType::f32;
  };
  std::shared_ptr<DynamicRuntime> runtime;  // kept alive by its cells: a backward may run after the scope
  std::shared_ptr<autodiff::OpReplay> op;  // null: not made by an op (never evicted)
  size_t output = 0;
  std::vector<Input> inputs;
  DType dtype = DType::f32;
  size_t bytes = 0;
  double cost = 0;     // the op's FLOPs (counters)
  double seconds = 0;  // the estimated time of recomputing it (estimated_seconds; the eviction score)
  std::weak_ptr<Storage> live;
  std::shared_ptr<Storage> held;  // saved and resident
  bool counted = false;           // held and counted against the budget
  bool saved = false;             // some SavedTensor stands for it (handles > 0)
  int handles = 0;
  uint64_t last_use = 0;
  int locks = 0;
  uint64_t visit = 0;
  bool listed = false;  // in the runtime's list of held cells
  std::optional<ValueDigest> digest;  // of the storage when it was evicted (Note [recomputation check])
  std::shared_ptr<FileRange> copy;  // dynamic:+offload:, evicted to the file: its bytes there

  ~Cell();
};

// Note [evicting to a file]. Under dynamic:BYTES+offload:DIR an evicted value of at least the
// target's threshold whose recomputation is estimated dearer than writing it out and reading it
// back (the directory's disk bandwidth, measured once per process: Note [measuring the offload
// target] in offload_file.cpp, whose page cache price needs a step's volume, unknown here before
// the step runs; one number for the whole run, so that the
// eviction order within a run does not depend on timing noise) is written to a nameless file in DIR, in
// the scope's thread, before its memory is released; the backward pass reads it back instead of
// recomputing it (its digest is checked as a recomputation's would be). The eviction score uses
// the cheaper of the two ways back. A value already in the file is evicted again without a
// write. A failed write is a remat::Error before anything is released: nothing is lost.
class DynamicRuntime final : public std::enable_shared_from_this<DynamicRuntime>, public autodiff::OpListener {
 public:
  DynamicRuntime(size_t budget, const std::optional<OffloadTarget>& target) : budget_(budget) {
    if (target) {
      file_ = std::make_shared<SlotFile>(target->directory);
      file_threshold_ = target->threshold_bytes;
      file_seconds_per_byte_ = offload_bandwidth(target->directory).seconds_per_byte();
    }
  }

  // ---- lineage (autodiff::OpListener)
  void on_op(autodiff::OpEvent& event) override {
    if (replaying_ > 0) return;
    ++clock_;
    std::shared_ptr<autodiff::OpReplay> replay;
    std::vector<Cell::Input> inputs;
    bool inputs_built = false;
    double touched = 0;  // bytes the op reads and writes
    for (size_t k = 0; k < event.outputs.size(); ++k) {
      Tensor& out = event.outputs[k];
      if (!out.defined()) continue;
      const std::shared_ptr<Storage>& storage = out.storage();
      std::shared_ptr<Cell> shared_with_input;
      bool view = false;
      for (const auto& in : event.inputs)
        if (in.defined() && in.storage() == storage) {
          view = true;
          shared_with_input = cell_of(in);
          break;
        }
      if (view) {  // a view of an input (or the input itself): its storage's cell
        out.impl().lineage = shared_with_input;
        continue;
      }
      if (!inputs_built) {
        for (const auto& in : event.inputs) {
          inputs.push_back(input_ref(in));
          if (in.defined()) touched += static_cast<double>(in.nbytes());
        }
        for (const auto& o : event.outputs)
          if (o.defined()) touched += static_cast<double>(o.nbytes());
        replay = event.make_replay();
        inputs_built = true;
      }
      auto cell = std::make_shared<Cell>();
      cell->runtime = shared_from_this();
      cell->op = replay;
      cell->output = k;
      cell->inputs = inputs;
      cell->dtype = out.dtype();
      cell->bytes = storage->bytes();
      cell->cost = std::max(1.0, event.flops);
      cell->seconds = estimated_seconds(event.flops, touched);
      cell->live = storage;
      cell->last_use = clock_;
      out.impl().lineage = cell;
      by_storage_[storage.get()] = cell;
    }
    if (by_storage_.size() > 4096 && by_storage_.size() % 1024 == 0) prune();
  }

  // ---- saved-value hooks
  PackedValue pack(const Tensor& whole) {
    const std::shared_ptr<Storage>& storage = whole.storage();
    std::shared_ptr<Cell> cell = cell_of(whole);
    if (!cell) {  // not made by an op under this runtime: kept as it is, never evicted
      cell = std::make_shared<Cell>();
      cell->runtime = shared_from_this();
      cell->dtype = whole.dtype();
      cell->bytes = storage->bytes();
      cell->live = storage;
      by_storage_[storage.get()] = cell;
    }
    cell->saved = true;
    cell->last_use = ++clock_;
    if (!cell->held) hold(*cell, storage);
    return std::make_shared<SavedHandle>(cell);
  }

  Tensor unpack(const std::shared_ptr<Cell>& cell) {
    cell->last_use = ++clock_;
    if (!cell->held) {
      if (std::shared_ptr<Storage> s = cell->live.lock()) {
        hold(*cell, s);  // evicted while the program still held it: nothing to recompute
      } else {
        rematerialize(cell, /*keep=*/true);
      }
    }
    return whole(cell->held, cell->dtype);
  }

  void forget(size_t bytes) { resident_ -= bytes; }

  void release(Cell& cell) {
    if (cell.counted) {
      cell.held->remove_saved_reference();
      resident_ -= cell.bytes;
      cell.counted = false;
    }
    cell.held.reset();
  }

 private:
  std::shared_ptr<Cell> cell_of(const Tensor& t) {
    if (!t.defined()) return nullptr;
    if (auto c = std::static_pointer_cast<Cell>(t.impl().lineage))
      if (c->runtime.get() == this && (c->held == t.storage() || c->live.lock() == t.storage())) return c;
    auto it = by_storage_.find(t.storage().get());
    if (it == by_storage_.end()) return nullptr;
    std::shared_ptr<Cell> c = it->second.lock();
    if (c && (c->held == t.storage() || c->live.lock() == t.storage())) return c;
    return nullptr;
  }

  Cell::Input input_ref(const Tensor& in) {
    Cell::Input ref;
    if (!in.defined()) return ref;
    ref.cell = cell_of(in);
    if (!ref.cell) ref.constant = in.detach();
    ref.version = in.storage()->version();
    ref.offset = in.offset();
    ref.shape = in.shape();
    ref.strides = in.strides();
    ref.dtype = in.dtype();
    return ref;
  }

  void prune() {
    for (auto i = by_storage_.begin(); i != by_storage_.end();)
      i = i->second.expired() ? by_storage_.erase(i) : std::next(i);
    held_cells_.erase(std::remove_if(held_cells_.begin(), held_cells_.end(),
                                     [](const std::weak_ptr<Cell>& w) {
                                       auto c = w.lock();
                                       if (c && !c->counted) c->listed = false;
                                       return !c || !c->counted;
                                     }),
                      held_cells_.end());
  }

  // Starts holding `storage` for `cell`, counted against the budget when it is an activation.
  void hold(Cell& cell, const std::shared_ptr<Storage>& storage) {
    if (counts_as_saved(*storage)) {
      make_room(cell.bytes);
      storage->add_saved_reference();
      resident_ += cell.bytes;
      cell.counted = true;
      auto& counters = dynamic_counters();
      counters.peak_held_bytes = std::max(counters.peak_held_bytes, resident_);
    }
    cell.held = storage;
    cell.live = storage;
    if (cell.counted && !cell.listed) {
      held_cells_.push_back(cell.weak_from_this());
      cell.listed = true;
    }
  }

  bool evictable(const Cell& c) const {
    return c.counted && c.op != nullptr && c.locks == 0 && c.held.use_count() == 1;
  }

  // Note [eviction score]. When holding one more value would take the held bytes past the budget,
  // the held value t with the lowest h(t) = cost(t) / (bytes(t) * staleness(t)) is evicted, until
  // the value fits. cost(t) is the estimated time (estimated_seconds) of the op that made t plus
  // that of every evicted value its recomputation would need first, found by a walk of at most 64
  // values: the paper's "evicted neighbourhood", computed directly instead of by its union-find
  // approximation, since the graphs of one step are small. staleness(t) counts the op calls and
  // saved-value reads since t was last used: a logical clock, so that decisions (and the peak) do
  // not depend on timing noise. Only storages the runtime alone holds are evictable (evicting one
  // the program still holds would free nothing), never one in use; the unit of eviction is the
  // storage, which views share. Regions compose: the inputs they keep are saved values too.
  //
  // The estimated time of recomputing c, including the evicted values its recomputation needs first.
  double cost_of(Cell& c) {
    const uint64_t stamp = ++visit_stamp_;
    double total = 0;
    std::vector<Cell*> stack{&c};
    c.visit = stamp;
    size_t walked = 0;
    while (!stack.empty() && walked < 64) {
      Cell* x = stack.back();
      stack.pop_back();
      ++walked;
      total += x->seconds;
      for (auto& in : x->inputs) {
        Cell* p = in.cell.get();
        if (p == nullptr || p->visit == stamp || p->held || !p->live.expired() || p->op == nullptr) continue;
        p->visit = stamp;
        stack.push_back(p);
      }
    }
    return total;
  }

  // Evicts until `need` more bytes fit in the budget. Also records the smallest feasible budget:
  // what could not be evicted at this moment, plus the need.
  void make_room(size_t need) {
    auto& counters = dynamic_counters();
    for (bool first = true;; first = false) {
      std::shared_ptr<Cell> victim;
      double best = 0;
      bool to_file = false;  // the victim's cheaper way back is the file (Note [evicting to a file])
      size_t unevictable = 0;
      const bool over = resident_ + need > budget_;
      if (!over && !first) return;
      for (auto& w : held_cells_) {
        std::shared_ptr<Cell> c = w.lock();
        if (!c || !c->counted) continue;
        if (!evictable(*c)) {
          unevictable += c->bytes;
          continue;
        }
        if (!over) continue;
        const double staleness = static_cast<double>(std::max<uint64_t>(1, clock_ - c->last_use));
        const double recompute = cost_of(*c);
        const bool file = writable(*c) && recompute > transfer_seconds(c->bytes);
        const double score = (file ? transfer_seconds(c->bytes) : recompute) / (static_cast<double>(c->bytes) * staleness);
        if (!victim || score < best) {
          victim = c;
          best = score;
          to_file = file;
        }
      }
      if (first) counters.smallest_feasible_bytes = std::max(counters.smallest_feasible_bytes, unevictable + need);
      if (!over) return;
      if (!victim) {
        const size_t smallest = unevictable + need;
        throw Error(detail::concat("policy dynamic:", budget_, " (", mib(budget_),
                                   "): ", memory::format_bytes(static_cast<double>(need)),
                                   " more must be held while ", memory::format_bytes(static_cast<double>(unevictable)),
                                   " cannot be evicted (in use, still held by the program, or not made by an op); "
                                   "the smallest feasible budget here is ",
                                   smallest, " bytes (", mib(smallest), ")",
                                   measured_smallest_budget() > 0
                                       ? concat("; the smallest feasible budget of the whole step, measured by "
                                                "dynamic_feasible_range, is ", measured_smallest_budget(), " bytes (",
                                                mib(measured_smallest_budget()), "; the step it last measured on this thread)")
                                       : std::string(", a lower bound from the part of the step run so far "
                                                     "(remat::dynamic_feasible_range measures the whole step's)")));
      }
      victim->digest = take_digest(whole(victim->held, victim->dtype));
      if (to_file && !victim->copy) write_out(*victim);
      release(*victim);
      ++counters.evictions;
      if (held_cells_.size() > 256) prune();
    }
  }

  // Every value a recomputation reads again, made by an op or not, must be the one the op read.
  static void check_version(const Storage& storage, const Cell::Input& input) {
    REMAT_CHECK(storage.version() == input.version, "policy dynamic: a tensor of shape ", shape_str(input.shape),
                " that an op read was modified in place after the forward pass; recomputing from the new values "
                "would give a wrong gradient");
  }

  // Gets the value of `input` (recomputing its cell if needed); locks the cell while it is used.
  Tensor materialize(Cell::Input& input, std::vector<std::shared_ptr<Cell>>& locked,
                     std::vector<std::shared_ptr<Storage>>& temporaries) {
    if (!input.cell) {
      if (!input.constant.defined()) return Tensor();
      check_version(*input.constant.storage(), input);
      return input.constant;
    }
    std::shared_ptr<Cell> c = input.cell;
    std::shared_ptr<Storage> storage = c->held ? c->held : c->live.lock();
    if (storage) {
      check_version(*storage, input);  // the value the op read, unless changed in place since
    } else {
      storage = rematerialize(c, /*keep=*/c->saved);
      if (!c->saved) temporaries.push_back(storage);
    }
    ++c->locks;
    locked.push_back(c);
    return detail::tensor_over(storage, input.offset, input.shape, input.strides, input.dtype);
  }

  // Note [evicting to a file]
  bool writable(const Cell& c) const {
    return file_ != nullptr && c.bytes >= file_threshold_ && c.held && c.held->device() == kCpu;
  }
  double transfer_seconds(size_t bytes) const { return static_cast<double>(bytes) * file_seconds_per_byte_; }

  void write_out(Cell& c) {
    auto range = std::make_shared<FileRange>(file_, c.bytes);
    std::string error;
    REMAT_CHECK(write_all(file_->fd(), static_cast<const char*>(c.held->data()), c.bytes, range->offset, error),
                "policy dynamic:+offload: writing an evicted value of ", memory::format_bytes(static_cast<double>(c.bytes)),
                " to a file in '", file_->directory(), "' failed: ", error, " (the value stays in memory)");
    c.copy = std::move(range);
    auto& counters = dynamic_counters();
    ++counters.offloaded;
    counters.bytes_offloaded += c.bytes;
  }

  std::shared_ptr<Storage> read_back(const std::shared_ptr<Cell>& c, bool keep) {
    const auto start = std::chrono::steady_clock::now();
    Tensor buffer = Tensor::empty({static_cast<int64_t>(c->bytes / dtype_size(c->dtype))}, c->dtype);
    std::string error;
    REMAT_CHECK(read_all(file_->fd(), static_cast<char*>(buffer.raw_data()), c->bytes, c->copy->offset, error),
                "policy dynamic:+offload: reading an evicted value of ", memory::format_bytes(static_cast<double>(c->bytes)),
                " back from a file in '", file_->directory(), "' failed: ", error);
    std::shared_ptr<Storage> storage = buffer.storage();
    check_digest(c->digest, whole(storage, c->dtype), [directory = file_->directory()] {
      return concat("policy dynamic:+offload: a value read back from '", directory,
                    "' differs from the one written (the file was changed or the disk failed)");
    });
    c->live = storage;
    if (keep) hold(*c, storage);
    auto& counters = dynamic_counters();
    counters.bytes_read_on_demand += c->bytes;
    counters.stall_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return storage;
  }

  // Recomputes c's storage from its op (or reads it back from the file); held (and counted) when `keep`.
  std::shared_ptr<Storage> rematerialize(const std::shared_ptr<Cell>& c, bool keep) {
    if (c->copy) return read_back(c, keep);
    REMAT_CHECK(c->op != nullptr, "policy dynamic: a value that no op made is gone and cannot be recomputed");
    const auto start = std::chrono::steady_clock::now();
    const bool outermost = remat_depth_ == 0;
    ++remat_depth_;
    struct Depth {
      int& d;
      ~Depth() { --d; }
    } depth{remat_depth_};
    ++c->locks;
    std::vector<std::shared_ptr<Cell>> locked;
    std::vector<std::shared_ptr<Storage>> temporaries;
    struct Unlock {
      std::shared_ptr<Cell> self;
      std::vector<std::shared_ptr<Cell>>& cells;
      ~Unlock() {
        --self->locks;
        for (auto& x : cells) --x->locks;
      }
    } unlock{c, locked};
    TensorList args;
    args.reserve(c->inputs.size());
    for (auto& in : c->inputs) args.push_back(materialize(in, locked, temporaries));
    TensorList outputs;
    {
      ++replaying_;
      struct Done {
        int& n;
        ~Done() { --n; }
      } done{replaying_};
      NoGradGuard no_grad;
      autodiff::ObserverScope no_observer(nullptr);
      ReplayScope replay;  // a recomputation: side effects are not repeated
      outputs = c->op->run_forward(args);
    }
    REMAT_CHECK(c->output < outputs.size() && outputs[c->output].defined(), "policy dynamic: recomputing ",
                c->op->op(), " gave ", outputs.size(), " outputs; its forward must be deterministic");
    std::shared_ptr<Storage> storage = outputs[c->output].storage();
    REMAT_CHECK(storage->bytes() == c->bytes, "policy dynamic: recomputing ", c->op->op(),
                " gave a storage of another size; its forward must be deterministic");
    check_digest(c->digest, whole(storage, c->dtype),
                 [op = c->op->op()] { return recompute_mismatch(concat("policy dynamic: op ", op)); });
    c->live = storage;
    if (keep) hold(*c, storage);
    auto& counters = dynamic_counters();
    ++counters.rematerializations;
    counters.remat_flops += c->cost;
    if (outermost)  // nested recomputations are inside this one's time
      counters.remat_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return storage;
  }

  size_t budget_;
  std::shared_ptr<SlotFile> file_;  // dynamic:+offload: (Note [evicting to a file])
  size_t file_threshold_ = 0;
  double file_seconds_per_byte_ = 0;  // a write and a read back, measured (remat::offload_bandwidth)
  size_t resident_ = 0;
  uint64_t clock_ = 0, visit_stamp_ = 0;
  int replaying_ = 0;
  int remat_depth_ = 0;
  std::unordered_map<const Storage*, std::weak_ptr<Cell>> by_storage_;
  std::vector<std::weak_ptr<Cell>> held_cells_;
};

Cell::~Cell() {
  if (counted && held) {
    held->remove_saved_reference();
    runtime->forget(bytes);
  }
}

SavedHandle::SavedHandle(std::shared_ptr<Cell> c) : cell(std::move(c)) { ++cell->handles; }
SavedHandle::~SavedHandle() {
  // no SavedTensor stands for the value any more: stop holding it (lineage stays while needed)
  if (--cell->handles == 0) {
    cell->saved = false;
    cell->runtime->release(*cell);
  }
}

std::shared_ptr<DynamicRuntime> make_dynamic_runtime(size_t budget, const std::optional<OffloadTarget>& target) {
  return std::make_shared<DynamicRuntime>(budget, target);
}

}  // namespace detail

struct DynamicScope::State {
  std::shared_ptr<detail::DynamicRuntime> runtime;
  std::unique_ptr<ScopedSavedTensorHooks> hooks;
  autodiff::OpListener* previous = nullptr;
};

DynamicScope::DynamicScope(size_t budget_bytes, std::optional<OffloadTarget> evict_to) : state_(std::make_unique<State>()) {
  REMAT_CHECK(budget_bytes > 0, "DynamicScope: the budget must be positive");
  state_->runtime = detail::make_dynamic_runtime(budget_bytes, evict_to);
  std::shared_ptr<detail::DynamicRuntime> rt = state_->runtime;
  SavedTensorHooks hooks;
  hooks.pack = [rt](const Tensor& storage) -> PackedValue { return rt->pack(storage); };
  hooks.unpack = [](const PackedValue& packed) {
    auto handle = std::static_pointer_cast<detail::SavedHandle>(packed);
    return handle->cell->runtime->unpack(handle->cell);
  };
  state_->hooks = std::make_unique<ScopedSavedTensorHooks>(std::move(hooks));
  state_->previous = autodiff::set_op_listener(rt.get());
  ++detail::dynamic_scopes;
}

DynamicScope::~DynamicScope() {
  --detail::dynamic_scopes;
  autodiff::set_op_listener(state_->previous);
  state_->hooks.reset();
}

}  // namespace remat
