// Candidate: the digest row (remat/backend.h) on the GPU, the formula of
// src/tensor/digest_formula.h, which the harness checks against the CPU's digest of the same bytes
// bit for bit. The library's CUDA backend has no digest kernel (it says so in supports()), so the
// recomputation check does not digest values on a GPU until this passes a device check
// (docs/checkpointing.md, what recomputation checks). One thread per (64 KiB block, lane) runs
// the lane over the block's words, one thread per block mixes its lanes and tail, and one thread
// chains the blocks in order; a strided tensor is made contiguous on the device first. Only the
// digest (8 bytes) leaves the device.
#include <algorithm>
#include <cstring>

#include "candidates/cuda/candidates.h"
#include "tensor/cuda/device_common.cuh"
#include "tensor/digest_formula.h"

namespace remat::candidates::cuda {

using namespace remat::cuda;  // the device helpers (device_common.cuh)

namespace {

namespace df = digest_formula;

// The little-endian 8-byte word at p (any alignment).
__device__ inline uint64_t load_word(const unsigned char* p, bool aligned) {
  if (aligned) return *reinterpret_cast<const uint64_t*>(p);
  uint64_t w = 0;
  for (int j = 7; j >= 0; --j) w = (w << 8) | p[j];
  return w;
}

// lanes[b * kLanes + k] = lane k of block b after the block's whole groups.
__global__ void digest_lanes(const unsigned char* bytes, int64_t n, int64_t blocks, bool aligned, uint64_t* lanes) {
  REMAT_GRID_LOOP(t, blocks * df::kLanes) {
    const int64_t b = t / df::kLanes;
    const int k = static_cast<int>(t % df::kLanes);
    const int64_t begin = b * df::kBlock;
    const int64_t size = n - begin < df::kBlock ? n - begin : df::kBlock;
    const unsigned char* p = bytes + begin + 8 * k;
    uint64_t lane = df::lane_start(static_cast<uint64_t>(b), k);
    for (int64_t i = 0; i + df::kGroup <= size; i += df::kGroup) lane = df::lane_step(lane, load_word(p + i, aligned));
    lanes[t] = lane;
  }
}

// digests[b] = block b's digest from its lanes, its tail and its size.
__global__ void digest_blocks(const unsigned char* bytes, int64_t n, int64_t blocks, const uint64_t* lanes,
                              uint64_t* digests) {
  REMAT_GRID_LOOP(b, blocks) {
    const int64_t begin = b * df::kBlock;
    const int64_t size = n - begin < df::kBlock ? n - begin : df::kBlock;
    const int64_t whole = size - size % df::kGroup;
    digests[b] = df::block_digest(lanes + b * df::kLanes, bytes + begin + whole, size - whole, size);
  }
}

// *out = the blocks' digests chained in order (one thread: a few thousand blocks at most per GiB).
__global__ void digest_chain(const uint64_t* digests, int64_t blocks, int64_t n, uint64_t* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  uint64_t h = df::chain_start(n);
  for (int64_t b = 0; b < blocks; ++b) h = df::chain(h, digests[b]);
  *out = h;
}

}  // namespace

void digest(CudaBackend& be, const Tensor& x_in, const Tensor& out) {
  REMAT_ASSERT(out.dtype() == DType::i64 && out.numel() == 1 && out.is_contiguous(), "digest: out must be one i64");
  DeviceGuard guard(be.device());
  Tensor x = be.contiguous(x_in);
  const cudaStream_t stream = be.stream();
  const int64_t n = x.numel() * static_cast<int64_t>(dtype_size(x.dtype()));
  const int64_t blocks = (n + df::kBlock - 1) / df::kBlock;
  const auto* bytes = static_cast<const unsigned char*>(x.storage()->data()) +
                      x.offset() * static_cast<int64_t>(dtype_size(x.dtype()));
  const bool aligned = reinterpret_cast<uintptr_t>(bytes) % 8 == 0;
  Tensor lanes = be.scratch({std::max<int64_t>(1, blocks * df::kLanes)}, DType::i64);
  Tensor digests = be.scratch({std::max<int64_t>(1, blocks)}, DType::i64);
  auto* lane_words = reinterpret_cast<uint64_t*>(ptr<int64_t>(lanes));
  auto* block_words = reinterpret_cast<uint64_t*>(ptr<int64_t>(digests));
  if (blocks > 0) {
    digest_lanes<<<grid_for(blocks * df::kLanes), kThreads, 0, stream>>>(bytes, n, blocks, aligned, lane_words);
    check_launch("digest");
    digest_blocks<<<grid_for(blocks), kThreads, 0, stream>>>(bytes, n, blocks, lane_words, block_words);
    check_launch("digest");
  }
  digest_chain<<<1, 1, 0, stream>>>(block_words, blocks, n, reinterpret_cast<uint64_t*>(ptr<int64_t>(out)));
  check_launch("digest");
}

}  // namespace remat::candidates::cuda
