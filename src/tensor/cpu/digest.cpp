// The digest kernel (remat/backend.h): the formula of tensor/digest_formula.h over a tensor's
// bytes in logical order, blocks in parallel (a strided tensor's block gathered into a scratch
// block first), so the digest is the same whatever the layout and the thread count.
#include <cstring>
#include <vector>

#include "cpu_backend.h"
#include "tensor/digest_formula.h"

namespace remat::cpu {

namespace {

namespace df = digest_formula;

uint64_t digest_block(const unsigned char* p, int64_t n, uint64_t block) {
  uint64_t lanes[df::kLanes];
  for (int k = 0; k < df::kLanes; ++k) lanes[k] = df::lane_start(block, k);
  int64_t i = 0;
  for (; i + df::kGroup <= n; i += df::kGroup)
    for (int k = 0; k < df::kLanes; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      lanes[k] = df::lane_step(lanes[k], w);
    }
  return df::block_digest(lanes, p + i, n - i, n);
}

// Copies the logical elements [first, first + count) of a strided tensor into out.
void gather(const Tensor& t, const unsigned char* base, int64_t first, int64_t count, unsigned char* out) {
  const int rank = static_cast<int>(t.dim());
  const int64_t item = static_cast<int64_t>(dtype_size(t.dtype()));
  std::vector<int64_t> index(static_cast<size_t>(rank), 0);
  for (int d = rank - 1; d >= 0; --d) {
    index[d] = first % t.shape()[d];
    first /= t.shape()[d];
  }
  const int64_t inner = rank == 0 ? 1 : t.shape()[rank - 1];
  const int64_t inner_stride = rank == 0 ? 0 : t.strides()[rank - 1] * item;
  int64_t done = 0;
  while (done < count) {
    int64_t at = 0;
    for (int d = 0; d < rank; ++d) at += index[d] * t.strides()[d];
    const unsigned char* src = base + at * item;
    const int64_t run = std::min(count - done, rank == 0 ? 1 : inner - index[rank - 1]);
    for (int64_t j = 0; j < run; ++j) std::memcpy(out + (done + j) * item, src + j * inner_stride, item);
    done += run;
    if (rank == 0) break;
    index[rank - 1] += run;
    for (int d = rank - 1; d > 0 && index[d] >= t.shape()[d]; --d) {
      index[d] = 0;
      ++index[d - 1];
    }
  }
}

}  // namespace

void CpuKernels::digest(const Tensor& x, const Tensor& out) {
  REMAT_ASSERT(out.dtype() == DType::i64 && out.numel() == 1, "digest: out must be one i64");
  const int64_t item = static_cast<int64_t>(dtype_size(x.dtype()));
  const int64_t bytes = x.numel() * item;
  const auto* base = static_cast<const unsigned char*>(x.raw_data());
  const bool contiguous = x.is_contiguous();
  const int64_t blocks = (bytes + df::kBlock - 1) / df::kBlock;
  std::vector<uint64_t> digests(static_cast<size_t>(blocks));
#pragma omp parallel if (blocks >= 4)
  {
    std::vector<unsigned char> scratch(contiguous ? 0 : static_cast<size_t>(df::kBlock));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t begin = b * df::kBlock, n = std::min(df::kBlock, bytes - begin);
      const unsigned char* p = base + begin;
      if (!contiguous) {
        gather(x, base, begin / item, n / item, scratch.data());
        p = scratch.data();
      }
      digests[static_cast<size_t>(b)] = digest_block(p, n, static_cast<uint64_t>(b));
    }
  }
  uint64_t h = df::chain_start(bytes);
  for (uint64_t d : digests) h = df::chain(h, d);
  std::memcpy(out.raw_data(), &h, sizeof h);
}

}  // namespace remat::cpu
