// Internal: the instruction-set level of the CPU kernels (remat/cpu_features.h) and the macro that
// compiles a kernel once per level (Note [one level per process] in cpu_level.cpp).
//
//   REMAT_CPU_LEVELS(void, scale_f32, (float* x, int64_t n, float s), (x, n, s)) {
//     for (int64_t i = 0; i < n; ++i) x[i] *= s;   // compiled for x86-64-v2, -v3 and -v4
//   }
//   scale_f32(x, n, 2.0f);                          // runs the copy of the process's level
#pragma once

#include "remat/cpu_features.h"

namespace remat::cpu {

// The process's level (cpu_features().level), chosen on the first call; a remat::Error when
// REMAT_CPU_LEVEL names a level the CPU lacks. The CPU backend asks for it when it is made, so the
// kernels (which call it inside parallel regions) never see the error.
CpuLevel cpu_level();

}  // namespace remat::cpu

// Defines `ret name params` (and name_avx512, name_avx2, name_baseline) running the body that
// follows the macro, always inlined into one copy per level: x86-64-v4 (AVX-512), x86-64-v3
// (AVX2 + FMA) and the library's baseline, the copy run chosen by cpu_level(). The body's helpers
// must be always inlined too (REMAT_SIMD_INLINE) to be compiled for the copy's level.
#define REMAT_CPU_LEVELS(ret, name, params, args)                                        \
  __attribute__((always_inline)) inline ret name##_body params;                          \
  __attribute__((target("arch=x86-64-v4"))) ret name##_avx512 params {                   \
    return name##_body args;                                                             \
  }                                                                                      \
  __attribute__((target("arch=x86-64-v3"))) ret name##_avx2 params { return name##_body args; } \
  ret name##_baseline params { return name##_body args; }                                \
  ret name params {                                                                      \
    switch (::remat::cpu::cpu_level()) {                                                 \
      case ::remat::CpuLevel::avx512: return name##_avx512 args;                         \
      case ::remat::CpuLevel::avx2: return name##_avx2 args;                             \
      default: return name##_baseline args;                                              \
    }                                                                                    \
  }                                                                                      \
  __attribute__((always_inline)) inline ret name##_body params
