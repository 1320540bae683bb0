// Philox4x32-10 known answers and the contract's counter/key layout (philox.hpp).
#include <gtest/gtest.h>

#include <cstdint>

#include "fp4lab/philox.hpp"
#include "test_util.hpp"

namespace fp4lab::test {
namespace {

struct Kat {
  uint32_t ctr[4], key[2], out[4];
};

// Random123 tests/kat_vectors, the three "philox4x32 10" lines (columns: counter[4] key[2] -> out[4]).
// Cross-checked against several independent copies of that file (Python, Rust and Go ports that embed it).
const Kat kKat[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000}, {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

TEST(Philox4x32_10, Random123KnownAnswers) {
  int checked = 0;
  for (const Kat& k : kKat) {
    uint32_t out[4];
    Philox4x32::generate(k.ctr, k.key, out);
    for (int w = 0; w < 4; ++w) {
      EXPECT_EQ(out[w], k.out[w]) << "ctr " << hex32(k.ctr[0]) << " key " << hex32(k.key[0]) << " word " << w
                                  << ": got " << hex32(out[w]) << ", want " << hex32(k.out[w]);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 12);
}

// Contract: key = (seed low, seed high), counter = (index low, index high, stream, 0), first word.
TEST(Philox4x32_10, RandomBitsLayout) {
  EXPECT_EQ(random_bits(0, 0, 0), 0x6627e8d5u);  // the all-zero KAT's first word
  const uint64_t seeds[] = {0, 1, 0x299f31d0a4093822ull, ~0ull};
  const uint64_t indices[] = {0, 1, 12345, 0x85a308d3243f6a88ull, ~0ull};
  const uint32_t streams[] = {0, 7, 0x13198a2e};
  int checked = 0;
  for (uint64_t s : seeds)
    for (uint64_t i : indices)
      for (uint32_t st : streams) {
        const uint32_t key[2] = {uint32_t(s), uint32_t(s >> 32)};
        const uint32_t ctr[4] = {uint32_t(i), uint32_t(i >> 32), st, 0u};
        uint32_t out[4];
        Philox4x32::generate(ctr, key, out);
        EXPECT_EQ(random_bits(s, st, i), out[0]);
        ++checked;
      }
  EXPECT_EQ(checked, 60);
  // Each of seed, stream and index changes the word (no field is dropped).
  EXPECT_NE(random_bits(1, 0, 0), random_bits(0, 0, 0));
  EXPECT_NE(random_bits(1ull << 32, 0, 0), random_bits(0, 0, 0));
  EXPECT_NE(random_bits(0, 1, 0), random_bits(0, 0, 0));
  EXPECT_NE(random_bits(0, 0, 1), random_bits(0, 0, 0));
  EXPECT_NE(random_bits(0, 0, 1ull << 32), random_bits(0, 0, 0));
}

// The quantiser kernels draw a group's words with random_bits_in_group: the same words as random_bits, at groups
// of 16 and 32 next to the 2^32 boundaries of the index, where a carry into the high word would show.
TEST(Philox, GroupDrawsAreTheElementDraws) {
  for (uint64_t g : {uint64_t(16), uint64_t(32)}) {
    const uint64_t bases[] = {0, (uint64_t(1) << 32) - g, uint64_t(1) << 32, (uint64_t(3) << 32) - 2 * g,
                              (uint64_t(5) << 40) + 7 * g, ~uint64_t(0) - (g - 1)};
    for (uint64_t base : bases)
      for (uint32_t e = 0; e < g; ++e) {
        ASSERT_EQ(base % g, 0u);
        EXPECT_EQ(random_bits_in_group(0x0123456789ABCDEFull, 77u, base, e),
                  random_bits(0x0123456789ABCDEFull, 77u, base + e))
            << base << " + " << e;
      }
  }
}

}  // namespace
}  // namespace fp4lab::test
