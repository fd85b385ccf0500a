// XXH64 (xxh64.h), from the specification: 32-byte stripes in four lanes, then the tail in 8-, 4-
// and 1-byte steps, then the avalanche.
#include "xxh64.h"

#include <cstdio>
#include <cstring>

namespace remat::io {

namespace {

constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kPrime3 = 0x165667B19E3779F9ull;
constexpr uint64_t kPrime4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t kPrime5 = 0x27D4EB2F165667C5ull;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Little-endian loads (the data of a safetensors file is little-endian; so is every host remat builds on).
inline uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline uint32_t load32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline uint64_t round(uint64_t acc, uint64_t lane) { return rotl(acc + lane * kPrime2, 31) * kPrime1; }
inline uint64_t merge(uint64_t acc, uint64_t lane) { return (acc ^ round(0, lane)) * kPrime1 + kPrime4; }

}  // namespace

uint64_t xxh64(const void* data, size_t bytes, uint64_t seed) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  const unsigned char* const end = p + bytes;
  uint64_t acc;
  if (bytes >= 32) {
    uint64_t v1 = seed + kPrime1 + kPrime2, v2 = seed + kPrime2, v3 = seed, v4 = seed - kPrime1;
    for (; end - p >= 32; p += 32) {
      v1 = round(v1, load64(p));
      v2 = round(v2, load64(p + 8));
      v3 = round(v3, load64(p + 16));
      v4 = round(v4, load64(p + 24));
    }
    acc = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
    acc = merge(merge(merge(merge(acc, v1), v2), v3), v4);
  } else {
    acc = seed + kPrime5;
  }
  acc += bytes;
  for (; end - p >= 8; p += 8) acc = rotl(acc ^ round(0, load64(p)), 27) * kPrime1 + kPrime4;
  if (end - p >= 4) {
    acc = rotl(acc ^ (static_cast<uint64_t>(load32(p)) * kPrime1), 23) * kPrime2 + kPrime3;
    p += 4;
  }
  for (; p < end; ++p) acc = rotl(acc ^ (*p * kPrime5), 11) * kPrime1;
  acc ^= acc >> 33;
  acc *= kPrime2;
  acc ^= acc >> 29;
  acc *= kPrime3;
  acc ^= acc >> 32;
  return acc;
}

std::string xxh64_hex(uint64_t hash) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

}  // namespace remat::io
