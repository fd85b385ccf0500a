// remat::distributed, the parts that are the same with and without MPI: checksums, the
// start-up model check, sharding, gradient reduction over the collectives of mpi.cpp or
// single_process.cpp.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "async_sum.h"
#include "remat/distributed.h"
#include "remat/error.h"

namespace remat::distributed {

namespace {

constexpr uint64_t kFnvBasis = 1469598103934665603ull;

uint64_t fnv(uint64_t h, const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t fnv(uint64_t h, const std::string& s) {
  uint64_t size = s.size();
  h = fnv(h, &size, sizeof size);
  return fnv(h, s.data(), s.size());
}

}  // namespace

Reduction parse_reduction(const std::string& text) {
  if (text == "ordered") return Reduction::ordered;
  if (text == "native") return Reduction::native;
  throw Error(detail::concat("distributed: unknown reduction \"", text, "\" (expected ordered or native)"));
}

const char* to_string(Reduction mode) { return mode == Reduction::ordered ? "ordered" : "native"; }

uint64_t layout_hash(const NamedTensors& tensors) {
  uint64_t h = kFnvBasis;
  uint64_t count = tensors.size();
  h = fnv(h, &count, sizeof count);
  for (const auto& [name, t] : tensors) {
    h = fnv(h, name);
    REMAT_CHECK(t.defined(), "distributed: tensor ", name, " is undefined");
    h = fnv(h, std::string(dtype_name(t.dtype())));
    uint64_t dims = t.shape().size();
    h = fnv(h, &dims, sizeof dims);
    for (int64_t d : t.shape()) h = fnv(h, &d, sizeof d);
  }
  return h;
}

uint64_t value_hash(const NamedTensors& tensors) {
  uint64_t h = kFnvBasis;
  for (const auto& [name, t] : tensors) {
    Tensor c = t.contiguous();
    h = fnv(h, c.raw_data(), c.nbytes());
  }
  return h;
}

void check_same(uint64_t value, const std::string& what) {
  if (world_size() == 1) return;
  std::vector<uint64_t> all = all_gather(value);
  for (size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0])
      throw Error(detail::concat("distributed: rank ", r, " of ", all.size(), " has a different ", what,
                                 " from rank 0 (checksum ", all[r], " against ", all[0], ")"));
}

void broadcast_parameters(const NamedTensors& params, bool require_equal_values) {
  if (world_size() == 1) return;
  // The layout first: a broadcast between different layouts would send the wrong sizes.
  check_same(layout_hash(params), "model (parameter names, shapes or dtypes)");
  if (require_equal_values) check_same(value_hash(params), "set of weights");
  std::vector<Tensor> tensors;
  for (const auto& [name, t] : params) {
    REMAT_CHECK(t.is_contiguous(), "distributed: parameter ", name, " is not contiguous");
    tensors.push_back(t);
  }
  broadcast(tensors, 0);
  check_same(value_hash(params), "set of weights after the broadcast");
}

double all_reduce_gradients(const std::vector<Tensor>& params, Reduction mode) {
  auto t0 = std::chrono::steady_clock::now();
  std::vector<Tensor> grads;
  grads.reserve(params.size());
  for (Tensor p : params) {
    Tensor g = p.grad();
    if (!g.defined() || !g.is_contiguous()) {
      // another rank may have a gradient for it: take part with zeros (or a contiguous copy)
      p.set_grad(g.defined() ? g.contiguous() : zeros(p.shape(), p.dtype()));
      g = p.grad();
    }
    grads.push_back(g);
  }
  if (world_size() > 1) all_reduce_sum(grads, mode);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t micro_batch_index(int64_t step, int64_t micro, int64_t per_rank, int rank, int world) {
  REMAT_CHECK(step >= 0 && micro >= 0 && micro < per_rank && rank >= 0 && rank < world,
              "distributed: micro_batch_index(step ", step, ", micro ", micro, ", per_rank ", per_rank, ", rank ",
              rank, ", world ", world, ") is out of range");
  return (step * world + rank) * per_rank + micro;
}

Range shard(int64_t count, int rank, int world) {
  REMAT_CHECK(count >= 0 && world >= 1 && rank >= 0 && rank < world, "distributed: shard(", count, ", rank ", rank,
              ", world ", world, ") is out of range");
  const int64_t base = count / world, extra = count % world;
  Range r;
  r.begin = rank * base + std::min<int64_t>(rank, extra);
  r.end = r.begin + base + (rank < extra ? 1 : 0);
  return r;
}

namespace internal {

SumLayout layout_of(int64_t accumulate, int world) {
  REMAT_CHECK(accumulate >= 1 && world >= 1, "distributed: a sum over ", world, " ranks x ", accumulate,
              " micro-batches");
  SumLayout layout;
  for (int r = 0; r < world; ++r) layout.blocks.push_back(blocks_of(r * accumulate, (r + 1) * accumulate));
  return layout;
}

int64_t scratch_elements(int64_t elements, const SumLayout& layout) {
  constexpr int64_t kChunk = int64_t{1} << 24;  // mpi.cpp's chunks
  const int64_t world = static_cast<int64_t>(layout.blocks.size());
  int64_t total = 0;
  for (int64_t begin = 0; begin < elements; begin += kChunk)
    total += layout.total_blocks() * ((std::min(kChunk, elements - begin) + world - 1) / world);
  return std::max<int64_t>(total, 1);
}

void add_into(const Tensor& left, const Tensor& right) {
  REMAT_CHECK(left.dtype() == right.dtype() && left.numel() == right.numel() && left.is_contiguous() &&
                  right.is_contiguous() && left.device().type == DeviceType::cpu && right.device().type == DeviceType::cpu,
              "distributed: partial sums of one gradient differ in dtype, size or layout");
  const int64_t n = left.numel();
  if (left.dtype() == DType::f32) {
    float* a = static_cast<float*>(left.raw_data());
    const float* b = static_cast<const float*>(right.raw_data());
    for (int64_t i = 0; i < n; ++i) a[i] = a[i] + b[i];
  } else {
    REMAT_CHECK(left.dtype() == DType::f64, "distributed: sums of f32 and f64 only, got ", dtype_name(left.dtype()));
    double* a = static_cast<double*>(left.raw_data());
    const double* b = static_cast<const double*>(right.raw_data());
    for (int64_t i = 0; i < n; ++i) a[i] = a[i] + b[i];
  }
}

}  // namespace internal

}  // namespace remat::distributed
