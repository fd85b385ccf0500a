// remat/cpu_features.h - the instruction-set level of the CPU kernels, and the CPU features found.
//
// The CPU backend's vectorised kernels (row kernels, attention, elementwise loops, the optimizer)
// are compiled three times: for baseline x86-64 (x86-64-v2, what the library is built for), for
// AVX2 + FMA (x86-64-v3) and for AVX-512 (x86-64-v4: F, BW, CD, DQ, VL). One of the three is
// chosen ONCE per process, on the first use of a CPU kernel or of cpu_features(): the widest the
// CPU has, or the one the environment variable REMAT_CPU_LEVEL names (baseline, avx2, avx512;
// empty counts as unset), read at that moment. oneDNN (the float32 GEMM and convolutions, the bf16 products) is capped at
// the same level. Naming a level the CPU lacks, or another word, is a remat::Error from that first
// use and from every later one (no kernel runs at a level other than the one reported).
//
//   const remat::CpuFeatures& cpu = remat::cpu_features();
//   std::printf("kernels: %s, bf16 products: %s\n", remat::cpu_level_name(cpu.level),
//               cpu.bf16_products ? "bf16 (float32 accumulation)" : "float32");
//   for (const std::string& f : cpu.features) std::printf("%s ", f.c_str());  // "avx2 fma avx512f ..."
//
// Reproducibility: every kernel of one process runs at one level, so every run and every
// recomputation on one machine computes the same bits, and a checkpointing policy's gradients equal
// save-all's bit for bit there. Results are NOT promised equal across levels (or machines): the
// compilers contract multiplies and adds into FMAs at the AVX2 and AVX-512 levels only, and
// oneDNN's kernels differ per instruction set. A result is the same for every thread count where
// docs/precision.md says so, at each level.
#pragma once

#include <string>
#include <vector>

namespace remat {

enum class CpuLevel { baseline, avx2, avx512 };

// "baseline", "avx2", "avx512".
const char* cpu_level_name(CpuLevel level);

struct CpuFeatures {
  CpuLevel level = CpuLevel::baseline;   // the level the kernels run at in this process
  CpuLevel widest = CpuLevel::baseline;  // the widest level this CPU has
  bool forced = false;                   // level came from REMAT_CPU_LEVEL
  // bf16 matrix products (Backend::gemm, gemm_bias of bf16 operands) computed from the bf16
  // values with float32 accumulation by oneDNN's bf16 matmul: at level avx512 on a CPU with
  // AVX512_BF16 or AMX-BF16. Otherwise a bf16 product is the float32 product of the widened
  // values (docs/precision.md).
  bool bf16_products = false;
  // The features found, in this order where present: sse4.2 avx avx2 fma avx512f avx512bw avx512cd
  // avx512dq avx512vl avx512_vnni avx512_bf16 amx_tile amx_bf16 amx_int8.
  std::vector<std::string> features;
  // One line: "avx512 (widest avx512; bf16 products in bf16; avx2 fma avx512f ...)".
  std::string text() const;
};

// The level chosen for this process (see above) and what the CPU has. A remat::Error when
// REMAT_CPU_LEVEL names a level the CPU lacks or no level.
const CpuFeatures& cpu_features();

}  // namespace remat
