// What the tensor-core attention candidate's kernels (attention_tc.cu) and its entry points
// (attention_tc_calls.cu) share: whether the kernels take a problem, and their launches.
#pragma once

#include "candidates/cuda/candidates.h"
#include "tensor/cuda/attention.cuh"

namespace remat::cuda::attention_detail {

// Whether the tiled kernels take a problem: equal head sizes 32 or 64, queries and keys, at most
// 65535 (batch x heads), a device of compute capability 8.0 or above.
bool takes_tc(int64_t d, int64_t dv, int64_t tq, int64_t tk, int64_t bh, int device);
// Run the problem on `stream` when the kernels take it (float, __nv_bfloat16 or __half operands),
// and say whether they did; the backward needs pb.delta computed.
template <class S>
bool forward_tc(const Problem<S>& pb, int64_t bh, cudaStream_t stream, int device);
template <class S>
bool backward_tc(const Problem<S>& pb, int64_t bh, cudaStream_t stream, int device);

}  // namespace remat::cuda::attention_detail
