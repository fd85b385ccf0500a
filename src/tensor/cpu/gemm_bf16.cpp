// bf16 matrix products in bf16 on CPUs with bf16 units: oneDNN's matmul primitive on the bf16
// operands, float32 accumulation and a float32 result (CpuKernels::gemm calls it for bf16 a and b).
//
// Note [bf16 products]. On a CPU whose kernels run at level avx512 and that has AVX512_BF16 or
// AMX-BF16 (cpu_features().bf16_products, Note [one level per process]), the CPU backend does not
// widen gemm's and gemm_bias's bf16 inputs (widen.cpp): the product c = alpha a b + beta c runs
// on the bf16 values with float32 accumulation (vdpbf16ps or AMX tiles: pairs of exact products
// added in float32, denormal inputs and results flushed to zero), into c's float32 stand-in, which
// is rounded to bf16 once, as before. Elsewhere a bf16 product is the float32 product of the
// widened values (the same exact products, added in sgemm's order). Either is deterministic on one
// machine: a primitive is made once per (shapes, strides, alpha, beta, thread count) and kept, and
// oneDNN's matmul splits the work by the thread count only, so equal calls compute equal bits.
// Primitives run with a user scratchpad (a remat tensor per call).
#include <omp.h>

#include <bit>
#include <unordered_map>

#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/signal_guard.h"

namespace remat::cpu {

namespace {

using dnnl::memory;
using dt = memory::data_type;

dnnl::engine& bf16_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// A [batch, rows, cols] operand as oneDNN sees it: batch 1 when broadcast over the batch.
memory::desc operand_desc(dt type, int64_t batch, int64_t rows, int64_t cols, const kernel::MatrixLayout& l) {
  const bool broadcast = l.batch_stride == 0;
  const int64_t extent = l.trans ? cols * l.ld : rows * l.ld;
  const memory::dims strides = l.trans ? memory::dims{broadcast ? extent : l.batch_stride, 1, l.ld}
                                       : memory::dims{broadcast ? extent : l.batch_stride, l.ld, 1};
  return memory::desc({broadcast ? 1 : batch, rows, cols}, type, strides);
}

struct Product {
  int64_t batch, m, n, k;
  kernel::MatrixLayout a, b;
  float alpha, beta;
  std::vector<int64_t> key() const {
    return {batch, m, n, k, a.batch_stride, a.ld, a.trans, b.batch_stride, b.ld, b.trans,
            static_cast<int64_t>(std::bit_cast<uint32_t>(alpha)), static_cast<int64_t>(std::bit_cast<uint32_t>(beta)),
            omp_get_max_threads()};
  }
};

struct Entry {
  dnnl::matmul primitive;
  memory::desc a, b, c, scratchpad;
};

Entry make_entry(const Product& p) {
  Entry e;
  e.a = operand_desc(dt::bf16, p.batch, p.m, p.k, p.a);
  e.b = operand_desc(dt::bf16, p.batch, p.k, p.n, p.b);
  e.c = memory::desc({p.batch, p.m, p.n}, dt::f32, memory::dims{p.m * p.n, p.n, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (p.alpha != 1.0f) attr.set_output_scales(0, {p.alpha});
  if (p.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(p.beta);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(e.a, e.b, e.c), attr, bf16_engine());
  e.primitive = dnnl::matmul(pd);
  e.scratchpad = pd.scratchpad_desc();
  return e;
}

// The primitive of a product, made on its first call (a primitive picks its kernel and its split
// of the work for the thread count it sees, part of the key).
const Entry& entry_for(const Product& p) {
  static std::mutex mutex;
  static std::map<std::vector<int64_t>, Entry> cache;
  const std::vector<int64_t> key = p.key();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make_entry(p)).first;
  return it->second;
}

}  // namespace

void gemm_bf16(const Tensor& a, const kernel::MatrixLayout& la, const Tensor& b, const kernel::MatrixLayout& lb,
               const Tensor& c, int64_t k, double alpha, double beta) {
  REMAT_ASSERT(a.dtype() == DType::bf16 && b.dtype() == DType::bf16 && c.dtype() == DType::f32,
               "gemm_bf16: bf16 operands into a float32 result");
  FullThreads full;  // the primitive is made for, and splits its work by, the full thread count
  const Product p{c.shape()[0], c.shape()[1], c.shape()[2], k, la, lb, static_cast<float>(alpha),
                  static_cast<float>(beta)};
  const Entry& e = entry_for(p);
  auto& engine = bf16_engine();
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(e.a, engine, const_cast<void*>(a.raw_data()))},
                                       {DNNL_ARG_WEIGHTS, memory(e.b, engine, const_cast<void*>(b.raw_data()))},
                                       {DNNL_ARG_DST, memory(e.c, engine, c.raw_data())}};
  Tensor scratch;
  if (e.scratchpad.get_size() > 0) {
    const size_t bytes = e.scratchpad.get_size();
    scratch = Tensor::empty({static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float))}, DType::f32);
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(e.scratchpad, engine, scratch.raw_data()));
  }
  SignalsHeldBack held;  // oneDNN's kernels may run with rsp in the heap (Note [signals and oneDNN's kernels])
  dnnl::stream stream(engine);
  e.primitive.execute(stream, args);
  stream.wait();
}

}  // namespace remat::cpu
