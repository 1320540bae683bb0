// Block scale arithmetic of every scale kind on hand-worked cases (quantize.hpp / quantize.cpp), 2-D
// tiles, all-zero blocks and bad input. Every expected number below is worked out in the comments.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4lab/recipe.hpp"
#include "fp4lab/quantize.hpp"
#include "fp4lab/rht.hpp"
#include "test_util.hpp"

namespace fp4lab::test {
namespace {

QuantConfig config(const ElemFormat& f, ScaleKind s, int block) {
  QuantConfig c;
  c.format = f;
  c.scale = s;
  c.block = block;
  return c;
}

// Puts `vals` at the start of block b of a one-row tensor with `cols` columns (rest +0).
void put(std::vector<float>& x, int block, int b, std::initializer_list<float> vals) {
  int j = 0;
  for (float v : vals) x[size_t(b * block + j++)] = v;
}

void expect_codes(const QTensor& q, int b, std::initializer_list<int> want) {
  int j = 0;
  for (int c : want) {
    EXPECT_EQ(int(q.codes[size_t(b * q.block + j)]), c) << "block " << b << " element " << j;
    ++j;
  }
}

// ---- NVFP4 (e2m1, ue4m3, FP32 global), Transformer Engine's order --------------------------------
// Tensor amax 12: S_enc = 448*6/12 = 2688/12 = 224 (exact), S_dec = FP32(1/224) = 0x3b924925.
// mult = 224 * FP32(1/6): FP32(1/6) = 11184811 * 2^-26; 7 * 11184811 = 78293677 needs 27 bits, rounds to
//   78293680, so mult = 78293680 * 2^-21 = 37.333336 (not 112/3).
// Block 0, amax 12: s = 12 * mult = 14680065 * 2^-15 = 448.00003 -> min(s, 448) = 448 -> E4M3 0x7E.
//   enc = 1 / (448 * S_dec); 448 * S_dec = 14 * FP32(1/7) = 2 * (67108867 * 2^-26 rounded to 24 bits = 1) = 2,
//   so enc = 0.5: 12 -> 6 (0b0'111), 5 -> 2.5 tie -> 2 (0b0'100), 1 -> 0.5 (0b0'001), 0.5 -> 0.25 tie -> 0,
//   -7 -> -3.5 tie -> -4 (0b1'110), 2.9 -> 1.45 -> 1.5 (0b0'011).
// Block 1, amax 3: s = 3 * mult = 234881040 * 2^-21 -> 14680065 * 2^-17 = 112.0000076 -> E4M3 112 (0x6E,
//   1.75 * 2^6) exactly. 112 * S_dec = 7 * FP32(1/7) / 2 = 0.5, enc = 2:
//   3 -> 6 (0b0'111), 2.5 -> 5 tie -> 4 (0b0'110), 2.125 -> 4.25 -> 4 (0b0'110), 1.25 -> 2.5 tie -> 2
//   (0b0'100), 0.875 -> 1.75 tie -> 2 (0b0'100), 0.125 -> 0.25 tie -> 0, -1.5 -> -3 (0b1'101),
//   0.7 -> 1.4 -> 1.5 (0b0'011), 0.2 -> 0.4 -> 0.5 (0b0'001), -0 -> -0 (0b1'000).
TEST(ScaleNvfp4, HandWorkedBlocks) {
  std::vector<float> x(32, 0.0f);
  put(x, 16, 0, {12, 5, 1, 0.5f, -7, 2.9f});
  put(x, 16, 1, {3, 2.5f, 2.125f, 1.25f, 0.875f, 0.125f, -1.5f, 0.7f, 0.2f, -0.0f});
  const QTensor q = quantize(x.data(), 1, 32, config(kE2M1, ScaleKind::ue4m3, 16));
  EXPECT_EQ(f32_bits(q.global_dec), 0x3b924925u);  // FP32(1/224)
  ASSERT_EQ(q.scale_codes.size(), 2u);
  EXPECT_EQ(q.scale_codes[0], 0x7E);
  EXPECT_EQ(q.scales[0], 448.0f);
  EXPECT_EQ(q.scale_codes[1], 0x6E);
  EXPECT_EQ(q.scales[1], 112.0f);
  expect_codes(q, 0, {0b0'111, 0b0'100, 0b0'001, 0b0'000, 0b1'110, 0b0'011, 0b0'000});
  expect_codes(q, 1, {0b0'111, 0b0'110, 0b0'110, 0b0'100, 0b0'100, 0b0'000, 0b1'101, 0b0'011, 0b0'001, 0b1'000,
                      0b0'000});
  // Dequantised: (6 * 448) * S_dec = 2688 * 9586981 * 2^-31 -> 12 + 2^-20 (S_dec's own rounding shows);
  // (6 * 112) * S_dec = 3 + 2^-22.
  EXPECT_EQ(f32_bits(q.dequant(0, 0)), 0x41400001u);
  EXPECT_EQ(f32_bits(q.dequant(0, 16)), 0x40400001u);
}

// Where the E4M3 rounding of the block scale matters. Tensor amax 12 (block 0), block 1 amax 2.5:
// s = 2.5 * mult = 93.33334, between E4M3 88 and 96 -> 96 (0x6C: E = 13, M = 4). 96 * S_dec = 3 * FP32(1/7)
// = 28760943 * 2^-26 -> 24 bits: 14380471.5 ties to 14380472 -> 0.42857146, enc = 2.3333333.
// So the block's amax maps to 5.83 (not 6): 2.5 -> 5.83 -> 6 (0b0'111); 2.125 -> 4.958 -> 4 (0b0'110),
// where an unrounded scale (6/2.5) would give 5.1 -> 6; 1.25 -> 2.92 -> 3 (0b0'101);
// -1.5 -> -3.5 tie -> -4 (0b1'110); 0.875 -> 2.04 -> 2 (0b0'100); 0.125 -> 0.29 -> 0.5 (0b0'001).
TEST(ScaleNvfp4, E4M3RoundingOfTheScaleChangesCodes) {
  std::vector<float> x(32, 0.0f);
  put(x, 16, 0, {12});
  put(x, 16, 1, {2.5f, 2.125f, 1.25f, -1.5f, 0.875f, 0.125f});
  const QTensor q = quantize(x.data(), 1, 32, config(kE2M1, ScaleKind::ue4m3, 16));
  EXPECT_EQ(q.scale_codes[1], 0x6C);
  EXPECT_EQ(q.scales[1], 96.0f);
  expect_codes(q, 1, {0b0'111, 0b0'110, 0b0'101, 0b1'110, 0b0'100, 0b0'001});
}

// Transformer Engine's operation order is observable; two cases where the "natural" order differs.
// (a) Tensor amax 12, block amax 1.125: exactly 1.125 * 224 / 6 = 42, a tie between E4M3 40 (M = 2, even)
//     and 44 (M = 3). TE's order gives s = 1.125 * mult = 9 * 78293680 * 2^-24 = 704643120 * 2^-24 ->
//     24 bits: 11010048.75 -> 11010049 * 2^-18 = 42.0000038 -> E4M3 44 (0x63: E = 12, M = 3), not 40
//     (which amax * (S_enc / 6) = 42.0 exactly would give).
// (b) Tensor amax 3: S_enc = 896, S_dec = FP32(1/896) = FP32(1/7) * 2^-7 with FP32(1/7) = (2^26 + 3) / 7 * 2^-26.
//     Block amax 0.875: s = 130.67 -> E4M3 128 (0x70). enc = 1 / (128 * S_dec) = 1 / FP32(1/7)
//     = 7 (1 - 3 * 2^-26) ~ 7 - 0.66 * 2^-21 -> FP32 7 - 2^-21 (not S_enc / 128 = 7).
//     So 0.5 -> 3.5 - 2^-22 -> 3 (0b0'101), where 7 * 0.5 = 3.5 would tie to 4; 0.25 -> 1.75 - 2^-23 -> 1.5
//     (0b0'011), not 2; 0.875 -> 6.12 -> 6 (0b0'111).
TEST(ScaleNvfp4, TransformerEngineOperationOrder) {
  std::vector<float> x(32, 0.0f);
  put(x, 16, 0, {12});
  put(x, 16, 1, {1.125f});
  QTensor q = quantize(x.data(), 1, 32, config(kE2M1, ScaleKind::ue4m3, 16));
  EXPECT_EQ(q.scale_codes[1], 0x63);
  EXPECT_EQ(q.scales[1], 44.0f);

  std::vector<float> y(32, 0.0f);
  put(y, 16, 0, {3});
  put(y, 16, 1, {0.875f, 0.5f, 0.25f});
  q = quantize(y.data(), 1, 32, config(kE2M1, ScaleKind::ue4m3, 16));
  EXPECT_EQ(q.scale_codes[0], 0x7E);
  EXPECT_EQ(q.scale_codes[1], 0x70);
  EXPECT_EQ(q.scales[1], 128.0f);
  expect_codes(q, 1, {0b0'111, 0b0'101, 0b0'011});
}

// All-zero tensor: S_enc = 2688 / 0 is not finite -> 1 (S_dec = 1); block scales E4M3 0, codes +-0.
TEST(ScaleNvfp4, AllZeroTensor) {
  std::vector<float> x(16, 0.0f);
  x[3] = -0.0f;
  const QTensor q = quantize(x.data(), 1, 16, config(kE2M1, ScaleKind::ue4m3, 16));
  EXPECT_EQ(q.global_dec, 1.0f);
  EXPECT_EQ(q.scale_codes[0], 0);
  EXPECT_EQ(q.scales[0], 0.0f);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(q.codes[j], j == 3 ? 0b1'000 : 0b0'000) << j;
  for (float v : q.dequantize()) EXPECT_EQ(v, 0.0f);
}

TEST(ScaleNvfp4, GlobalEncodeScale) {
  EXPECT_EQ(nvfp4_global_encode(kE2M1, 12.0f), 224.0f);
  EXPECT_EQ(nvfp4_global_encode(kE2M1, 2688.0f), 1.0f);
  EXPECT_EQ(nvfp4_global_encode(kE2M1, 0.0f), 1.0f);                                   // all-zero tensor
  // A quotient past FLT_MAX is clamped to it, as Transformer Engine does (not replaced by 1).
  EXPECT_EQ(nvfp4_global_encode(kE2M1, std::numeric_limits<float>::denorm_min()), std::numeric_limits<float>::max());
  EXPECT_EQ(nvfp4_global_encode(kE2M1, 1e-37f), std::numeric_limits<float>::max());
  EXPECT_EQ(nvfp4_global_encode(kE1M2, 1.75f), 448.0f);                                // 448 * gmax / amax
}

// A tensor whose amax is tiny but normal keeps its values under nvfp4: with S_enc = 1 every UE4M3 block scale
// would underflow to zero and the whole tensor dequantise to 0.
TEST(ScaleNvfp4, TinyAmaxIsNotFlushed) {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = float(j % 7 - 3) * 1e-37f;
  const QTensor q = quantize(x.data(), 1, 32, Recipe::preset("nvfp4").operand(Pass::fwd_y, Operand::a, 0));
  EXPECT_EQ(q.global_dec, 1.0f / std::numeric_limits<float>::max());
  const std::vector<float> d = q.dequantize();
  int nonzero = 0;
  for (int j = 0; j < 32; ++j) {
    nonzero += d[j] != 0.0f;
    EXPECT_LE(std::fabs(d[j] - x[j]), 0.26f * 3e-37f) << j;  // within half a grid step of the block's amax/6
  }
  EXPECT_GE(nonzero, 24) << "the values were flushed";
}

// ---- OCP MX (e2m1, ue8m0, block 32): X = floor(log2 amax) - 2, v = x * 2^-X, clamp to 6 ----------
// Block 0, amax 5: X = 2 - 2 = 0 (code 127): 5 -> tie 4/6 -> 4 (0b0'110); 3.5 -> tie 3/4 -> 4 (0b0'110);
//   -0.75 -> tie 0.5/1 -> -1 (0b1'010); 0.25 -> tie 0/0.5 -> 0.
// Block 1, amax 7: X = 0: 7 clips to 6 (0b0'111); 6.5 -> 6; 5 -> 4 (0b0'110).
// Block 2, amax 8: X = 3 - 2 = 1 (code 128), v = x/2: 8 -> 4 (0b0'110); 7 -> 3.5 tie -> 4; 3 -> 1.5 (0b0'011).
// Block 3, amax 0.75: X = -1 - 2 = -3 (code 124), v = 8x: 0.75 -> 6 (0b0'111); 0.1 -> 0.8 -> 1 (0b0'010).
TEST(ScaleMx, FloorExponentHandWorked) {
  std::vector<float> x(128, 0.0f);
  put(x, 32, 0, {5, 3.5f, -0.75f, 0.25f});
  put(x, 32, 1, {7, 6.5f, 5});
  put(x, 32, 2, {8, 7, 3});
  put(x, 32, 3, {0.75f, 0.1f});
  const QTensor q = quantize(x.data(), 1, 128, config(kE2M1, ScaleKind::ue8m0, 32));
  const uint8_t codes[] = {127, 127, 128, 124};
  const float decs[] = {1.0f, 1.0f, 2.0f, 0.125f};
  for (int b = 0; b < 4; ++b) {
    EXPECT_EQ(q.scale_codes[b], codes[b]) << b;
    EXPECT_EQ(q.scales[b], decs[b]) << b;
  }
  EXPECT_EQ(q.global_dec, 1.0f);
  expect_codes(q, 0, {0b0'110, 0b0'110, 0b1'010, 0b0'000});
  expect_codes(q, 1, {0b0'111, 0b0'111, 0b0'110});
  expect_codes(q, 2, {0b0'110, 0b0'110, 0b0'011});
  expect_codes(q, 3, {0b0'111, 0b0'010});
}

// ue8m0-ceil (Transformer Engine's MXFP4 reference): X = ceil(log2(amax / 6)), never clips.
// Block 0, amax 5: 5/6 -> X = 0 (code 127), as floor. Block 1, amax 7: 7/6 -> X = 1 (code 128), v = x/2:
//   7 -> 3.5 tie -> 4 (0b0'110); 6.5 -> 3.25 -> 3 (0b0'101); 5 -> 2.5 tie -> 2 (0b0'100).
// Block 2, amax 8: 8/6 -> X = 1 (code 128). Block 3, amax 0.75: 0.75/6 = 2^-3 exactly -> X = -3 (code 124).
TEST(ScaleMx, CeilExponentHandWorked) {
  std::vector<float> x(128, 0.0f);
  put(x, 32, 0, {5, 3.5f, -0.75f, 0.25f});
  put(x, 32, 1, {7, 6.5f, 5});
  put(x, 32, 2, {8, 7, 3});
  put(x, 32, 3, {0.75f, 0.1f});
  const QTensor q = quantize(x.data(), 1, 128, config(kE2M1, ScaleKind::ue8m0_ceil, 32));
  const uint8_t codes[] = {127, 128, 128, 124};
  for (int b = 0; b < 4; ++b) EXPECT_EQ(q.scale_codes[b], codes[b]) << b;
  expect_codes(q, 0, {0b0'110, 0b0'110, 0b1'010, 0b0'000});
  expect_codes(q, 1, {0b0'110, 0b0'101, 0b0'100});
  expect_codes(q, 2, {0b0'110, 0b0'110, 0b0'011});
  expect_codes(q, 3, {0b0'111, 0b0'010});
}

// A block whose amax / gmax underflows to 0 (E2M1: amax <= 3 * 2^-149) has an exact ceil(log2(amax / 6))
// below -127, so it takes the smallest scale, code 0, like an all-zero block; 4 * 2^-149 / 6 is 2^-149
// (RTNE), ceil(log2) = -149, which clamps to code 0 too. Under floor, amax 3 * 2^-149 gives X = -149 - 2.
TEST(ScaleMx, CeilExponentOfUnderflowingQuotient) {
  std::vector<float> x(96, 0.0f);
  put(x, 32, 0, {0x1p-149f, -0x1p-149f});
  put(x, 32, 1, {3 * 0x1p-149f});
  put(x, 32, 2, {4 * 0x1p-149f});
  for (ScaleKind s : {ScaleKind::ue8m0_ceil, ScaleKind::ue8m0}) {
    const QTensor q = quantize(x.data(), 1, 96, config(kE2M1, s, 32));
    for (int b = 0; b < 3; ++b) {
      EXPECT_EQ(q.scale_codes[b], 0) << scale_name(s) << " block " << b;
      EXPECT_EQ(std::bit_cast<uint32_t>(q.scales[b]), 0x00400000u) << scale_name(s) << " block " << b;  // 2^-127
    }
    expect_codes(q, 0, {0b0'000, 0b1'000});  // the sign survives rounding to zero
    expect_codes(q, 1, {0b0'000});
    expect_codes(q, 2, {0b0'000});
  }
}

// MX exponent of the other grids: emax(e1m2) = 0, emax(int4) = 2, emax(e2m1_max2) = 1.
// e1m2 amax 1.5 -> X = 0: 1.5 (0b0'110); amax 1.9 -> X = 0, 1.9 clips to 1.75 (0b0'111); amax 3 -> X = 1:
// 3 -> 1.5. int4 amax 7 -> X = 0: 7 (0b0'111), 2.5 tie -> 2 (0b0'010). e2m1_max2 amax 3 -> X = 0: clips to 2.
TEST(ScaleMx, OtherGridsUseTheirEmax) {
  std::vector<float> x(96, 0.0f);
  put(x, 32, 0, {1.5f});
  put(x, 32, 1, {1.9f});
  put(x, 32, 2, {3});
  QTensor q = quantize(x.data(), 1, 96, config(kE1M2, ScaleKind::ue8m0, 32));
  EXPECT_EQ(q.scale_codes[0], 127);
  EXPECT_EQ(q.scale_codes[1], 127);
  EXPECT_EQ(q.scale_codes[2], 128);
  expect_codes(q, 0, {0b0'110});
  expect_codes(q, 1, {0b0'111});
  expect_codes(q, 2, {0b0'110});
  std::vector<float> y(32, 0.0f);
  put(y, 32, 0, {7, 2.5f});
  q = quantize(y.data(), 1, 32, config(kInt4, ScaleKind::ue8m0, 32));
  EXPECT_EQ(q.scale_codes[0], 127);
  expect_codes(q, 0, {0b0'111, 0b0'010});
  std::vector<float> z(32, 0.0f);
  put(z, 32, 0, {3});
  q = quantize(z.data(), 1, 32, config(kE2M1Max2, ScaleKind::ue8m0, 32));
  EXPECT_EQ(q.scale_codes[0], 127);  // floor(log2 3) - 1 = 0
  expect_codes(q, 0, {0b0'100});
}

// ---- fp32 scale (UFP4): dec = amax / gmax, v = x / dec ---------------------------------------------
// e1m2, amax 3.5 -> dec 2: 3.5 -> 1.75 (0b0'111); -0.875 -> -0.4375 -> -0.5 (0b1'010);
//   0.25 -> 0.125 tie -> 0; 0.375 -> 0.1875 -> 0.25 (0b0'001); 0.75 -> 0.375 tie -> 0.5 (0b0'010).
// e2m1, amax 3 -> dec 0.5: 3 -> 6 (0b0'111); 1.25 -> 2.5 tie -> 2 (0b0'100).
// int4, amax 14 -> dec 2: 14 -> 7 (0b0'111); 5 -> 2.5 tie -> 2 (0b0'010); 3 -> 1.5 tie -> 2 (0b0'010).
// e2m1_max2, amax 1 -> dec 0.5: 1 -> 2 (0b0'100); 0.7 -> 1.4 -> 1.5 (0b0'011); 0.625 -> 1.25 tie -> 1 (0b0'010).
TEST(ScaleFp32, AmaxOverGmaxHandWorked) {
  struct Case {
    ElemFormat f;
    std::initializer_list<float> x;
    float dec;
    std::initializer_list<int> codes;
  };
  const Case cases[] = {
      {kE1M2, {3.5f, -0.875f, 0.25f, 0.375f, 0.75f}, 2.0f, {0b0'111, 0b1'010, 0b0'000, 0b0'001, 0b0'010}},
      {kE2M1, {3, 1.25f}, 0.5f, {0b0'111, 0b0'100}},
      {kInt4, {14, 5, 3}, 2.0f, {0b0'111, 0b0'010, 0b0'010}},
      {kE2M1Max2, {1, 0.7f, 0.625f}, 0.5f, {0b0'100, 0b0'011, 0b0'010}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.f.name);
    std::vector<float> x(16, 0.0f);
    put(x, 16, 0, c.x);
    const QTensor q = quantize(x.data(), 1, 16, config(c.f, ScaleKind::fp32, 16));
    EXPECT_EQ(q.scales[0], c.dec);
    EXPECT_TRUE(q.scale_codes.empty());
    EXPECT_EQ(q.global_dec, 1.0f);
    expect_codes(q, 0, c.codes);
  }
}

// An all-zero block under every scale kind: codes keep the sign of zero, dequantised values are zero;
// fp32 dec 0, ue4m3 code 0, ue8m0 X = -127 (code 0, dec 2^-127). The neighbouring block is unaffected.
TEST(ScaleAllKinds, AllZeroBlock) {
  for (ScaleKind s : {ScaleKind::fp32, ScaleKind::ue4m3, ScaleKind::ue8m0, ScaleKind::ue8m0_ceil}) {
    SCOPED_TRACE(scale_name(s));
    std::vector<float> x(32, 0.0f);
    x[1] = -0.0f;
    x[16] = 3.0f;
    const QTensor q = quantize(x.data(), 1, 32, config(kE2M1, s, 16));
    for (int j = 0; j < 16; ++j) EXPECT_EQ(q.codes[j], j == 1 ? 0b1'000 : 0b0'000) << j;
    EXPECT_EQ(q.codes[16], 0b0'111);
    if (s == ScaleKind::fp32) {
      EXPECT_EQ(q.scales[0], 0.0f);
    }
    if (s == ScaleKind::ue4m3) {
      EXPECT_EQ(q.scale_codes[0], 0);
    }
    if (s == ScaleKind::ue8m0 || s == ScaleKind::ue8m0_ceil) {
      EXPECT_EQ(q.scale_codes[0], 0);
      EXPECT_EQ(q.scales[0], 0x1p-127f);
    }
    for (int j = 0; j < 16; ++j) EXPECT_EQ(q.dequant(0, j), 0.0f) << j;
  }
}

// 16x16 tiles: every row of a tile carries the tile's amax (max over 16 rows x 16 columns), computed
// here by an independent loop; codes use it (a 1.0 in a tile whose amax is 96 goes to 0 in e2m1: 1/16).
TEST(ScaleTile2d, SixteenRowsShareOneScale) {
  Rng rng(31);
  const int64_t rows = 32, cols = 32;
  std::vector<float> x = rng.normals(size_t(rows * cols));
  x[5 * cols + 3] = 96.0f;     // tile (0, 0)
  x[7 * cols + 4] = 1.0f;      // same tile, another row
  x[20 * cols + 30] = -48.0f;  // tile (1, 1)
  for (ScaleKind s : {ScaleKind::fp32, ScaleKind::ue4m3}) {
    SCOPED_TRACE(scale_name(s));
    QuantConfig cfg = config(kE2M1, s, 16);
    cfg.tile2d = true;
    const QTensor q = quantize(x.data(), rows, cols, cfg);
    QuantConfig flat = cfg;
    flat.tile2d = false;
    const QTensor qf = quantize(x.data(), rows, cols, flat);
    for (int64_t t = 0; t < 2; ++t)
      for (int64_t b = 0; b < 2; ++b) {
        float amax = 0;
        for (int64_t r = 16 * t; r < 16 * t + 16; ++r)
          for (int64_t c = 16 * b; c < 16 * b + 16; ++c) amax = std::max(amax, std::fabs(x[r * cols + c]));
        for (int64_t r = 16 * t; r < 16 * t + 16; ++r) {
          if (s == ScaleKind::fp32) {
            EXPECT_EQ(q.scales[r * 2 + b], amax / 6.0f) << r << " " << b;
          }
          EXPECT_EQ(q.scales[r * 2 + b], q.scales[16 * t * 2 + b]);
          if (s == ScaleKind::ue4m3) {
            EXPECT_EQ(q.scale_codes[r * 2 + b], q.scale_codes[16 * t * 2 + b]);
          }
        }
      }
    EXPECT_EQ(q.scales[0 * 2 + 0], s == ScaleKind::fp32 ? 16.0f : 448.0f);  // 96/6; or 96 * 2688/96 / 6 = 448
    EXPECT_EQ(q.codes[7 * cols + 4], 0b0'000);                           // 1.0 / 16 -> 0
    EXPECT_NE(qf.codes[7 * cols + 4], 0b0'000);                          // but not with 1x16 blocks
  }
  // Tiles need block 16 and rows a multiple of 16.
  QuantConfig bad = config(kE2M1, ScaleKind::fp32, 16);
  bad.tile2d = true;
  EXPECT_THROW(quantize(x.data(), 8, 64, bad), std::invalid_argument);
  bad.block = 32;
  EXPECT_THROW(quantize(x.data(), 32, 32, bad), std::invalid_argument);
}

// dequantize() is (grid value * block scale) * global_dec, element by element.
TEST(Dequantize, GridTimesScaleTimesGlobal) {
  Rng rng(32);
  const auto x = rng.normals(64 * 32, 5.0f);
  const QTensor q = quantize(x.data(), 64, 32, config(kE2M1, ScaleKind::ue4m3, 16));
  const auto d = q.dequantize();
  for (int64_t r = 0; r < 64; ++r)
    for (int64_t c = 0; c < 32; ++c)
      ASSERT_EQ(f32_bits(d[r * 32 + c]),
                f32_bits((decode(kE2M1, q.codes[r * 32 + c]) * q.scales[r * 2 + c / 16]) * q.global_dec));
}

// ---- bad input: one-line std::invalid_argument naming the fault ----------------------------------
std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "<no exception>";
}

TEST(QuantizeBadInput, NonFiniteInputThrowsWithMessage) {
  const QuantConfig cfg = config(kE1M2, ScaleKind::fp32, 16);
  struct Case {
    float v;
    const char* word;
  };
  for (const Case& c : {Case{std::numeric_limits<float>::quiet_NaN(), "NaN"}, Case{INFINITY, "Inf"},
                        Case{-INFINITY, "Inf"}}) {
    std::vector<float> x(32, 1.0f);
    x[21] = c.v;
    const std::string msg = what_of([&] { quantize(x.data(), 2, 16, cfg); });
    EXPECT_NE(msg.find(c.word), std::string::npos) << msg;
    EXPECT_NE(msg.find("21"), std::string::npos) << msg;  // names the element
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

// Finite inputs near FLT_MAX rotate to Inf (or Inf - Inf = NaN): every path of quantize() and rotate()
// refuses them, naming the row and block, instead of producing Inf scales and NaN codes.
TEST(QuantizeBadInput, RhtOverflowThrowsNamingRowAndBlock) {
  std::vector<float> x(32 * 64, 1.0f);
  for (int j = 0; j < 16; ++j) x[size_t(17 * 64 + 32 + j)] = 3.0e38f;  // row 17, block 2
  for (ScaleKind k : {ScaleKind::fp32, ScaleKind::ue4m3, ScaleKind::ue8m0}) {
    QuantConfig cfg = config(kE2M1, k, 16);
    cfg.rht = 16;
    cfg.rht_signs.assign(16, 1.0f);
    const std::string msg = what_of([&] { quantize(x.data(), 32, 64, cfg); });
    EXPECT_NE(msg.find("RHT overflows FP32 at row 17, block 2"), std::string::npos) << msg;
    EXPECT_NE(what_of([&] { rotate(x.data(), 32, 64, cfg); }).find("row 17, block 2"), std::string::npos);
    cfg.tile2d = true;
    EXPECT_NE(what_of([&] { quantize(x.data(), 32, 64, cfg); }).find("row 17, block 2"), std::string::npos);
  }
  // rotate() checks the shape itself: a row the RHT size does not divide was rotated past its end.
  QuantConfig cfg = config(kE1M2, ScaleKind::fp32, 16);
  cfg.rht = 32;
  cfg.rht_signs.assign(32, 1.0f);
  EXPECT_THROW(rotate(x.data(), 4, 48, cfg), std::invalid_argument);
}

TEST(QuantizeBadInput, ShapeAndConfigurationErrors) {
  std::vector<float> x(64 * 64, 1.0f);
  std::string msg = what_of([&] { quantize(x.data(), 2, 24, config(kE1M2, ScaleKind::fp32, 16)); });
  EXPECT_NE(msg.find("24"), std::string::npos) << msg;
  EXPECT_NE(msg.find("16"), std::string::npos) << msg;
  msg = what_of([&] { quantize(x.data(), 2, 48, config(kE2M1, ScaleKind::ue8m0, 32)); });
  EXPECT_NE(msg.find("48"), std::string::npos) << msg;
  EXPECT_THROW(quantize(x.data(), 2, 64, config(kE1M2, ScaleKind::fp32, 8)), std::invalid_argument);
  EXPECT_THROW(quantize(x.data(), 2, 64, config(kE1M2, ScaleKind::fp32, 64)), std::invalid_argument);
  EXPECT_THROW(quantize(x.data(), 2, 64, config(kE2M1, ScaleKind::ue4m3, 32)), std::invalid_argument);
  EXPECT_THROW(quantize(x.data(), 0, 16, config(kE1M2, ScaleKind::fp32, 16)), std::invalid_argument);
  EXPECT_THROW(quantize(x.data(), 2, 0, config(kE1M2, ScaleKind::fp32, 16)), std::invalid_argument);
}

TEST(QuantConfigLabel, CarriesTheConfiguration) {
  QuantConfig c = config(kE1M2, ScaleKind::fp32, 16);
  c.rht = 16;
  EXPECT_EQ(c.label(), "e1m2_b16_fp32scale_rht16_rtne");
  c = config(kE2M1, ScaleKind::ue4m3, 16);
  c.tile2d = true;
  c.rounding = Rounding::sr;
  EXPECT_EQ(c.label(), "e2m1_b16x16_ue4m3scale_rht0_sr-philox4");
  c.sr_draw = SrDraw::philox1;
  EXPECT_EQ(c.label(), "e2m1_b16x16_ue4m3scale_rht0_sr-philox1");
  EXPECT_EQ(config(kE2M1, ScaleKind::ue8m0_ceil, 32).label(), "e2m1_b32_ue8m0-ceilscale_rht0_rtne");
}

// A tensor quantised a panel of rows at a time (quantize_rows, under the whole's amax from tensor_amax over the
// panels) gives the whole's codes, scales and global scale bit for bit: stochastic rounding keyed by element index
// in the whole, ue4m3's tensor scale, 16x16 tiles, RHT with BF16 rounding, block 32; panels that do not divide the
// rows. A rotation that overflows is named at its row of the whole.
TEST(QuantizeRows, PanelsGiveTheWholeTensorsBits) {
  const int64_t rows = 208, cols = 128;
  std::mt19937 rng(11);
  std::student_t_distribution<float> heavy(3.0f);
  std::vector<float> x(size_t(rows * cols));
  for (float& v : x) v = heavy(rng);
  std::vector<QuantConfig> cfgs(6);
  cfgs[0].format = kE2M1;
  cfgs[1].rounding = Rounding::sr;
  cfgs[1].seed = 9;
  cfgs[1].stream = 4;
  cfgs[2].scale = ScaleKind::ue4m3;
  cfgs[2].format = kE2M1;
  cfgs[3].scale = ScaleKind::ue4m3;
  cfgs[3].tile2d = true;
  cfgs[3].rounding = Rounding::sr;
  cfgs[4].rht = 16;
  cfgs[4].rht_signs = rht_signs_te(16);
  cfgs[4].rht_bf16 = true;
  cfgs[4].scale = ScaleKind::ue4m3;
  cfgs[5].block = 32;
  cfgs[5].scale = ScaleKind::ue8m0;
  cfgs[5].rht = 32;
  cfgs[5].rht_signs = rht_signs_from_seed(32, 2);
  cfgs[5].rounding = Rounding::sr;
  for (const QuantConfig& c : cfgs)
    for (int64_t panel : {16, 48, 80}) {  // 208 = 4 x 48 + 16 = 2 x 80 + 48
      const QTensor whole = quantize(x.data(), rows, cols, c);
      float amax = 0;
      for (int64_t r0 = 0; r0 < rows; r0 += panel)
        amax = std::max(amax, tensor_amax(x.data() + r0 * cols, std::min(panel, rows - r0), cols, c, r0));
      std::vector<uint8_t> codes, scale_codes;
      std::vector<uint32_t> scales;
      for (int64_t r0 = 0; r0 < rows; r0 += panel) {
        const QTensor p = quantize_rows(x.data() + r0 * cols, r0, std::min(panel, rows - r0), cols, c, amax);
        EXPECT_EQ(std::bit_cast<uint32_t>(p.global_dec), std::bit_cast<uint32_t>(whole.global_dec));
        codes.insert(codes.end(), p.codes.begin(), p.codes.end());
        scale_codes.insert(scale_codes.end(), p.scale_codes.begin(), p.scale_codes.end());
        for (float s : p.scales) scales.push_back(std::bit_cast<uint32_t>(s));
      }
      std::vector<uint32_t> want_scales;
      for (float s : whole.scales) want_scales.push_back(std::bit_cast<uint32_t>(s));
      EXPECT_EQ(codes, whole.codes) << c.label() << " panel " << panel;
      EXPECT_EQ(scales, want_scales) << c.label() << " panel " << panel;
      EXPECT_EQ(scale_codes, whole.scale_codes) << c.label() << " panel " << panel;
    }
  // Row 100's first RHT block overflows: named as row 100 of the whole, whichever panel holds it.
  x[size_t(100 * cols)] = x[size_t(100 * cols + 1)] = 3.0e38f;
  auto fault = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no fault");
  };
  const std::string want = fault([&] { quantize(x.data(), rows, cols, cfgs[4]); });
  EXPECT_NE(want.find("row 100,"), std::string::npos) << want;
  EXPECT_EQ(fault([&] { tensor_amax(x.data() + 96 * cols, 16, cols, cfgs[4], 96); }), want);
  F32Buffer rotated;
  EXPECT_EQ(fault([&] { rotate(x.data() + 96 * cols, 16, cols, cfgs[4], rotated, 96); }), want);
  QuantConfig sr = cfgs[4];
  sr.scale = ScaleKind::fp32;  // the row-by-row path
  EXPECT_EQ(fault([&] { quantize_rows(x.data() + 96 * cols, 96, 16, cols, sr, 0.0f); }),
            fault([&] { quantize(x.data(), rows, cols, sr); }));
}

}  // namespace
}  // namespace fp4lab::test
