// Philox4x32-10 (Salmon et al., SC'11), the counter-based generator behind stochastic rounding and
// seeded RHT signs. Stateless: the bits for an element depend only on (seed, stream, index), so every
// layer and every thread count draws the same bits.
#pragma once

#include <array>
#include <cstdint>

#include "fp4lab/format.hpp"

namespace fp4lab {

struct Philox4x32 {
  static constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  static constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

  // kWide: on the device, the product as one widening multiply (IMAD.WIDE.U32). Spelled as a 64-bit product, the
  // device code also adds the operands' zero high halves to `hi`: one integer add per product, 20 per random word.
  // The bits are the same either way; a kernel may keep the 64-bit spelling for its register allocation.
  template <bool kWide = true>
  FP4LAB_HD static inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
#ifdef __CUDA_ARCH__
    if constexpr (kWide) {
      uint64_t w;
      asm("mul.wide.u32 %0, %1, %2;" : "=l"(w) : "r"(a), "r"(b));
      hi = uint32_t(w >> 32);
      lo = uint32_t(w);
      return;
    }
#endif
    const uint64_t p = uint64_t(a) * uint64_t(b);
    hi = uint32_t(p >> 32);
    lo = uint32_t(p);
  }

  // Ten rounds on counter c with key k; returns the four output words.
  template <bool kWide = true>
  FP4LAB_HD static inline void generate(const uint32_t c_in[4], const uint32_t k_in[2], uint32_t out[4]) {
    uint32_t c0 = c_in[0], c1 = c_in[1], c2 = c_in[2], c3 = c_in[3];
    uint32_t k0 = k_in[0], k1 = k_in[1];
    for (int round = 0; round < 10; ++round) {
      uint32_t hi0, lo0, hi1, lo1;
      mulhilo<kWide>(kM0, c0, hi0, lo0);
      mulhilo<kWide>(kM1, c2, hi1, lo1);
      const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
      c0 = n0; c1 = n1; c2 = n2; c3 = n3;
      k0 += kW0;
      k1 += kW1;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
  }
};

// The contract's random word for element `index` of tensor `stream` under `seed`:
// key = (seed low, seed high), counter = (index low, index high, stream, 0), first output word.
FP4LAB_HD inline uint32_t random_bits(uint64_t seed, uint32_t stream, uint64_t index) {
  const uint32_t k[2] = {uint32_t(seed), uint32_t(seed >> 32)};
  const uint32_t c[4] = {uint32_t(index), uint32_t(index >> 32), stream, 0u};
  uint32_t o[4];
  Philox4x32::generate(c, k, o);
  return o[0];
}

// random_bits(seed, stream, base + e) for element e of a group of G = 2^n elements that starts at `base`, a multiple
// of G, with e < G: base + e then only fills base's zero low bits. The counter words other than the first, (base
// high, stream, 0), are the same for the whole group, so where a group's elements are unrolled the compiler computes
// the first round's product of them, and the second round's product of its result, once for the group.
template <bool kWide = true>
FP4LAB_HD inline uint32_t random_bits_in_group(uint64_t seed, uint32_t stream, uint64_t base, uint32_t e) {
  const uint32_t k[2] = {uint32_t(seed), uint32_t(seed >> 32)};
  const uint32_t c[4] = {uint32_t(base) | e, uint32_t(base >> 32), stream, 0u};
  uint32_t o[4];
  Philox4x32::generate<kWide>(c, k, o);
  return o[0];
}

// How stochastic rounding draws its random words (docs/spec.md §4). Each is part of the contract, by name, so
// that every result made under any of them reproduces bit for bit:
//  - philox1: one Philox4x32-10 block per element, its first word: counter (index low, index high, stream, 0).
//    The original definition; 3 of every 4 words a block computes go unused.
//  - philox4: one block per four consecutive elements, word j for element 4g + j: counter (g low, g high,
//    stream, 0) with g = index / 4 (index = row * K + column; K is a multiple of 16, so a group never spans
//    two rows). Each word is uniform, as before, so P(up) is unchanged; a quarter of the Philox work.
//  - philox16: one block per sixteen consecutive elements, 8 random bits each, as a hardware SR unit dithers:
//    element 16g + e takes byte e % 4 (from the least significant) of word e / 4 of the block at counter (g low,
//    g high, stream, 0), as the word (byte << 24) | 2^23, so that the rounding (format.hpp: up iff (r >> 8) <
//    frac * 2^24) is the same comparison as the other draws'. P(up) = ceil(256 frac - 1/2) / 256: within 2^-9 of
//    frac, the midpoint term centring the error. A sixteenth of philox1's Philox work.
enum class SrDraw : uint8_t { philox1, philox4, philox16 };
inline constexpr SrDraw kSrDraws[] = {SrDraw::philox1, SrDraw::philox4, SrDraw::philox16};
// The draw every setting takes where none is given: QuantConfig, Recipe (so every preset) and the analyses.
inline constexpr SrDraw kDefaultSrDraw = SrDraw::philox4;
FP4LAB_HD constexpr const char* sr_draw_name(SrDraw d) {
  return d == SrDraw::philox1 ? "philox1" : d == SrDraw::philox4 ? "philox4" : "philox16";
}
// Consecutive elements that share one Philox block under draw d.
FP4LAB_HD constexpr int sr_draw_group(SrDraw d) { return d == SrDraw::philox1 ? 1 : d == SrDraw::philox4 ? 4 : 16; }

// The four words of the block at counter (g low, g high, stream, 0): under philox4 the words of elements
// 4g .. 4g + 3, under philox16 the bytes of elements 16g .. 16g + 15 (sr_byte_word), for code that rounds a
// group at once.
template <bool kWide = true>
FP4LAB_HD inline void sr_words4(uint64_t seed, uint32_t stream, uint64_t g, uint32_t out[4]) {
  const uint32_t k[2] = {uint32_t(seed), uint32_t(seed >> 32)};
  const uint32_t c[4] = {uint32_t(g), uint32_t(g >> 32), stream, 0u};
  Philox4x32::generate<kWide>(c, k, out);
}

// philox16: the rounding word of the element that takes byte j (0..3, from the least significant) of word w.
FP4LAB_HD constexpr uint32_t sr_byte_word(uint32_t w, int j) { return ((w >> (8 * j)) << 24) | 0x00800000u; }

// The contract's random word for element `index` of tensor `stream` under `seed` and draw `d`.
FP4LAB_HD inline uint32_t sr_word(SrDraw d, uint64_t seed, uint32_t stream, uint64_t index) {
  if (d == SrDraw::philox1) return random_bits(seed, stream, index);
  uint32_t w[4];
  if (d == SrDraw::philox4) {
    sr_words4(seed, stream, index >> 2, w);
    return w[index & 3];
  }
  sr_words4(seed, stream, index >> 4, w);
  return sr_byte_word(w[(index >> 2) & 3], int(index & 3));
}

}  // namespace fp4lab
