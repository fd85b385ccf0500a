// distributed::GradientBuckets: the gradient all-reduce overlapped with the backward pass (the
// rules are in remat/distributed.h). The collectives are async_sum.h's.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "async_sum.h"
#include "remat/distributed.h"
#include "remat/error.h"

namespace remat::distributed {

namespace {
using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace

struct GradientBuckets::State {
  struct Slot {
    Tensor param;
    size_t bucket = 0;
    int64_t offset = 0;  // elements into the bucket
    bool in = false;     // its gradient is in the bucket this step
  };
  struct Bucket {
    std::vector<Tensor> flats;  // one per block of this rank's micro-batches; the sum lands in the first
    Tensor scratch;             // the ordered sum's
    std::vector<size_t> slots;
    size_t missing = 0;  // slots whose gradient has not arrived this step
    std::unique_ptr<internal::AsyncSum> sum;
    bool complete = false;
  };
  Reduction mode;
  int world = 1;
  internal::SumLayout layout;
  size_t pieces = 1;  // this rank's blocks
  std::vector<Slot> slots;
  std::vector<Bucket> buckets;
  std::unordered_map<const TensorImpl*, size_t> index;
  size_t next_to_start = 0;
  Clock::time_point first_start;
  Clock::time_point last_completion;

  void start_ready_buckets(bool early) {
    while (next_to_start < buckets.size() && buckets[next_to_start].missing == 0) {
      Bucket& b = buckets[next_to_start++];
      if (!b.sum) {
        if (first_start == Clock::time_point{}) first_start = Clock::now();  // the step's first bucket
        b.sum = internal::start_sum(b.flats, b.scratch, layout, mode);
        if (early) ++started_early;
      }
    }
  }
  void drive() {
    for (size_t i = 0; i < next_to_start; ++i) {
      Bucket& b = buckets[i];
      if (!b.complete && b.sum->test()) {
        b.complete = true;
        last_completion = Clock::now();
      }
    }
  }
  size_t started_early = 0;
};

GradientBuckets::GradientBuckets(std::vector<Tensor> params, size_t bucket_bytes, Reduction mode, int64_t accumulate)
    : state_(std::make_unique<State>()) {
  REMAT_CHECK(bucket_bytes >= 1, "distributed: the bucket size must be at least 1 byte");
  State& s = *state_;
  s.mode = mode;
  s.world = world_size();
  s.layout = internal::layout_of(accumulate, s.world);
  s.pieces = s.layout.blocks[static_cast<size_t>(rank())].size();
  // reverse registration order: the backward reaches the last parameters first
  for (size_t i = params.size(); i-- > 0;) {
    const Tensor& p = params[i];
    REMAT_CHECK(p.defined() && (p.dtype() == DType::f32 || p.dtype() == DType::f64),
                "distributed: GradientBuckets takes defined f32 or f64 parameters; parameter ", i, " is ",
                p.defined() ? dtype_name(p.dtype()) : "undefined");
    REMAT_CHECK(s.index.emplace(p.impl_ptr().get(), s.slots.size()).second, "distributed: parameter ", i, " (\"",
                p.name(), "\") is listed twice");
    s.slots.push_back({p, 0, 0, false});
  }
  // fill buckets in that order; a new one when the dtype changes or the next gradient does not fit
  std::vector<int64_t> elements;
  std::vector<DType> dtypes;
  for (size_t k = 0; k < s.slots.size(); ++k) {
    const Tensor& p = s.slots[k].param;
    const size_t bytes = p.nbytes();
    const bool fits = !dtypes.empty() && dtypes.back() == p.dtype() &&
                      static_cast<size_t>(elements.back()) * dtype_size(p.dtype()) + bytes <= bucket_bytes;
    if (!fits) {
      s.buckets.emplace_back();
      elements.push_back(0);
      dtypes.push_back(p.dtype());
    }
    s.slots[k].bucket = s.buckets.size() - 1;
    s.slots[k].offset = elements.back();
    elements.back() += p.numel();
    s.buckets.back().slots.push_back(k);
  }
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    State::Bucket& bucket = s.buckets[b];
    for (size_t j = 0; j < s.pieces; ++j) bucket.flats.push_back(Tensor::empty({elements[b]}, dtypes[b], memory::Tag::other));
    if (mode == Reduction::ordered && s.world > 1)
      bucket.scratch =
          Tensor::empty({internal::scratch_elements(elements[b], s.layout)}, dtypes[b], memory::Tag::other);
    bucket.missing = bucket.slots.size();
  }
}

GradientBuckets::~GradientBuckets() = default;

size_t GradientBuckets::bucket_count() const { return state_->buckets.size(); }

size_t GradientBuckets::bucket_of(size_t param) const {
  const State& s = *state_;
  REMAT_CHECK(param < s.slots.size(), "distributed: parameter index ", param, " out of range (", s.slots.size(),
              " parameters)");
  return s.slots[s.slots.size() - 1 - param].bucket;
}

size_t GradientBuckets::buffer_bytes() const {
  size_t total = 0;
  for (const auto& b : state_->buckets) {
    for (const Tensor& f : b.flats) total += f.nbytes();
    if (b.scratch.defined()) total += b.scratch.nbytes();
  }
  return total;
}

void GradientBuckets::ready(const Tensor& p) {
  REMAT_CHECK(state_->pieces == 1, "distributed: GradientBuckets::ready(p): this rank holds ", state_->pieces,
              " blocks of micro-batches (--accumulate); pass their partial sums");
  ready(p, {p.grad()});
}

void GradientBuckets::ready(const Tensor& p, const std::vector<Tensor>& pieces) {
  State& s = *state_;
  auto it = p.defined() ? s.index.find(p.impl_ptr().get()) : s.index.end();
  REMAT_CHECK(it != s.index.end(), "distributed: GradientBuckets::ready: \"", p.defined() ? p.name() : "undefined",
              "\" is not one of the bucketed parameters");
  State::Slot& slot = s.slots[it->second];
  REMAT_CHECK(!slot.in, "distributed: the gradient of \"", p.name(), "\" was reported twice in one step");
  REMAT_CHECK(pieces.size() == s.pieces, "distributed: \"", p.name(), "\": ", pieces.size(), " partial sums, this rank "
              "holds ", s.pieces, " blocks of micro-batches");
  State::Bucket& bucket = s.buckets[slot.bucket];
  REMAT_ASSERT(!bucket.sum, "bucket started before all of its gradients arrived");
  for (size_t j = 0; j < pieces.size(); ++j) {
    const Tensor& g = pieces[j];
    REMAT_CHECK(g.defined() && g.shape() == p.shape() && g.dtype() == p.dtype(), "distributed: the gradient of \"",
                p.name(), "\" must be ", dtype_name(p.dtype()), " ", shape_str(p.shape()), ", got ",
                g.defined() ? dtype_name(g.dtype()) + std::string(" ") + shape_str(g.shape()) : "none");
    Tensor c = g.device().type == DeviceType::cpu ? g : g.to(kCpu);
    if (!c.is_contiguous()) c = c.contiguous();
    std::memcpy(static_cast<char*>(bucket.flats[j].raw_data()) + static_cast<size_t>(slot.offset) * dtype_size(p.dtype()),
                c.raw_data(), c.nbytes());
  }
  slot.in = true;
  --bucket.missing;
  s.start_ready_buckets(true);
  s.drive();
}

GradientBuckets::Timing GradientBuckets::finish() {
  State& s = *state_;
  const Clock::time_point finish_start = Clock::now();
  // what no ready() brought: zeros (another rank may have a gradient for it)
  for (auto& slot : s.slots) {
    if (slot.in) continue;
    State::Bucket& bucket = s.buckets[slot.bucket];
    const size_t element = dtype_size(slot.param.dtype());
    for (const Tensor& flat : bucket.flats)
      std::memset(static_cast<char*>(flat.raw_data()) + static_cast<size_t>(slot.offset) * element, 0,
                  slot.param.nbytes());
    slot.in = true;
    --bucket.missing;
  }
  s.drive();
  const bool all_done_before = std::all_of(s.buckets.begin(), s.buckets.begin() + static_cast<std::ptrdiff_t>(s.next_to_start),
                                           [](const State::Bucket& b) { return b.complete; });
  const Clock::time_point backward_end = all_done_before && s.next_to_start > 0 ? s.last_completion : finish_start;
  Timing t;
  t.buckets_started_early = s.started_early;
  if (s.next_to_start > 0) t.hidden_seconds = std::max(0.0, seconds(s.first_start, backward_end));
  s.start_ready_buckets(false);
  for (auto& b : s.buckets) {
    b.sum->wait();
    b.complete = true;
  }
  // the sums into the gradients
  for (auto& slot : s.slots) {
    Tensor p = slot.param;
    const State::Bucket& bucket = s.buckets[slot.bucket];
    Tensor g = p.grad();
    if (!g.defined() || !g.is_contiguous()) {
      p.set_grad(zeros(p.shape(), p.dtype()));
      g = p.grad();
    }
    std::memcpy(g.raw_data(),
                static_cast<const char*>(bucket.flats[0].raw_data()) + static_cast<size_t>(slot.offset) * dtype_size(p.dtype()),
                g.nbytes());
    g.storage()->bump_version();
    slot.in = false;
  }
  for (auto& b : s.buckets) {
    b.sum.reset();
    b.complete = false;
    b.missing = b.slots.size();
  }
  t.exposed_seconds = seconds(finish_start, Clock::now());
  s.next_to_start = 0;
  s.started_early = 0;
  s.first_start = {};
  return t;
}

}  // namespace remat::distributed
