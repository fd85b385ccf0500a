// Known-answer test of remat's Philox-4x32-10 against the vectors Random123 publishes
// (tests/kat_vectors of D. E. Shaw Research's Random123: counter words, key words, output words),
// and the mapping from a stream (seed, offset) to those blocks that rand, randn and dropout use.
#include <gtest/gtest.h>

#include <array>

#include "remat/random.h"

using namespace remat;

namespace {

struct Kat {
  std::array<uint32_t, 4> counter;
  std::array<uint32_t, 2> key;
  std::array<uint32_t, 4> expected;
};

// Random123 kat_vectors, "philox4x32 10" rows.
const Kat kVectors[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000}, {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

TEST(PhiloxKat, MatchesRandom123Vectors) {
  for (const Kat& k : kVectors) {
    Philox4 out = philox4x32(Philox4{{k.counter[0], k.counter[1], k.counter[2], k.counter[3]}}, k.key[0], k.key[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out.v[i], k.expected[i]) << "counter word 0 " << std::hex << k.counter[0] << ", output word " << i;
  }
}

TEST(PhiloxKat, SixtyFourBitCounterIsTheLowHalf) {
  // the zero vector through the 64-bit form
  Philox4 zero = philox4x32(uint64_t{0}, uint64_t{0});
  for (int i = 0; i < 4; ++i) EXPECT_EQ(zero.v[i], kVectors[0].expected[i]);
  // counter and key split low word first
  const uint64_t counter = 0x85a308d3243f6a88ull, key = 0x299f31d0a4093822ull;
  Philox4 a = philox4x32(counter, key);
  Philox4 b = philox4x32(Philox4{{0x243f6a88, 0x85a308d3, 0, 0}}, 0xa4093822, 0x299f31d0);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a.v[i], b.v[i]);
}

TEST(PhiloxKat, StreamWordsAreBlockWordsInOrder) {
  // word i of the stream (seed, offset) is lane (offset + i) % 4 of block (offset + i) / 4 keyed by the seed
  const RngState state{0x299f31d0a4093822ull, 6};
  for (uint64_t i = 0; i < 12; ++i) {
    uint64_t w = state.offset + i;
    EXPECT_EQ(philox_word(state, i), philox4x32(w / 4, state.seed).v[w % 4]) << i;
  }
  // rand() draws its f32 values from the stream's words
  Tensor u = rand({5}, DType::f32, state);
  for (int64_t i = 0; i < 5; ++i)
    EXPECT_EQ(static_cast<float>(u.at({i})), uniform_float(philox_word(state, static_cast<uint64_t>(i)))) << i;
}

}  // namespace
