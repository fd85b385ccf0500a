// The CPU kernels' instruction-set level and the features found (remat/cpu_features.h).
//
// Note [one level per process]. The vectorised kernels are compiled once per level (cpu_level.h,
// REMAT_CPU_LEVELS): baseline (x86-64-v2, the library's own target), avx2 (x86-64-v3) and avx512
// (x86-64-v4). The level is chosen once, on the first call of cpu_level() or cpu_features() (the
// CPU backend's constructor makes that call): the widest level the CPU and its OS support
// (__builtin_cpu_supports checks both for AVX and AVX-512; a level is read off its features, as
// clang has no level names there), unless REMAT_CPU_LEVEL names another. Every later
// call returns the same level, so every kernel of a process, in a first run and in a
// recomputation alike, runs the same instructions and computes the same bits: the bitwise equality
// of checkpointing policies holds on each machine. Results differ between levels (FMA contraction
// at avx2 and avx512 only, oneDNN's per-ISA kernels), and are not promised equal across them.
// oneDNN (float32 GEMM, convolutions, bf16 products) is capped at the chosen level when it is below
// the widest (dnnl_set_max_cpu_isa, before oneDNN's first use), so a forced level computes as a CPU
// of that level would. bf16 products in bf16 (gemm_bf16.cpp) need level avx512 and a CPU with
// AVX512_BF16 or AMX-BF16. Why not GCC's target_clones: its resolver picks the widest clone with
// no way to force another, so the narrower paths could not be tested on a wide CPU.
#include "tensor/cpu/cpu_level.h"

#include <cpuid.h>
#include <oneapi/dnnl/dnnl.h>

#include <cstdlib>
#include <string>

#include "remat/error.h"

namespace remat {

const char* cpu_level_name(CpuLevel level) {
  switch (level) {
    case CpuLevel::avx512: return "avx512";
    case CpuLevel::avx2: return "avx2";
    default: return "baseline";
  }
}

std::string CpuFeatures::text() const {
  std::string s = std::string(cpu_level_name(level)) + " (" + (forced ? "forced by REMAT_CPU_LEVEL; " : "") +
                  "widest " + cpu_level_name(widest) + "; bf16 products in " + (bf16_products ? "bf16" : "float32") +
                  ";";
  for (const std::string& f : features) s += " " + f;
  return s + ")";
}

namespace {

// cpuid leaf 7: (subleaf 0) EDX bits 22, 24, 25 are AMX-BF16, AMX-TILE, AMX-INT8; (subleaf 1) EAX
// bit 5 is AVX512_BF16.
struct Leaf7 {
  unsigned edx0 = 0, eax1 = 0;
};
Leaf7 read_leaf7() {
  Leaf7 l;
  unsigned a, b, c, d;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) l.edx0 = d;
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) l.eax1 = a;
  return l;
}

std::vector<std::string> detect_features(bool avx512_usable) {
  __builtin_cpu_init();
  std::vector<std::string> f;
  auto add = [&](bool has, const char* name) {
    if (has) f.emplace_back(name);
  };
  add(__builtin_cpu_supports("sse4.2"), "sse4.2");
  add(__builtin_cpu_supports("avx"), "avx");
  add(__builtin_cpu_supports("avx2"), "avx2");
  add(__builtin_cpu_supports("fma"), "fma");
  add(__builtin_cpu_supports("avx512f"), "avx512f");
  add(__builtin_cpu_supports("avx512bw"), "avx512bw");
  add(__builtin_cpu_supports("avx512cd"), "avx512cd");
  add(__builtin_cpu_supports("avx512dq"), "avx512dq");
  add(__builtin_cpu_supports("avx512vl"), "avx512vl");
  add(__builtin_cpu_supports("avx512vnni"), "avx512_vnni");
  const Leaf7 l = read_leaf7();
  // the AVX-512 and AMX bits count only where the OS saves the registers (avx512_usable: libgcc's check)
  add(avx512_usable && (l.eax1 & (1u << 5)) != 0, "avx512_bf16");
  add(avx512_usable && (l.edx0 & (1u << 24)) != 0, "amx_tile");
  add(avx512_usable && (l.edx0 & (1u << 22)) != 0, "amx_bf16");
  add(avx512_usable && (l.edx0 & (1u << 25)) != 0, "amx_int8");
  return f;
}

bool has(const std::vector<std::string>& features, const char* name) {
  for (const std::string& f : features)
    if (f == name) return true;
  return false;
}

CpuLevel parse_level(const std::string& text, CpuLevel widest) {
  const bool known = text == "baseline" || text == "avx2" || text == "avx512";
  REMAT_CHECK(known, "REMAT_CPU_LEVEL=", text, " names no level: baseline, avx2 or avx512");
  const CpuLevel level = text == "avx512" ? CpuLevel::avx512 : text == "avx2" ? CpuLevel::avx2 : CpuLevel::baseline;
  REMAT_CHECK(level <= widest, "REMAT_CPU_LEVEL=", text, ": this CPU's widest level is ", cpu_level_name(widest));
  return level;
}

// Caps oneDNN at `level` (only called for a level below the widest).
void cap_onednn(CpuLevel level) {
  const dnnl_cpu_isa_t isa = level == CpuLevel::avx2 ? dnnl_cpu_isa_avx2 : dnnl_cpu_isa_sse41;
  const dnnl_status_t status = dnnl_set_max_cpu_isa(isa);
  REMAT_CHECK(status == dnnl_success, "REMAT_CPU_LEVEL=", cpu_level_name(level),
              ": oneDNN could not be capped at that level (status ", static_cast<int>(status),
              "; it was used before the level was chosen)");
}

// x86-64-v3: AVX2, FMA, BMI1, BMI2, F16C, MOVBE and LZCNT (the last three by cpuid: leaf 1 ECX bits 29
// and 22, leaf 0x80000001 ECX bit 5).
bool has_x86_64_v3() {
  unsigned a, b, c = 0, d;
  const bool leaf1 = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0 && (c & (1u << 22)) != 0;
  c = 0;
  const bool lzcnt = __get_cpuid(0x80000001, &a, &b, &c, &d) && (c & (1u << 5)) != 0;
  return leaf1 && lzcnt && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
}

// x86-64-v4: v3 and AVX-512 F, BW, CD, DQ and VL.
bool has_x86_64_v4(bool v3) {
  return v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl");
}

CpuFeatures choose() {
  __builtin_cpu_init();
  CpuFeatures f;
  const bool v3 = has_x86_64_v3(), v4 = has_x86_64_v4(v3);
  f.widest = v4 ? CpuLevel::avx512 : v3 ? CpuLevel::avx2 : CpuLevel::baseline;
  f.features = detect_features(v4);
  f.level = f.widest;
  if (const char* env = std::getenv("REMAT_CPU_LEVEL"); env != nullptr && *env != '\0') {
    f.level = parse_level(env, f.widest);
    f.forced = true;
  }
  if (f.level < f.widest) cap_onednn(f.level);
  f.bf16_products = f.level == CpuLevel::avx512 && (has(f.features, "avx512_bf16") || has(f.features, "amx_bf16"));
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = choose();  // a throw leaves it unmade: the next call throws again
  return features;
}

namespace cpu {
CpuLevel cpu_level() {
  static const CpuLevel level = cpu_features().level;
  return level;
}
}  // namespace cpu

}  // namespace remat
